"""Layer 1 assembled for one ingress replica: store, authenticator, gate and prompt
tokenizers, built from a picklable ``GatewayConfig`` the builder makes
once from the serve config and the settings."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from app.config import GatewayArgs
from app.engine.factory import EngineConfig, build_tokenizer
from app.engine.tokenizer import PromptTokenizer
from app.gateway.admission import Gate
from app.gateway.auth import Authenticator
from app.gateway.jwt_auth import JwtConfig, JwtVerifier
from app.gateway.plan import Plan, build_plan, levels
from app.observability.metrics import GatewayMetrics
from app.request import Caller
from app.state.factory import open_store
from app.state.protocol import StoreUnavailable
from app.state.records import LedgerRecord, Principal

log = logging.getLogger(__name__)

CLOSE_DRAIN_S = 2.0  # the shutdown drained the journal already (Gate.drain's deadline)


@dataclass(frozen=True)
class GatewayConfig:
    args: GatewayArgs
    state_url: str
    jwt: JwtConfig | None = None
    admin_token: SecretStr | None = None
    tokenizers: dict[str, EngineConfig] = field(default_factory=dict)
    journal_dir: Path | None = None  # settlements the store did not take (None: memory)


class Gatekeeper:
    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics, replica: str) -> None:
        args = config.args
        self.config = config
        self.metrics = metrics
        self.store = open_store(config.state_url, timeout_s=args.store_timeout_s)
        self.auth = Authenticator(
            self.store,
            jwt=JwtVerifier(config.jwt) if config.jwt is not None else None,
            anonymous_tenant=args.anonymous_tenant,
            stale_ok_on_store_failure=args.on_store_failure == "fail_open",
        )
        self.gate = Gate(
            self.store,
            args,
            replica=replica,
            observe=self._observe,
            on_settled=self._billed,
            on_failure=lambda op: metrics.store_failures.labels(op).inc(),
            journal_dir=config.journal_dir,
            on_pending=metrics.settlements_pending.set,
            on_journaled=metrics.settlements_journaled.inc,
        )
        metrics.reservations_outstanding.set_function(lambda: self.gate.live)
        # Built now, in the replica's constructor: loading a tokenizer on the first
        # request stalled the event loop long enough for concurrent requests' store
        # calls to time out (503 "store unavailable" right after start-up).
        self._tokenizers: dict[str, PromptTokenizer] = {
            model: build_tokenizer(engine) for model, engine in config.tokenizers.items()
        }
        if args.anonymous_tenant is not None:
            log.warning(
                "requests without credentials are served as tenant %r (anonymous_tenant); "
                "never configure this in production",
                args.anonymous_tenant,
            )

    def _observe(self, op: str, seconds: float) -> None:
        self.metrics.store_latency.labels(op).observe(seconds)

    def _billed(self, record: LedgerRecord) -> None:
        m = self.metrics
        tenant = m.tenant_label(record.tenant)
        m.tenant_tokens.labels(tenant, "prompt").inc(record.prompt_tokens)
        m.tenant_tokens.labels(tenant, "completion").inc(record.completion_tokens)
        m.tenant_tokens.labels(tenant, "cached").inc(record.cached_tokens)
        m.tenant_cost.labels(tenant).inc(record.cost_usd)
        m.tenant_requests.labels(tenant).inc()
        if record.gpu_seconds is not None:
            m.tenant_gpu_seconds.labels(tenant).inc(record.gpu_seconds)
            m.tenant_gpu_cost.labels(tenant).inc(record.gpu_cost_usd or 0.0)

    async def identify(self, headers: Mapping[str, str]) -> tuple[Caller, Principal]:
        started = time.perf_counter()
        try:
            return await self.auth.authenticate(headers)
        except StoreUnavailable:
            self.metrics.store_failures.labels("principal").inc()
            raise
        finally:
            self._observe("principal", time.perf_counter() - started)

    def plan(self, caller: Caller, principal: Principal) -> Plan:
        return build_plan(
            levels(caller, principal), time.time(), self.config.args.budget_margin_tokens
        )

    async def close(self, drain_s: float = CLOSE_DRAIN_S) -> None:
        """Wait for settlements in flight, give the journal ``drain_s`` more to reach the
        store (what is left stays on disk for the next start), then close the store."""
        await self.gate.drain(drain_s)
        await self.gate.close()
        await self.store.close()

    def tokenizer(self, model: str | None) -> PromptTokenizer | None:
        if model is None:
            return None
        tok = self._tokenizers.get(model)
        if tok is None and model in self.config.tokenizers:
            tok = self._tokenizers[model] = build_tokenizer(self.config.tokenizers[model])
        return tok
