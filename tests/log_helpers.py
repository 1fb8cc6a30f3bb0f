"""Test helper: the JSON lines Switchyard's loggers write (``app.logs``), captured
from the ``app`` and ``switchyard`` loggers whatever else configured them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app import logs


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logs.JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@contextmanager
def json_lines() -> Iterator[list[dict[str, Any]]]:
    """Every line logged inside the block, parsed (at every level)."""
    handler = _Lines()
    loggers = [logging.getLogger(name) for name in logs.ROOTS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def errors(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["level"] == "ERROR"]
