"""What a profile tune report of record measured, as ``switchyard plan`` needs it
(``app.cost.plan.Curve``).

Rule: a report is a profile tune report when it holds ``config`` (with ``profile``,
``slo``, ``knob``, ``input_tokens``, ``output_tokens`` and ``max_error_rate``),
``hardware`` and ``curve`` (the measured ``app.profiles.tune.Point``\\ s). Each point
keeps its goodput, error rate and p95s, and is *deployable* when the profile's checks
accept its concurrency as ``max_ongoing_requests`` (``app.profiles.tune.is_candidate``:
interactive at most its batch, throughput at least it). Anything else is refused with
a message naming the file and what is missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from app.cost.mix import METRICS, Objective
from app.cost.plan import Curve, MeasuredPoint
from app.profiles.catalog import ProfileName
from app.profiles.tune import Point, is_candidate

_CONFIG_KEYS = ("profile", "slo", "knob", "input_tokens", "output_tokens", "max_error_rate")


def curve_of(data: Any, source: str) -> Curve:
    """The measured curve of one report's JSON (``source``: its name, for messages)."""
    if not isinstance(data, dict) or not isinstance(data.get("curve"), list):
        raise ValueError(f"{source}: not a profile tune report (no `curve`)")
    config = data.get("config")
    config = config if isinstance(config, dict) else {}
    missing = [f"config.{k}" for k in _CONFIG_KEYS if k not in config]
    if not isinstance(data.get("hardware"), str):
        missing.append("hardware")
    if missing:
        raise ValueError(f"{source}: not a profile tune report (missing {', '.join(missing)})")
    try:
        points = [Point.model_validate(p) for p in data["curve"]]
        slo = Objective.model_validate(config["slo"])
    except ValidationError as exc:
        raise ValueError(f"{source}: a malformed curve point or SLO: {exc}") from None
    profile = cast(ProfileName, config["profile"])
    return Curve(
        source=source,
        profile=str(profile),
        hardware=data["hardware"],
        knob=str(config["knob"]),
        input_tokens=int(config["input_tokens"]),
        output_tokens=int(config["output_tokens"]),
        max_error_rate=float(config["max_error_rate"]),
        slo=slo,
        points=tuple(
            MeasuredPoint(
                value=p.value,
                concurrency=p.concurrency,
                goodput=p.goodput,
                error_rate=p.error_rate,
                p95_ms={m: p.p95(m) for m in METRICS},
                deployable=p.requests > 0 and is_candidate(profile, p),
                service_s=None if p.e2e_ms.p50 is None else p.e2e_ms.p50 / 1000,
            )
            for p in points
        ),
    )


def load_reports(paths: list[Path]) -> list[tuple[Curve, dict[str, Any]]]:
    """Each report's curve and provenance (file, profile, hardware, commit, date);
    refused (``ValueError``) naming an unreadable or malformed file."""
    out = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
        curve = curve_of(data, path.name)
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        origin = {
            "source": curve.source,
            "profile": curve.profile,
            "hardware": curve.hardware,
            "slo": curve.slo.model_dump(exclude_none=True),
            "commit": meta.get("git_commit"),
            "date": meta.get("date"),
        }
        out.append((curve, origin))
    return out
