"""Which limits apply to a caller, as store checks.

Rule: every level that has limits applies — key, user, team, tenant — and a request
must pass all of them. Per level:
- ``rpm`` → a request bucket, ``tpm`` → a token bucket (both per minute);
- ``max_concurrent`` → a concurrency check;
- ``daily_*``/``monthly_*`` → a budget counter for the current UTC day/month, kept by
  the store until two days/32 days after the period starts. Token budgets hold back
  ``margin_tokens`` (the seed's ``reserve_tokens``).
Keys name the level (``key:<id>``, ``user:<tenant>/<user>``, ``team:<tenant>/<team>``,
``tenant:<tenant>``), never the secret.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from app.request import Caller
from app.state.protocol import BudgetCheck, ConcurrencyCheck, RateCheck
from app.state.records import Limits, Principal

DAY_KEEP_S = 2 * 86400.0
MONTH_KEEP_S = 32 * 86400.0


@dataclass(frozen=True)
class Plan:
    rates: tuple[RateCheck, ...] = ()
    concurrency: tuple[ConcurrencyCheck, ...] = ()
    budgets: tuple[BudgetCheck, ...] = ()

    @property
    def needs_prompt_tokens(self) -> bool:
        return bool(self.budgets) or any(r.kind == "tokens" for r in self.rates)

    @property
    def empty(self) -> bool:
        return not (self.rates or self.concurrency or self.budgets)


def levels(caller: Caller, principal: Principal) -> list[tuple[str, Limits]]:
    out: list[tuple[str, Limits]] = []
    if principal.key is not None:
        out.append((f"key:{principal.key.id}", principal.key.limits))
    if principal.user is not None:
        out.append((principal.user.scope, principal.user.limits))
    if principal.team is not None:
        out.append((principal.team.scope, principal.team.limits))
    if principal.tenant is not None:
        out.append((f"tenant:{caller.tenant}", principal.tenant.limits))
    return [(scope, lim) for scope, lim in out if not lim.is_empty()]


def _period_starts(now: float) -> tuple[dt.datetime, dt.datetime]:
    day = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day.replace(day=1)


def build_plan(scoped: Iterable[tuple[str, Limits]], now: float, margin_tokens: int = 0) -> Plan:
    rates: list[RateCheck] = []
    conc: list[ConcurrencyCheck] = []
    budgets: list[BudgetCheck] = []
    day, month = _period_starts(now)
    d_key, d_end = f"d:{day:%Y-%m-%d}", day.timestamp() + DAY_KEEP_S
    m_key, m_end = f"m:{month:%Y-%m}", month.timestamp() + MONTH_KEEP_S
    for scope, lim in scoped:
        if lim.rpm is not None:
            rates.append(RateCheck(f"rate:{scope}:requests", "requests", lim.rpm))
        if lim.tpm is not None:
            rates.append(RateCheck(f"rate:{scope}:tokens", "tokens", lim.tpm))
        if lim.max_concurrent is not None:
            conc.append(ConcurrencyCheck(f"conc:{scope}", lim.max_concurrent))
        for value, unit, period, end in (
            (lim.daily_tokens, "tokens", d_key, d_end),
            (lim.monthly_tokens, "tokens", m_key, m_end),
            (lim.daily_usd, "usd", d_key, d_end),
            (lim.monthly_usd, "usd", m_key, m_end),
        ):
            if value is None:
                continue
            limit = max(0.0, float(value) - margin_tokens) if unit == "tokens" else float(value)
            budgets.append(
                BudgetCheck(f"budget:{scope}:{unit}:{period}", unit, limit, end)  # type: ignore[arg-type]
            )
    return Plan(tuple(rates), tuple(conc), tuple(budgets))
