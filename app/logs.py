"""Logging for Ray Serve replicas: every Switchyard logger (``app.*`` and
``switchyard.*``) writes one JSON object per line to stderr, where ``serve run`` and
``kubectl logs`` show it, whatever Ray did to the root logger.

The process's real stderr, also when Ray Serve replaced ``sys.stderr``: with
``RAY_SERVE_LOG_TO_STDERR=0`` (which ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` implies, and
``switchyard serve``, the images and the manifests set it) a replica's ``sys.stderr``
is Ray's ``StreamToLogger``, which turns each line into an INFO record of Serve's own
file logger, buffered up to 1,000 records — an ERROR line then reached neither the
console of ``serve run`` nor, for a while, the file. The handler writes past that
wrapper (``real_stderr``) to the stream it wraps, which Ray streams to the driver.

Fields: ``ts`` (epoch seconds), ``level``, ``logger``, ``msg``, and those the call
passed in ``extra`` of ``FIELDS``: ``request_id``, ``error`` (an exception's class) and
``where`` (``module:function:line`` where it was raised); an exception adds ``exc`` (its
type and message, then the traceback). Never log prompts, completions or secrets.
"""

from __future__ import annotations

import json
import logging
import sys

ROOTS = ("app", "switchyard")
FIELDS = ("request_id", "error", "where")  # from ``extra``, when given
_MARK = "_switchyard_handler"
_WRAPPED = "_original_object"  # Ray Serve's StreamToLogger keeps the stream it replaced


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"), default=str)


def real_stderr() -> object:
    """``sys.stderr`` at the time of the call (a test's capture included), past any
    stream-to-logger wrappers Ray Serve put in its place (module docstring)."""
    stream: object = sys.stderr
    for _ in range(8):  # Ray wraps again on each reconfiguration of the replica
        inner = getattr(stream, "__dict__", {}).get(_WRAPPED)
        if inner is None:
            break
        stream = inner
    return stream


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Writes to ``real_stderr()`` at the time of the call."""

    @property
    def stream(self) -> object:
        return real_stderr()

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
