"""Logging for Ray Serve replicas: every Switchyard logger (``app.*`` and
``switchyard.*``) writes one JSON object per line to stderr, where ``serve run`` and
``kubectl logs`` show it, whatever Ray did to the root logger.

Fields: ``ts`` (epoch seconds), ``level``, ``logger``, ``msg``, and ``request_id``
when the call passed ``extra={"request_id": ...}``; an exception adds ``exc`` (its
type and message, then the traceback). Never log prompts, completions or secrets.
"""

from __future__ import annotations

import json
import logging
import sys

ROOTS = ("app", "switchyard")
_MARK = "_switchyard_handler"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid is not None:
            line["request_id"] = rid
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"), default=str)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the call."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def configure(level: str = "INFO") -> None:
    """Idempotent: attach the JSON stderr handler to the Switchyard loggers once."""
    for name in ROOTS:
        logger = logging.getLogger(name)
        logger.setLevel(level.upper())
        if not any(getattr(h, _MARK, False) for h in logger.handlers):
            handler = _Stderr()
            handler.setFormatter(JsonFormatter())
            setattr(handler, _MARK, True)
            logger.addHandler(handler)
        logger.propagate = False
