"""Reading a request body: size limit (413), JSON (400 ``invalid_json``), schema (400
naming the ``param``)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.api.errors import ApiError, body_too_large, from_validation_error, invalid_json
from app.api.middleware import BodyTooLarge, read_body


async def parse_body(request: Request, schema: type[BaseModel], max_bytes: int) -> Any:
    try:
        raw = await read_body(request, max_bytes)
    except BodyTooLarge as exc:
        raise body_too_large(exc.limit) from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid_json(str(exc)) from None
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None
