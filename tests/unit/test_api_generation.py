"""The request flow (app/api/generation.py) without Ray: a real Layer 1 on SQLite, scripted
pools, and a raw ASGI driver that can leave at any moment. One row per exit path; each
asserts the ledger (records, status, tokens) and that nothing stays admitted."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from app.adapters.registry import AdapterBase, AdapterRegistry
from app.admin.service import AdminService
from app.api.count_tokens import count_tokens
from app.api.generation import GenerationFlow
from app.api.responses_routes import ResponseRoutes
from app.config import GatewayArgs, RequestLimits, ResponsesConfig
from app.engine.factory import SimulatedEngineConfig
from app.engine.lora import LoraSettings
from app.engine.protocol import EngineLoad, EngineOverloaded, GenerationDelta
from app.engine.simulated import SimulationProfile
from app.fairness.pools import FairQueues
from app.fairness.queue import QueueSettings
from app.gateway.gatekeeper import Gatekeeper, GatewayConfig
from app.observability.metrics import GatewayMetrics
from app.responses.book import ResponseBook
from app.routing.snapshot import RouteSnapshot
from app.routing.spec import RoutesSpec
from app.routing.table import LocalModel, RouteTable
from app.state.protocol import LedgerQuery
from app.state.records import AdapterRecord, LedgerRecord, Limits, TenantRecord
from tests.log_helpers import errors, json_lines

TENANT = "acme"
GUARDED = [(b"x-switchyard-proxy", b"1"), (b"content-type", b"application/json")]


@dataclass
class Script:
    """What a pool does: fail before the first delta, or yield ``tokens`` deltas with
    ``gap_s`` between them and optionally fail after ``fail_after`` of them."""

    tokens: int = 3
    gap_s: float = 0.0
    first_s: float = 0.0
    fail_before: BaseException | None = None
    fail_after: int | None = None
    hold: asyncio.Event | None = None  # the first delta waits until it is set
    rest: asyncio.Event | None = None  # the deltas after the first wait until it is set
    load: EngineLoad | None = None  # the engine's load on the first delta
    finish: str = "length"  # the last delta's finish reason


@dataclass
class ScriptedStream:
    """Like a Ray Serve streaming response: ``cancel`` makes a pending or later
    ``__anext__`` raise."""

    script: Script
    request: Any
    engine_id: str
    sent: int = 0
    cancelled: bool = False
    _cancel: asyncio.Event = field(default_factory=asyncio.Event)

    async def _wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._cancel.wait(), seconds)
        if self.cancelled:
            raise RuntimeError("request cancelled")

    async def __anext__(self) -> GenerationDelta:
        s = self.script
        if self.cancelled:
            raise RuntimeError("cancelled stream read")
        if self.sent == 0:
            if s.hold is not None:
                await s.hold.wait()
            if s.first_s:
                await self._wait(s.first_s)
            if s.fail_before is not None:
                raise s.fail_before
        else:
            if s.rest is not None:
                await s.rest.wait()
            if s.gap_s:
                await self._wait(s.gap_s)
        if s.fail_after is not None and self.sent >= s.fail_after:
            raise RuntimeError("engine died mid-stream")
        self.sent += 1
        done = self.sent >= s.tokens
        return GenerationDelta(
            text=f"t{self.sent} ",
            num_new_tokens=1,
            finish_reason=s.finish if done else None,
            prompt_tokens=5 if self.sent == 1 else 0,
            load=s.load if self.sent == 1 else None,
        )

    def cancel(self) -> None:
        self.cancelled = True
        self._cancel.set()


@dataclass
class ScriptedPools:
    scripts: dict[str, Script]
    streams: list[ScriptedStream] = field(default_factory=list)

    def open(
        self,
        table: Any,
        pool: str,
        request: Any,
        attempt: int,
        prompt_tokens: int,
        budget_s: float | None = None,
    ) -> ScriptedStream:
        stream = ScriptedStream(self.scripts[pool], request, request.engine_id(attempt))
        self.streams.append(stream)
        return stream

    async def aclose(self) -> None:
        pass


@dataclass
class Harness:
    flow: GenerationFlow
    gatekeeper: Gatekeeper
    pools: ScriptedPools
    app: FastAPI

    async def records(self) -> list[LedgerRecord]:
        await self.gatekeeper.gate.drain()
        return await self.gatekeeper.store.query_ledger(LedgerQuery(tenant=TENANT))


async def make(
    tmp_path: Path,
    scripts: dict[str, Script],
    routes: dict[str, Any] | None = None,
    *,
    state_url: str | None = None,
    slots: int | None = None,
    fair: QueueSettings | None = None,
    max_stored: int = 1 << 20,
    **limits: int,
) -> Harness:
    """``slots``: the engine slots of model m (its pools then have a fair queue,
    ``fair``'s settings); ``max_stored``: the largest stored response."""
    model: dict[str, Any] = {"pool": "a", "fallbacks": [p for p in scripts if p != "a"]}
    spec = RoutesSpec.model_validate(
        {
            "pools": {**{p: {"kind": "local", "model": "m"} for p in scripts},
                      "e": {"kind": "local", "model": "emb"}},
            "models": {"m": {**model, **(routes or {}).get("m", {})}, "emb": {"pool": "e"}},
            "aliases": {"emb-alias": "emb", **(routes or {}).get("aliases", {})},
        }
    )  # fmt: skip
    local = {"m": LocalModel("LLMServer-m", "generate", 128, slots=slots),
             "emb": LocalModel("LLMServer-emb", "embed", 256)}  # fmt: skip
    table = RouteTable(1, spec, local=local)
    config = GatewayConfig(
        args=GatewayArgs(anonymous_tenant=TENANT),
        state_url=state_url or f"sqlite:///{tmp_path / 'state.db'}",
        tokenizers={"m": SimulatedEngineConfig(served_name="m", profile=SimulationProfile())},
    )
    metrics = GatewayMetrics(["m"])
    gatekeeper = Gatekeeper(config, metrics, replica="test")
    tenant_limits = Limits(**{"max_concurrent": 8, "daily_tokens": 100_000, **limits})
    await gatekeeper.store.put_tenant(TenantRecord(id=TENANT, limits=tenant_limits))
    pools = ScriptedPools(scripts)
    snapshot = RouteSnapshot(None, table, refresh_s=3600)
    request_limits = RequestLimits(max_messages=4, max_prompt_bytes=1000)
    adapters = AdapterRegistry(gatekeeper.store, {"m": AdapterBase(LoraSettings())})
    book = ResponseBook(gatekeeper.store, ResponsesConfig(max_bytes=max_stored), 0.5)
    flow = GenerationFlow(
        snapshot,
        pools,
        gatekeeper,
        metrics,
        1 << 20,
        request_limits,
        adapters=adapters,  # type: ignore[arg-type]
        fair=FairQueues(fair or QueueSettings()) if slots is not None else None,
        book=book,
    )
    app = FastAPI()
    stored = ResponseRoutes(gatekeeper, book, metrics)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await flow.handle(request, "responses")

    @app.get("/v1/responses/{response_id}")
    async def response(response_id: str, request: Request) -> Response:
        return await stored.show(request, response_id)

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, request: Request) -> Response:
        return await stored.input_items(request, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> Response:
        return await stored.delete(request, response_id)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await flow.handle(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await flow.handle(request, "completion")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await flow.handle(request, "messages")

    @app.post("/v1/messages/count_tokens")
    async def count(request: Request) -> Response:
        return await count_tokens(request, gatekeeper, snapshot, 1 << 20)

    return Harness(flow, gatekeeper, pools, app)


@dataclass
class Result:
    status: int | None = None
    body: bytes = b""
    headers: dict[bytes, bytes] = field(default_factory=dict)
    events: list[Any] = field(default_factory=list)


async def call(
    h: Harness,
    body: dict[str, Any],
    *,
    leave: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    path: str = "/v1/chat/completions",
    rid: str = "rid0001",
    method: str = "POST",
) -> Result:
    """Drive one request. ``leave``: "before_admission" (disconnect at once, the handler
    is cancelled while it authenticates), "before_start" (disconnect as soon as the
    response starts, before any body chunk), "mid_stream" (after the first chunk)."""
    raw = json.dumps(body).encode()
    result = Result()
    gone = asyncio.Event()
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            result.status = message["status"]
            result.headers = dict(message.get("headers", []))
            if leave == "before_start":
                gone.set()
                raise OSError("client gone")
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            result.body += chunk
            for line in chunk.decode().splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    result.events.append(json.loads(line[6:]))
            if leave == "mid_stream" and chunk.strip():
                gone.set()
                raise OSError("client gone")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path.partition("?")[0],
        "raw_path": path.partition("?")[0].encode(),
        "query_string": path.partition("?")[2].encode(),
        "root_path": "",
        "headers": [*(headers or GUARDED), (b"x-request-id", rid.encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }
    task = asyncio.create_task(h.app(scope, receive, send))
    if leave == "before_admission":
        await asyncio.sleep(0)
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, OSError):
        await task
    return result


def chat(stream: bool, **extra: Any) -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    return {**body, "stream": stream, **extra}


async def settled(h: Harness) -> list[LedgerRecord]:
    for _ in range(100):  # cancelled generators finish on the next loop turns
        if h.gatekeeper.gate.live == 0 and not h.flow.in_flight:
            break
        await asyncio.sleep(0.01)
    return await h.records()


Expected = list[tuple[str, int, int]]
ROWS: list[tuple[str, dict[str, Script], dict[str, Any], str | None, Expected]] = [
    # name, pools, request, leave, expected records: (status, http_status, completion tokens)
    ("ok-stream", {"a": Script(3)}, chat(True), None, [("ok", 200, 3)]),
    ("ok-json", {"a": Script(3)}, chat(False), None, [("ok", 200, 3)]),
    (
        "engine-error-before-first",
        {"a": Script(fail_before=EngineOverloaded("full"))},
        chat(True),
        None,
        [("rejected_by_engine", 503, 0)],
    ),
    ("error-mid-stream", {"a": Script(5, fail_after=2)}, chat(True), None, [("error", 500, 2)]),
    ("error-mid-json", {"a": Script(5, fail_after=2)}, chat(False), None, [("error", 500, 2)]),
    ("gone-before-admission", {"a": Script(3)}, chat(True), "before_admission", []),
    (
        "gone-before-stream-starts",
        {"a": Script(50, gap_s=0.01)},
        chat(True),
        "before_start",
        [("client_closed", 499, 1)],
    ),
    (
        "gone-mid-stream",
        {"a": Script(50, gap_s=0.01)},
        chat(True),
        "mid_stream",
        [("client_closed", 499, 1)],
    ),
    (
        "fallback-then-ok",
        {"a": Script(fail_before=EngineOverloaded("full")), "b": Script(2)},
        chat(True),
        None,
        [("ok", 200, 2)],
    ),
    ("context-too-long", {"a": Script(3)}, chat(True, max_tokens=200), None, []),
    (
        "prompt-over-the-byte-limit",
        {"a": Script(3)},
        {"model": "m", "messages": [{"role": "user", "content": "é" * 600}]},
        None,
        [],
    ),
    (
        "too-many-messages",
        {"a": Script(3)},
        {"model": "m", "messages": [{"role": "user", "content": "x"}] * 5},
        None,
        [],
    ),
]


@pytest.mark.parametrize(
    ("pools", "body", "leave", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
async def test_every_exit_path_ends_in_its_records(
    tmp_path: Path,
    pools: dict[str, Script],
    body: dict[str, Any],
    leave: str | None,
    expected: list[tuple[str, int, int]],
) -> None:
    h = await make(tmp_path, pools)
    await call(h, body, leave=leave)
    records = await settled(h)
    got = [(r.status, r.http_status, r.completion_tokens) for r in records]
    if expected and expected[0][0] == "client_closed":
        # how far the stream got before the disconnect was seen varies by a token or two
        assert [(s, code) for s, code, _ in got] == [("client_closed", 499)]
        assert records[0].completion_tokens < 50
    else:
        assert got == expected
    assert h.gatekeeper.gate.live == 0 and h.flow.in_flight == 0
    slots = await h.gatekeeper.store.budget_used(_daily_budget_key())
    assert slots[1] == 0  # no budget hold left behind
    for stream in h.pools.streams:
        finished = stream.sent >= stream.script.tokens or stream.script.fail_before is not None
        assert finished or stream.cancelled or stream.script.fail_after is not None


def _daily_budget_key() -> str:
    import time

    from app.gateway.plan import build_plan

    plan = build_plan([(f"tenant:{TENANT}", Limits(daily_tokens=1))], time.time())
    return plan.budgets[0].key


async def test_the_gateway_id_is_the_one_key(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(2)})
    headers = [*GUARDED, (b"x-client-request-id", b"client-7")]
    result = await call(h, chat(True), headers=headers)
    (record,) = await settled(h)
    assert result.events[0]["id"] == "chatcmpl-rid0001"
    assert record.request_id == "rid0001" and record.client_request_id == "client-7"
    (stream,) = h.pools.streams
    assert stream.engine_id == "rid0001-1"  # the engine's id: gateway id + attempt


async def test_each_attempt_gets_its_own_engine_id(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(fail_before=EngineOverloaded("x")), "b": Script(1)})
    await call(h, chat(False))
    await settled(h)
    assert [s.engine_id for s in h.pools.streams] == ["rid0001-1", "rid0001-2"]


async def test_without_the_proxy_guard_the_ingress_makes_its_own_id(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(1)})
    await call(h, chat(False), headers=[(b"content-type", b"application/json")])
    (record,) = await settled(h)
    assert record.request_id != "rid0001" and len(record.request_id) == 32


async def test_context_window_is_checked_before_admission_with_and_without_budgets(
    tmp_path: Path,
) -> None:
    for i, limits in enumerate(({}, {"tpm": 10_000})):
        h = await make(tmp_path / str(i), {"a": Script(1)}, **limits)
        result = await call(h, chat(False, max_tokens=500))
        assert result.status == 400
        assert json.loads(result.body)["error"]["code"] == "context_length_exceeded"
        assert await settled(h) == []
        assert h.pools.streams == []


async def test_shutdown_lets_short_streams_finish_and_ends_long_ones(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(1000, gap_s=0.01)})
    running = asyncio.create_task(call(h, chat(True, max_tokens=100)))
    while not h.pools.streams or h.pools.streams[0].sent < 3:
        await asyncio.sleep(0.01)
    await h.flow.shutdown(grace_s=0.05)
    result = await running
    (record,) = await settled(h)
    assert record.status == "error" and record.http_status == 503
    assert 3 <= record.completion_tokens < 100
    assert result.events[-1]["error"]["code"] == "shutting_down"
    assert h.pools.streams[0].cancelled
    refused = await call(h, chat(False))
    assert refused.status == 503
    assert json.loads(refused.body)["error"]["code"] == "shutting_down"


async def test_shutdown_waits_for_streams_within_the_grace(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(10, gap_s=0.01)})
    running = asyncio.create_task(call(h, chat(True)))
    while not h.pools.streams:
        await asyncio.sleep(0.01)
    await h.flow.shutdown(grace_s=5.0)
    await running
    (record,) = await settled(h)
    assert (record.status, record.completion_tokens) == ("ok", 10)


async def test_shutdown_before_the_first_token_is_503_shutting_down(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script(3, first_s=30.0)})
    running = asyncio.create_task(call(h, chat(False)))
    while not h.pools.streams:
        await asyncio.sleep(0.01)
    await h.flow.shutdown(grace_s=0.05)
    result = await running
    assert result.status == 503
    assert json.loads(result.body)["error"]["code"] == "shutting_down"
    (record,) = await settled(h)
    assert (record.status, record.http_status) == ("rejected_by_engine", 503)


async def test_the_stop_signal_starts_the_grace_and_ends_long_streams_before_del(
    tmp_path: Path,
) -> None:
    """Ray waits for ongoing requests before ``__del__``: ``begin_shutdown`` (its stop
    signal) alone must end a stream that outlives the grace, settled with what it got;
    the later ``shutdown`` keeps the first deadline and only waits."""
    h = await make(tmp_path, {"a": Script(1000, gap_s=0.01)})
    running = asyncio.create_task(call(h, chat(True, max_tokens=100)))
    while not h.pools.streams or h.pools.streams[0].sent < 3:
        await asyncio.sleep(0.01)
    h.flow.begin_shutdown(grace_s=0.05)
    result = await asyncio.wait_for(running, 5)
    assert result.events[-1]["error"]["code"] == "shutting_down"
    (record,) = await settled(h)
    assert (record.status, record.http_status) == ("error", 503)
    assert 3 <= record.completion_tokens < 100
    assert h.flow.in_flight == 0
    await asyncio.wait_for(h.flow.shutdown(grace_s=60.0), 5)  # not a new 60 s grace
    assert len(await settled(h)) == 1


ADAPTER_ROUTES: dict[str, Any] = {
    "m": {"tenants": {TENANT: {"adapter": "m:mine"}}},
    "aliases": {"support": "m:support", "gone": "m:gone", "theirs": "m:theirs"},
}
_ADAPTER_CASES = {
    # requested model → (status, adapter the pool got, ledger model/adapter)
    "an alias to an adapter": ("support", 200, "m:support"),
    "the tenant's override names its private adapter": ("m", 200, "m:mine"),
    "an alias to an unregistered adapter is not found": ("gone", 404, None),
    "an alias to another tenant's adapter is not found": ("theirs", 404, None),
}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("model", "status", "adapter"), list(_ADAPTER_CASES.values()), ids=list(_ADAPTER_CASES)
)
async def test_routes_that_name_adapters_resolve_them_per_caller(
    tmp_path: Path, model: str, status: int, adapter: str | None
) -> None:
    h = await make(tmp_path, {"a": Script()}, ADAPTER_ROUTES)
    for name, tenant in (("support", None), ("mine", TENANT), ("theirs", "globex")):
        record = AdapterRecord(id=f"m:{name}", base="m", name=name, source="/x", rank=8,
                               tenant=tenant)  # fmt: skip
        await h.gatekeeper.store.put_adapter(record)
    result = await call(h, chat(False, model=model))
    assert result.status == status, result.body
    if status != 200:
        assert json.loads(result.body)["error"]["code"] == "model_not_found"
        assert h.pools.streams == [] and await settled(h) == []
        return
    (stream,) = h.pools.streams
    assert stream.request.adapter is not None and stream.request.adapter.id == adapter
    assert json.loads(result.body)["model"] == adapter
    (record,) = await settled(h)
    assert record.adapter == adapter


@pytest.mark.asyncio
async def test_a_tenant_override_to_a_missing_adapter_serves_the_base(tmp_path: Path) -> None:
    h = await make(tmp_path, {"a": Script()}, ADAPTER_ROUTES)  # m:mine not registered
    result = await call(h, chat(False))
    assert result.status == 200
    (stream,) = h.pools.streams
    assert stream.request.adapter is None
    (record,) = await settled(h)
    assert record.adapter is None and record.status == "ok"


# ---- a model of another task -------------------------------------------------------------

EMBEDS = "serves embeddings (task embed); use /v1/embeddings."


async def _credentials(h: Harness, who: str) -> list[tuple[bytes, bytes]]:
    """Request headers of ``who``: anonymous, a key, or a token-limited key."""
    if who == "anonymous":
        return GUARDED
    limits = Limits(tpm=10_000, daily_tokens=50_000) if who == "token-limited key" else None
    issued = await AdminService(h.gatekeeper.store).create_key(TENANT, limits=limits)
    return [*GUARDED, (b"authorization", f"Bearer {issued.secret}".encode())]


def _no_tokenizer(h: Harness) -> list[str | None]:
    """Record every tokenizer the flow asks the gatekeeper for."""
    asked: list[str | None] = []
    real = h.gatekeeper.tokenizer

    def tokenizer(model: str | None) -> Any:
        asked.append(model)
        return real(model)

    h.gatekeeper.tokenizer = tokenizer  # type: ignore[method-assign]
    return asked


WRONG_ENDPOINT = [
    # path, body, the message's subject
    ("/v1/chat/completions", chat(False, model="emb"), "`emb`"),
    ("/v1/chat/completions", chat(True, model="emb-alias"), "`emb-alias` (model `emb`)"),
    ("/v1/completions", {"model": "emb", "prompt": "hi", "max_tokens": 4}, "`emb`"),
]


@pytest.mark.parametrize("who", ["anonymous", "key", "token-limited key"])
@pytest.mark.parametrize(("path", "body", "subject"), WRONG_ENDPOINT)
async def test_a_generation_request_to_an_embedding_model_is_a_400_before_any_work(
    tmp_path: Path, who: str, path: str, body: dict[str, Any], subject: str
) -> None:
    h = await make(tmp_path, {"a": Script(3)})
    headers = await _credentials(h, who)
    asked = _no_tokenizer(h)
    result = await call(h, body, headers=headers, path=path)
    assert result.status == 400, result.body
    error = json.loads(result.body)["error"]
    assert error == {
        "message": f"{subject} {EMBEDS}",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_supported_for_endpoint",
    }
    assert asked == []  # no tokenizer, no chat template
    assert h.pools.streams == []
    assert await settled(h) == []  # no ledger record
    assert (await h.gatekeeper.store.budget_used(_daily_budget_key()))[1] == 0


async def test_an_exception_raised_in_the_flow_is_one_error_line_and_a_bare_500(
    tmp_path: Path,
) -> None:
    h = await make(tmp_path, {"a": Script(fail_before=RuntimeError("at /srv/secret.py"))})
    with json_lines() as lines:
        result = await call(h, chat(False))
    assert result.status == 500
    error = json.loads(result.body)["error"]
    assert error["code"] == "internal_error" and "rid0001" in error["message"]
    assert "secret" not in result.body.decode() and "RuntimeError" not in result.body.decode()
    (line,) = errors(lines)
    assert line["request_id"] == "rid0001" and line["error"] == "RuntimeError"
    source, first = inspect.getsourcelines(ScriptedStream.__anext__)
    raised = first + next(i for i, text in enumerate(source) if "raise s.fail_before" in text)
    assert line["where"] == f"{ScriptedStream.__module__}:__anext__:{raised}"
    (record,) = await settled(h)
    assert record.http_status == 500


async def test_an_error_mid_stream_is_logged_under_the_gateway_request_id(
    tmp_path: Path,
) -> None:
    h = await make(tmp_path, {"a": Script(5, fail_after=2)})
    with json_lines() as lines:
        result = await call(h, chat(True))
    assert result.events[-1]["error"]["code"] == "internal_error"
    (line,) = errors(lines)
    assert line["request_id"] == "rid0001"  # the one key, not the response id
    assert line["where"].startswith(f"{ScriptedStream.__module__}:__anext__:")
