"""Redis key names for ``RedisStore``: hash tags per tenant, the key layout, and what
Redis Cluster support means.

Hash tags. ``{T}`` is the hash tag of tenant ``T``: ``T`` in braces, with ``%`` written
``%25`` and ``}`` written ``%7D`` (the empty tenant is ``{%}``), so each tenant has its own
non-empty tag. A check key (``app.gateway.plan``: ``rate:<scope>:requests|tokens``,
``conc:<scope>``, ``budget:<scope>:tokens|usd:d|m:<period>``) belongs to the tenant its
scope names:
- ``tenant:<T>`` → ``T``; ``team:<T>/<name>`` and ``user:<T>/<name>`` → ``T`` (up to the
  first ``/``);
- ``key:<id>`` → the tenant of key record ``<id>``. The store learns it whenever it reads
  or writes that record (``load_principal``, which the gateway calls before it admits,
  ``get_key``, ``list_keys``, ``put_key``) and otherwise reads the record (one GET) first.
  A key without a record is tagged ``{key:<id>}``. A key never changes tenant (the admin
  API cannot move one), so a check always maps to the same Redis key on every replica;
- a key in any other form is tagged with the whole check key (a slot of its own).
The keys ``settle`` writes besides the checks' (marker, ledger, id index, last use) take
the tag of the ledger record's tenant.

Key layout (``ns`` = namespace, default ``sy``; ``<check>`` = the check's own key):
- ``ns:key:<id>``: key record JSON (found by id alone, so untagged);
  ``ns:{T}:tenant``: tenant record; ``ns:{T}:limits:<level>:<T>/<name>``: team/user
  limits; index sets ``ns:keys`` (key ids), ``ns:tenants`` (tenant ids), ``ns:limits``
  (scopes ``<level>:<T>/<name>``).
- ``ns:{T}:keys:last_used``: hash key id -> epoch seconds of its last settled request.
- ``ns:{T}:<rate check>``: hash {tokens, ts}, expires 2 minutes after it would be full.
- ``ns:{T}:<concurrency check>``: zset request_id -> expiry; the key expires 60 s after
  its newest member.
- ``ns:{T}:<budget check>``: hash {used}; ``...:held``: zset request_id -> expiry of the
  reservation; ``...:amt``: hash request_id -> reserved amount; all three expire at
  ``BudgetCheck.expires_at``.
- ``ns:{T}:settled:<request_id>``: idempotency marker of ``settle`` (kept 2 days).
- ``ns:{T}:ledger``: stream of the tenant's settled requests (field ``record`` =
  LedgerRecord JSON), never trimmed here. Entry ids are the Redis clock at settlement
  in microseconds (``<ms>-<µs within the ms × 1000>``, raised past the last id when the
  clock did not move on), so the streams of all tenants merge in time order.
- ``ns:{T}:ledger:ids``: hash request_id -> entry id in ``ns:{T}:ledger``; never expires
  (the ledger is never trimmed either). A request id appears once per tenant's ledger.
- ``ns:ledger:tenants``: set of the tenants that have a ledger stream, including tenants
  without a record (the anonymous tenant); ``settle`` adds the tenant in the same
  pipeline, just before its script.
- ``ns:{T}:pending``: zset request_id -> expiry of the tracked requests admitted for
  tenant ``T`` (those with ``AdmitRequest.pending`` and a slot or a budget; expiry = the
  reservation's, extended by ``refresh``); ``ns:{T}:pending:info``: hash request_id ->
  JSON ``{record: pending LedgerRecord JSON, conc: [zset key], budgets: [{k: counter key,
  unit, exp}]}``. ``admit`` writes both, ``settle`` and ``sweep_lost`` delete both, in
  their scripts; neither expires (an entry waits for its sweep).
- ``ns:pending:tenants``: set of the tenants that may have pending entries. ``admit``
  adds the tenant in the same pipeline, just *after* its script; ``sweep_lost`` removes
  a tenant whose zset it found empty, then reads the zset again and adds the tenant back
  when an admit got in between — so an entry is never left out of the set.
- ``ns:{T}:response:<id>``: a stored response's JSON (``app.state.redis_responses``),
  expiring at its retention TTL.

Redis Cluster. Every script (``admit``, ``settle``, ``refresh``, ``budget_used``,
``pending_due``, ``sweep``) touches only the keys passed in its KEYS. All keys of one
gateway request — its rate buckets, concurrency zsets, budget counters with their
``:held``/``:amt``, its settled marker, its pending entry, and its tenant's ledger
stream, ledger id index and ``keys:last_used`` hash — carry the tenant's hash tag
``{T}``, as do the tenant record and its team/user limits, so they share one slot:
``admit``, ``settle`` and ``budget_used`` are each one single-slot script, and
``refresh`` sends one script per tenant in one pipeline. ``sweep_lost`` reads
``ns:pending:tenants``, then runs ``pending_due`` per tenant (one pipeline) and
``sweep`` per tenant with expired entries (one pipeline): the pending zset and hash, the
entries' settled markers and check keys (stored, fully named, in the pending hash),
ledger and ``keys:last_used`` are all in the tenant's slot. This holds when every check
of a request belongs to the tenant of its ledger record — what ``app.gateway.plan``
builds for key, JWT and anonymous callers — and the tenant id contains no ``/``; a
request mixing tenants is refused by a cluster (CROSSSLOT) and still works on a single
Redis. Key records (``ns:key:<id>``) and the global sets (``ns:keys``, ``ns:tenants``,
``ns:limits``, ``ns:ledger:tenants``, ``ns:pending:tenants``) live in other slots and
are written only by separate commands, never inside a script or a transaction, so record
writes are not atomic (the record first, then its index entry). ``load_principal`` costs
two round trips the first time a process sees a key (the key record, then one MGET of
the tenant's records) and one afterwards. A ledger query without a tenant reads
``ns:ledger:tenants``, then every listed tenant's stream, pipelined: one round trip per
page (up to 500 entries) of the longest stream, and with ``limit`` up to ``limit``
matching records per tenant; a lookup by request id alone costs one HGET per ledger
tenant (pipelined) plus one XRANGE. Records of tenants on different nodes merge in the
order of those nodes' clocks. The store still connects with a single-node client
(``redis.asyncio.Redis``), which does not follow MOVED/ASK redirects: it runs against
one Redis or a cluster whose slots are all on one node; a cluster of several nodes also
needs a cluster client.
"""

from __future__ import annotations

import re
from typing import Literal

_CHECK = re.compile(
    r"rate:(?P<rate>.+):(?:requests|tokens)"
    r"|conc:(?P<conc>.+)"
    r"|budget:(?P<budget>.+):(?:tokens|usd):[dm]:[^:]+",
    re.DOTALL,
)

Owner = tuple[Literal["tenant", "key", "other"], str]


def tag(tenant: str) -> str:
    """The hash tag of a tenant (module docstring): distinct tenants, distinct tags."""
    return "{" + (tenant.replace("%", "%25").replace("}", "%7D") or "%") + "}"


def scope_tenant(scope: str) -> str | None:
    """The tenant a scope names: ``tenant:<T>``, ``team:<T>/<name>``, ``user:<T>/<name>``."""
    level, sep, rest = scope.partition(":")
    if not sep:
        return None
    if level == "tenant":
        return rest
    if level in ("team", "user") and "/" in rest:
        return rest.partition("/")[0]
    return None


def check_owner(check_key: str) -> Owner:
    """Whose slot a check key goes to: ``("tenant", T)``, ``("key", id)`` (the key
    record's tenant, looked up) or ``("other", check_key)``."""
    m = _CHECK.fullmatch(check_key)
    scope = next((g for g in m.groups() if g is not None), None) if m else None
    if scope is not None:
        tenant = scope_tenant(scope)
        if tenant is not None:
            return ("tenant", tenant)
        if scope.startswith("key:"):
            return ("key", scope[len("key:") :])
    return ("other", check_key)
