"""Switchyard's log lines: JSON on stderr with the request id, for every 500."""

from __future__ import annotations

import json
import logging
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


def test_configure_is_idempotent(configured: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO")
    logging.getLogger("switchyard.route").info("route x")
    assert [x["msg"] for x in lines(capsys.readouterr().err)] == ["route x"]


def test_level_filters(configured: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("WARNING")
    logging.getLogger("app.x").info("hidden")
    logging.getLogger("app.x").warning("shown")
    assert [x["msg"] for x in lines(capsys.readouterr().err)] == ["shown"]
