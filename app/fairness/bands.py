"""Which band a request waits in and with what share (``app.fairness.queue``).

Rule: the most specific level that sets them wins (key, user, team, tenant; the
order ``app.gateway.plan.levels`` gives): ``priority`` (default ``standard``),
``share`` (default 1.0) and ``raise_priority`` (default false). A request may ask for
another band (``x-switchyard-priority``; batch work, ``service_tier: flex``, asks for
``batch``): a lower one always, a higher one only where its level allows raising.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.request import BANDS
from app.state.records import Limits
from app.state.records import Priority as Band

DEFAULT_BAND: Band = "standard"


def service_class(
    levels: Iterable[Limits], asked: Band | None = None, batch: bool = False
) -> tuple[Band, float]:
    """The band and the share of a request whose levels (most specific first) are
    ``levels``."""
    lims = list(levels)
    band = next((lim.priority for lim in lims if lim.priority is not None), DEFAULT_BAND)
    share = next((lim.share for lim in lims if lim.share is not None), 1.0)
    may_raise = next((lim.raise_priority for lim in lims if lim.raise_priority is not None), False)
    want = asked if asked is not None else ("batch" if batch else None)
    if want is not None and (may_raise or BANDS.index(want) >= BANDS.index(band)):
        band = want
    return band, share
