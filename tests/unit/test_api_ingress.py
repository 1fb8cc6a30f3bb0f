"""The ingress app's outer layer: what escapes a route is the one mapper's logged,
OpenAI-shaped 500 (``app.api.errors.LastResort``), not Starlette's bare text."""

from __future__ import annotations

import httpx
import pytest
from starlette.requests import Request

from app.api.errors import LastResort
from app.api.ingress import _dialect, fastapi_app
from tests.log_helpers import errors, json_lines


def test_the_ingress_app_maps_what_escapes_its_routes() -> None:
    assert [m.cls for m in fastapi_app.user_middleware] == [LastResort]


async def test_a_route_that_raises_answers_a_json_500_and_logs_it_once() -> None:
    """Through the app's real middleware stack (a copy of the ingress app's)."""
    from fastapi import FastAPI

    app = FastAPI()
    app.user_middleware = list(fastapi_app.user_middleware)

    @app.get("/boom")
    async def boom() -> None:
        raise LookupError("private detail")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = {"x-switchyard-proxy": "1", "x-request-id": "rid-ingress"}
    with json_lines() as lines:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.get("/boom", headers=headers)
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "internal_error" and "private" not in r.text
    (line,) = errors(lines)
    assert (line["request_id"], line["error"]) == ("rid-ingress", "LookupError")
    assert line["where"].endswith(f":boom:{boom.__code__.co_firstlineno + 2}")


@pytest.mark.parametrize(
    ("root_path", "path", "dialect"),
    [("", "/v1/messages", "anthropic"), ("", "/v1/messages/count_tokens", "anthropic"),
     ("", "/v1/chat/completions", "openai"), ("/sim", "/sim/v1/messages", "anthropic"),
     ("/sim", "/sim/v1/models", "openai"), ("/v1/messages", "/v1/messages/v1/models", "openai")],
)  # fmt: skip
def test_framework_errors_take_anthropics_shape_on_its_paths_under_any_prefix(
    root_path: str, path: str, dialect: str
) -> None:
    scope = {"type": "http", "method": "GET", "path": path, "root_path": root_path,
             "query_string": b"", "headers": [], "server": ("t", 80)}  # fmt: skip
    assert _dialect(Request(scope)) == dialect
