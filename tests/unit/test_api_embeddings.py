"""The embeddings flow (app/api/embeddings.py) without Ray: a real Layer 1 on SQLite and
a scripted pool. A model of another task is refused before any work on every key; the
body the flow writes (float and base64) validates against the published document; an
internal error is one logged line and a bare 500."""

from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from app.admin.service import AdminService
from app.api.embeddings import EmbeddingFlow
from app.api.flow import Calls
from app.api.openapi import openapi_document
from app.config import GatewayArgs, RequestLimits
from app.engine.factory import SimulatedEngineConfig
from app.engine.simulated import SimulationProfile
from app.gateway.gatekeeper import Gatekeeper, GatewayConfig
from app.observability.metrics import GatewayMetrics
from app.request import InferenceRequest
from app.routing.snapshot import RouteSnapshot
from app.routing.spec import RoutesSpec
from app.routing.table import LocalModel, RouteTable
from app.state.protocol import LedgerQuery
from app.state.records import LedgerRecord, Limits, TenantRecord
from tests.log_helpers import errors, json_lines

TENANT = "acme"
GUARDED = {"x-switchyard-proxy": "1", "x-request-id": "rid0002"}
VECTORS = [[0.25, -1.5, 3.0], [1e-3, 0.0, -2.0]]


@dataclass
class ScriptedPools:
    """Each embed call answers ``VECTORS`` (one per input) or raises ``fail``."""

    fail: BaseException | None = None
    vectors: list[list[float]] = field(default_factory=lambda: VECTORS)
    calls: list[InferenceRequest] = field(default_factory=list)

    async def embed(
        self, table: Any, pool: str, request: InferenceRequest
    ) -> tuple[list[list[float]], int]:
        self.calls.append(request)
        if self.fail is not None:
            raise self.fail
        inputs = request.prompt.inputs or ()
        return [self.vectors[i % len(self.vectors)] for i in range(len(inputs))], 7


@dataclass
class Harness:
    flow: EmbeddingFlow
    gatekeeper: Gatekeeper
    pools: ScriptedPools
    client: httpx.AsyncClient
    asked: list[str | None]

    async def records(self) -> list[LedgerRecord]:
        await self.gatekeeper.gate.drain()
        return await self.gatekeeper.store.query_ledger(LedgerQuery(tenant=TENANT))

    async def headers(self, who: str) -> dict[str, str]:
        """The headers of ``who``: anonymous, a key, or a token-limited key."""
        if who == "anonymous":
            return GUARDED
        limits = Limits(tpm=10_000, daily_tokens=50_000) if who == "token-limited key" else None
        issued = await AdminService(self.gatekeeper.store).create_key(TENANT, limits=limits)
        return {**GUARDED, "authorization": f"Bearer {issued.secret}"}


async def make(tmp_path: Path, pools: ScriptedPools | None = None) -> Harness:
    spec = RoutesSpec.model_validate(
        {
            "pools": {"e": {"kind": "local", "model": "emb"}, "g": {"kind": "local", "model": "m"}},
            "models": {"emb": {"pool": "e"}, "m": {"pool": "g"}},
            "aliases": {"chat-alias": "m"},
        }
    )
    local = {"emb": LocalModel("LLMServer-emb", "embed", 256),
             "m": LocalModel("LLMServer-m", "generate", 128)}  # fmt: skip
    table = RouteTable(1, spec, local=local)
    simulated = SimulatedEngineConfig(served_name="emb", profile=SimulationProfile(), task="embed")
    config = GatewayConfig(
        args=GatewayArgs(anonymous_tenant=TENANT),
        state_url=f"sqlite:///{tmp_path / 'state.db'}",
        tokenizers={"emb": simulated,
                    "m": SimulatedEngineConfig(served_name="m", profile=SimulationProfile())},
    )  # fmt: skip
    metrics = GatewayMetrics(["emb", "m"])
    gatekeeper = Gatekeeper(config, metrics, replica="test")
    await gatekeeper.store.put_tenant(
        TenantRecord(id=TENANT, limits=Limits(max_concurrent=8, daily_tokens=100_000))
    )
    pools = pools or ScriptedPools()
    asked: list[str | None] = []
    real = gatekeeper.tokenizer

    def tokenizer(model: str | None) -> Any:
        asked.append(model)
        return real(model)

    gatekeeper.tokenizer = tokenizer  # type: ignore[method-assign]
    flow = EmbeddingFlow(
        RouteSnapshot(None, table, refresh_s=3600),
        pools,  # type: ignore[arg-type]
        gatekeeper,
        metrics,
        1 << 20,
        RequestLimits(),
        Calls(gatekeeper, metrics),
    )
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await flow.handle(request)

    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    return Harness(flow, gatekeeper, pools, client, asked)


@pytest.mark.parametrize("who", ["anonymous", "key", "token-limited key"])
@pytest.mark.parametrize(
    ("model", "subject"), [("m", "`m`"), ("chat-alias", "`chat-alias` (model `m`)")]
)
async def test_embeddings_of_a_generation_model_are_a_400_before_any_work(
    tmp_path: Path, who: str, model: str, subject: str
) -> None:
    h = await make(tmp_path)
    r = await h.client.post(
        "/v1/embeddings", json={"model": model, "input": ["a", "b"]}, headers=await h.headers(who)
    )
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": f"{subject} serves text generation (task generate); use "
        "/v1/chat/completions, /v1/completions, /v1/responses or /v1/messages.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_supported_for_endpoint",
    }
    assert h.asked == [] and h.pools.calls == []  # no tokenizer, no engine
    assert await h.records() == []


def _validate(body: dict[str, Any], status: str = "200") -> None:
    doc = openapi_document()
    op = doc["paths"]["/v1/embeddings"]["post"]
    schema = op["responses"][status]["content"]["application/json"]["schema"]
    jsonschema.validate(body, {**schema, "components": doc["components"]})


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
async def test_the_response_validates_against_the_published_document(
    tmp_path: Path, encoding_format: str
) -> None:
    h = await make(tmp_path)
    body = {"model": "emb", "input": ["a", "b"], "encoding_format": encoding_format}
    r = await h.client.post("/v1/embeddings", json=body, headers=GUARDED)
    assert r.status_code == 200, r.text
    answer = r.json()
    _validate(answer)
    got = [d["embedding"] for d in answer["data"]]
    if encoding_format == "base64":
        assert all(isinstance(e, str) for e in got)
        got = [list(struct.unpack(f"<{len(v)}f", base64.b64decode(e))) for e, v in
               zip(got, VECTORS, strict=True)]  # fmt: skip
        assert all(math.isclose(a, b, rel_tol=1e-6) for g, v in zip(got, VECTORS, strict=True)
                   for a, b in zip(g, v, strict=True))  # fmt: skip
    else:
        assert got == VECTORS
    assert answer["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    (record,) = await h.records()
    assert (record.status, record.http_status) == ("ok", 200)


async def test_an_exception_in_the_flow_is_one_error_line_and_a_bare_500(tmp_path: Path) -> None:
    h = await make(tmp_path, ScriptedPools(fail=ValueError("token=abc123")))
    with json_lines() as lines:
        r = await h.client.post("/v1/embeddings", json={"model": "emb", "input": "a"},
                                headers=GUARDED)  # fmt: skip
    assert r.status_code == 500
    _validate(r.json(), "500")
    assert "abc123" not in r.text and "ValueError" not in r.text and "rid0002" in r.text
    (line,) = errors(lines)
    assert (line["request_id"], line["error"]) == ("rid0002", "ValueError")
    assert line["where"].startswith(f"{ScriptedPools.__module__}:embed:")


async def test_a_vector_json_cannot_carry_is_a_logged_500_and_recorded(tmp_path: Path) -> None:
    """The body is rendered inside the mapped block: a NaN is this request's 500 (its
    ledger record says so), not the framework's bare text 500 after an "ok" record."""
    h = await make(tmp_path, ScriptedPools(vectors=[[math.nan, 1.0]]))
    with json_lines() as lines:
        r = await h.client.post("/v1/embeddings", json={"model": "emb", "input": "a"},
                                headers=GUARDED)  # fmt: skip
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    (line,) = errors(lines)
    assert line["error"] == "ValueError" and line["request_id"] == "rid0002"
    (record,) = await h.records()
    assert record.http_status == 500
