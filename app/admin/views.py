"""Helpers shared by the ``/admin`` HTTP API and the ``switchyard`` CLI: what a key
listing may show, and how operators write points in time."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import Any

from app.state.records import KeyRecord

_RELATIVE = re.compile(r"(?P<amount>\d+(?:\.\d+)?)\s*(?P<unit>[smhdw])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}

PUBLIC_KEY_FIELDS = (
    "id",
    "prefix",
    "tenant",
    "team",
    "user",
    "name",
    "limits",
    "created_at",
    "expires_at",
    "revoked_at",
    "last_used_at",
)


def public_key_view(record: KeyRecord) -> dict[str, Any]:
    """A key record as listings show it: never the salt, the digest or the secret."""
    return record.model_dump(include=set(PUBLIC_KEY_FIELDS))


def parse_time(value: str, *, now: float | None = None, future: bool = False) -> float:
    """A point in time as UTC epoch seconds, from

    * an ISO 8601 date or date-time (``2026-01-31``, ``2026-01-31T12:00:00+02:00``;
      without a timezone it is UTC),
    * a plain number (epoch seconds), or
    * a duration ``<n>s|m|h|d|w`` (``30m``, ``24h``, ``7d``): that long before ``now``
      (after it with ``future=True``, for expiry times).

    Raises ``ValueError`` with a readable message otherwise.
    """
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(number):
            raise ValueError(f"cannot read {value!r} as a time")
        return number
    relative = _RELATIVE.fullmatch(text)
    if relative is not None:
        span = float(relative["amount"]) * _UNIT_S[relative["unit"]]
        base = time.time() if now is None else now
        return base + span if future else base - span
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"cannot read {value!r} as a time: use ISO 8601 (2026-01-31T12:00:00Z), "
            "epoch seconds, or a duration such as 30m, 24h or 7d"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def format_time(epoch: float | None) -> str:
    """Epoch seconds as ``YYYY-MM-DDTHH:MM:SSZ`` (``-`` for none), for tables."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
