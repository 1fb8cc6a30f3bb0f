"""Switchyard's log lines: JSON on stderr with the request id, for every 500."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from app import logs
from app.api.errors import map_exception


@pytest.fixture
def configured() -> Iterator[None]:
    logs.configure("INFO")
    yield
    for name in logs.ROOTS:  # leave the loggers as pytest found them
        logger = logging.getLogger(name)
        logger.handlers = [h for h in logger.handlers if not getattr(h, logs._MARK, False)]
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def lines(err: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def test_an_internal_error_logs_one_error_line_with_the_request_id(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    error = map_exception(KeyError("secret-internal-detail"), "rid-42")
    assert error.status == 500 and "secret-internal-detail" not in error.message
    (line,) = [x for x in lines(capsys.readouterr().err) if x["level"] == "ERROR"]
    assert line["request_id"] == "rid-42" and line["logger"] == "app.api.errors"
    assert "KeyError" in str(line["exc"])
    assert line["error"] == "KeyError" and line["where"] == "unknown"  # never raised


def test_lines_reach_the_real_stderr_past_ray_serves_redirect(
    configured: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray Serve replica with RAY_SERVE_LOG_TO_STDERR=0 (what
    RAY_SERVE_THROUGHPUT_OPTIMIZED=1 implies) replaces sys.stderr with its
    StreamToLogger, once per (re)configuration: our lines must skip it, or an ERROR
    becomes a buffered INFO record of Serve's file logger, on no console."""
    from ray.serve._private.logging_utils import StreamToLogger

    real = io.StringIO()
    serve_logger = logging.getLogger("test.serve.redirect")
    serve_logger.propagate = False
    swallowed: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            swallowed.append(record)

    serve_logger.addHandler(Keep())
    once = StreamToLogger(serve_logger, logging.INFO, real)
    monkeypatch.setattr(sys, "stderr", StreamToLogger(serve_logger, logging.INFO, once))
    assert logs.real_stderr() is real
    map_exception(KeyError("x"), "rid-43")
    (line,) = lines(real.getvalue())
    assert (line["level"], line["request_id"], line["error"]) == ("ERROR", "rid-43", "KeyError")
    assert swallowed == []


def test_configure_is_idempotent(configured: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO")
    logging.getLogger("switchyard.route").info("route x")
    assert [x["msg"] for x in lines(capsys.readouterr().err)] == ["route x"]


def test_level_filters(configured: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("WARNING")
    logging.getLogger("app.x").info("hidden")
    logging.getLogger("app.x").warning("shown")
    assert [x["msg"] for x in lines(capsys.readouterr().err)] == ["shown"]
