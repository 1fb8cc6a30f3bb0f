"""Records the state store keeps: API keys, tenants, limits, and the usage ledger.

All are pydantic models that forbid unknown fields; stores keep them as JSON.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.schema import Strict

# A request's priority band (``app.fairness.queue``), highest first; batch is sheddable.
Priority = Literal["interactive", "standard", "batch"]


class Limits(Strict):
    """Limits at one level (key, user, team or tenant). ``None`` means no limit. The
    last three say how the level's requests share a saturated model (the most specific
    level that sets one wins): their band, their weight among tenants, and whether a
    request may ask for a higher band than its own (``x-switchyard-priority``)."""

    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    max_concurrent: int | None = Field(default=None, ge=1)
    daily_tokens: int | None = Field(default=None, ge=0)
    monthly_tokens: int | None = Field(default=None, ge=0)
    daily_usd: float | None = Field(default=None, ge=0)
    monthly_usd: float | None = Field(default=None, ge=0)
    priority: Priority | None = None
    share: float | None = Field(default=None, gt=0)
    raise_priority: bool | None = None

    def is_empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


class KeyRecord(Strict):
    """An API key. The secret itself is never stored: ``digest`` is a keyed hash of
    it under the per-key ``salt``; ``id`` (non-secret) is embedded in the key."""

    id: str
    prefix: str  # the first characters of the key, shown in listings
    salt: str  # hex
    digest: str  # hex
    tenant: str
    team: str | None = None
    user: str | None = None
    name: str | None = None
    limits: Limits = Field(default_factory=Limits)
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = None  # filled in by the store when listing


class TenantRecord(Strict):
    id: str
    disabled: bool = False
    limits: Limits = Field(default_factory=Limits)
    created_at: float = 0.0


class AdapterRecord(Strict):
    """A registered LoRA adapter of a served base model, addressed as ``id``
    (``base:name``). With a tenant it is that tenant's private fine-tune."""

    id: str  # base:name
    base: str
    name: str
    source: str  # a directory on the replicas' nodes, or s3://bucket/prefix
    s3_endpoint_url: str | None = None  # an s3:// source's server (None: AWS)
    s3_region: str | None = None
    tenant: str | None = None
    rank: int
    price_per_1m_in: float | None = None  # None: the base's price
    price_per_1m_out: float | None = None
    created_at: float = 0.0

    def visible_to(self, tenant: str | None) -> bool:
        return self.tenant is None or self.tenant == tenant


class LimitsRecord(Strict):
    """Limits for a team or a user inside a tenant."""

    level: Literal["team", "user"]
    tenant: str
    name: str
    limits: Limits = Field(default_factory=Limits)

    @property
    def scope(self) -> str:
        return f"{self.level}:{self.tenant}/{self.name}"


class Principal(Strict):
    """What the store knows about a caller, loaded in one round trip."""

    key: KeyRecord | None = None
    tenant: TenantRecord | None = None
    team: LimitsRecord | None = None
    user: LimitsRecord | None = None


# "lost": the ingress replica vanished (crash, SIGKILL) before it settled the request;
# the store wrote the record when the reservation expired (``StateStore.sweep_lost``).
# "cancelled": ended by a whole-session cancel (POST /v1/sessions/{id}/cancel).
# "shed": the model was saturated and the fair queue shed it (429/503, no engine work).
LedgerStatus = Literal[
    "ok", "client_closed", "error", "rejected_by_engine", "lost", "cancelled", "shed"
]


class LedgerRecord(Strict):
    """One admitted request, written exactly once when it ends."""

    request_id: str  # the gateway's id: x-request-id and the response's id
    client_request_id: str | None = None  # the client's own id, when it sent a sane one
    session_id: str | None = None
    session_slo_ms: float | None = None  # the request's x-switchyard-session-slo-ms
    tenant: str
    team: str | None = None
    user: str | None = None
    key_id: str | None = None
    model_requested: str
    model_served: str | None = None
    adapter: str | None = None  # the LoRA adapter that ran (base:name)
    pool: str | None = None  # the pool that answered
    route_step: str | None = None  # canary | tenant | speculative | default | fallback
    attempts: int = 0  # pools tried
    endpoint: str
    status: LedgerStatus
    http_status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0  # at the model's list price
    # Engine seconds charged to it (its share of each step it was in, prefix-cache hits
    # not recomputed, both P/D legs) and their price at its pools' GPU-hour.
    gpu_seconds: float | None = None
    gpu_cost_usd: float | None = None
    ttft_s: float | None = None
    e2e_s: float
    started_at: float
    ended_at: float
    ingress: str | None = None  # the ingress replica that served it
