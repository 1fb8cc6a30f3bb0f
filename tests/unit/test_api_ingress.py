"""The ingress app's outer layer: what escapes a route is the one mapper's logged,
OpenAI-shaped 500 (``app.api.errors.LastResort``), not Starlette's bare text."""

from __future__ import annotations

import httpx

from app.api.errors import LastResort
from app.api.ingress import fastapi_app
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
