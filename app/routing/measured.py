# Measured quality in the routes file.
#
# Rule. A model's ``profile.quality`` may be ``{measured: <path>}``: the JSON report of
# ``switchyard eval`` for that model. When the routes file is read, the path (relative
# to the routes file; to the working directory for routes given as Ray Serve
# user_config) is opened and its overall score, the sets it graded (each with its
# version and digest), its date and its model are copied in; fields already given win,
# so a routes spec can carry the values without the file. A missing or unreadable report
# is an error naming the field. ``stale`` says why a measured score may no longer hold:
# the eval sets changed since (another version or digest than the shipped sets), the
# report scored another model than the one it is attached to, or the model's files
# changed after the report's date.
#
# Parameters: none.
"""Resolve ``quality: {measured: …}`` from eval reports, and say when one is stale."""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from app.schema import StrictFrozen

if TYPE_CHECKING:
    from app.routing.spec import RoutesSpec


class MeasuredQuality(StrictFrozen):
    """A quality measured by ``switchyard eval``: the report it came from and what the
    report says (filled from the report's JSON when the routes file gives only
    ``measured``)."""

    measured: str  # the report's JSON file
    score: float = Field(ge=0, le=1)  # its overall score
    eval: list[str] = Field(default_factory=list)  # the sets it graded, with versions
    date: str = ""  # when it ran (ISO)
    model: str | None = None  # the model it scored


class MeasuredQualityError(ValueError):
    pass


def resolve(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """A copy of ``data`` (a routes mapping) with every ``{measured: path}`` quality filled
    from its report; raises MeasuredQualityError naming the field."""
    data = copy.deepcopy(data)
    models = data.get("models")
    if not isinstance(models, dict):
        return data
    for name, model in models.items():
        profile = model.get("profile") if isinstance(model, dict) else None
        if not isinstance(profile, dict):
            continue
        q = profile.get("quality")
        if not isinstance(q, dict) or "measured" not in q or "score" in q:
            continue
        where = f"models.{name}.profile.quality"
        path = Path(str(q["measured"]))
        path = path if path.is_absolute() else base / path
        try:
            report = json.loads(path.read_text())
            meta, overall = report["meta"], report["overall"]
            filled = {
                "score": overall["score"],
                "eval": list(meta.get("sets", [])),
                "date": str(meta.get("date", "")),
                "model": meta.get("model"),
            }
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise MeasuredQualityError(
                f"{where}: cannot read the eval report {q['measured']}: {exc}"
            ) from None
        profile["quality"] = {**filled, **q}
    return data


def stale(
    spec: RoutesSpec,
    shipped: Sequence[str],
    model_mtimes: Mapping[str, float] | None = None,
) -> list[str]:
    """One line per measured quality that may no longer hold (module comment):
    ``shipped`` are the current sets' labels, ``model_mtimes`` the newest file time of
    each served model's weights where known (by served model id, seconds since the
    epoch)."""
    out = []
    for name, model in spec.models.items():
        q = model.profile.quality
        if not isinstance(q, MeasuredQuality):
            continue
        where = f"models.{name}.profile.quality ({q.measured})"
        changed = [label for label in q.eval if label not in shipped]
        if changed:
            out.append(f"{where}: the eval sets changed since ({', '.join(changed)})")
        served = getattr(spec.pools.get(model.pool), "model", None) or name
        if q.model is not None and q.model not in (name, served):
            out.append(f"{where}: the report scored {q.model}, not {name}")
        mtime = (model_mtimes or {}).get(served)
        when = _epoch(q.date)
        if mtime is not None and when is not None and mtime > when:
            out.append(f"{where}: the model's files changed after the report ({q.date})")
    return out


def _epoch(iso: str) -> float | None:
    try:
        parsed = dt.datetime.fromisoformat(iso)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()
