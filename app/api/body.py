"""Reading a request body: size limit (413), JSON (400 ``invalid_json``), schema (400
naming the ``param``).

JSON that Python's parser takes but nothing downstream can use is refused here too,
with a 400 instead of a failure deep in a tokenizer or engine: nesting deeper than
``MAX_DEPTH`` (or too deep for the parser), integers longer than the parser's digit
limit, and strings holding a lone UTF-16 surrogate (``"\\ud800"``), which no UTF-8
encoder accepts.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.api.errors import ApiError, body_too_large, from_validation_error, invalid_json

MAX_DEPTH = 64
OFF_LOOP_BYTES = 64 * 1024  # bodies above this are parsed off the event loop
# A \\uD800-\\uDFFF escape: only then can the parsed body hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"body exceeds {limit} bytes")
        self.limit = limit


async def read_body(request: Request, limit: int) -> bytes:
    """Read the whole body, refusing early when it is (or grows) over ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _depth_ok(value: Any, limit: int) -> bool:
    """True when ``value`` nests at most ``limit`` containers deep (iterative)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return True


def _lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid_json(str(exc)) from None
    except RecursionError:
        raise invalid_json(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer beyond the parser's digit limit
        raise invalid_json(str(exc).split(";")[0]) from None
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    if not _depth_ok(data, MAX_DEPTH):
        raise invalid_json(f"nested deeper than {MAX_DEPTH} levels")
    if _SURROGATE_ESCAPE.search(raw) and _lone_surrogate(data):
        raise invalid_json("a string holds a lone UTF-16 surrogate, which is not valid Unicode")
    return data


def _validate(raw: bytes, schema: type[BaseModel]) -> Any:
    data = parse_json(raw)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


async def parse_body(request: Request, schema: type[BaseModel], max_bytes: int) -> Any:
    """Read, parse and validate; a large body is parsed on a worker thread so one
    tenant's megabytes of JSON do not stall the event loop for everyone else."""
    try:
        raw = await read_body(request, max_bytes)
    except BodyTooLarge as exc:
        raise body_too_large(exc.limit) from None
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(_validate, raw, schema)
    return _validate(raw, schema)
