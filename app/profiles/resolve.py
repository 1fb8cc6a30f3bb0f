"""A model's ``profile:`` resolved into its own fields (rule in ``app.profiles.catalog``).

    profile: interactive                      # the catalogue's bundle
    profile: {name: interactive, slo: {ttft_p95_ms: 800}}
    profile: {name: throughput, file: profiles/throughput-cpu.yaml}   # `profile tune`'s

A relative ``file`` is read from the working directory, else from this project's own
root (``profiles/*.yaml`` ship there: the values tuned on the CPU it was developed on),
so a config referencing a shipped profile works wherever the process starts.

Order, lowest first: the catalogue's bundle, the tuned file's values, the reference's
``slo``, the model's own fields. Switchyard's replica router is on for a profiled pool
(with the profile's scorer weights) and for any model with more than one replica (with
the default weights); ``routing: off`` keeps it off (Ray Serve's power of two choices);
a ``routing`` block without ``scorers`` gets the profile's. On a GPU the bundle's
``kv_cache_memory_bytes`` (a CPU budget) is left out: vLLM sizes the cache from
``gpu_memory_utilization``. The profile's autoscaling target fills an
``autoscaling_config`` that does not set one, and its P/D threshold a
``disaggregation`` block that does not set one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, PrivateAttr, model_validator

from app.profiles.catalog import CATALOGUE, Bundle, ProfileName, Slo
from app.schema import StrictFrozen

# Bundle fields that are model fields of the same name.
FLAT_KNOBS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "enable_prefix_caching",
    "max_model_len",
    "kv_cache_memory_bytes",
    "max_ongoing_requests",
    "max_queued_requests",
    "backpressure",
)


class ProfileRef(StrictFrozen):
    """A model's ``profile:`` (a name, or a name with a tuned file and SLO overrides)."""

    name: ProfileName
    file: str | None = Field(
        default=None, description="A profile file `switchyard profile tune` wrote."
    )
    slo: Slo | None = Field(default=None, description="Overrides the bundle's SLO fields.")
    _bundle: Bundle | None = PrivateAttr(default=None)  # resolved once (the file read once)

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    def bundle(self) -> Bundle:
        """The catalogue's bundle under the tuned file's values and this ``slo``."""
        if self._bundle is None:
            self._bundle = self._resolve()
        return self._bundle

    def _resolve(self) -> Bundle:
        merged = CATALOGUE[self.name].model_dump(exclude_none=True)
        if self.file is not None:
            tuned = load_bundle(profile_path(self.file))
            if tuned.profile != self.name:
                raise ValueError(
                    f"profile.file {self.file!r} is a {tuned.profile!r} profile, not {self.name!r}"
                )
            merged.update(tuned.model_dump(exclude_unset=True, exclude_none=True))
        if self.slo is not None:
            merged["slo"] = {**merged.get("slo", {}), **self.slo.model_dump(exclude_none=True)}
        return Bundle.model_validate(merged)


PROJECT_ROOT = Path(__file__).resolve().parents[2]


def profile_path(file: str) -> Path:
    """Where a ``profile.file`` is read (module docstring): as given if absolute or
    present, else under the project's root if present there, else as given."""
    path = Path(file).expanduser()
    if path.is_absolute() or path.is_file():
        return path
    shipped = PROJECT_ROOT / path
    return shipped if shipped.is_file() else path


def load_bundle(path: Path) -> Bundle:
    """A profile file (YAML); errors name the file."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"profile file {str(path)!r} cannot be read: {exc.strerror}") from None
    try:
        return Bundle.model_validate(data)
    except ValueError as exc:
        raise ValueError(f"profile file {str(path)!r}: {exc}") from None


def apply_profile(data: dict[str, Any]) -> dict[str, Any]:
    """The model's raw fields with its profile's knobs filled in (module docstring);
    a model without ``profile`` unchanged. ``profile`` is left as a ``ProfileRef``."""
    raw = data.get("profile")
    if raw is None:
        if data.get("routing") == "off":
            return dict(data, routing=None)
        if data.get("routing") is None and _replicas(data) > 1:
            return dict(data, routing={})  # Switchyard's replica router, default weights
        return data
    ref = raw if isinstance(raw, ProfileRef) else ProfileRef.model_validate(raw)
    bundle = ref.bundle()
    out = dict(data, profile=ref)
    on_gpu = str(data.get("accelerator", "cpu")).lower() != "cpu"
    kwargs = data.get("engine_kwargs")
    given = set(kwargs) if isinstance(kwargs, dict) else set()  # the model's own, there
    for name in FLAT_KNOBS:
        if name == "kv_cache_memory_bytes" and on_gpu:
            continue  # on a GPU vLLM sizes the cache from gpu_memory_utilization
        value = getattr(bundle, name)
        if out.get(name) is None and name not in given and value is not None:
            out[name] = value.model_dump() if isinstance(value, BaseModel) else value
    routing = out.get("routing")
    if routing == "off":
        out["routing"] = None
    elif bundle.routing_scorers is not None:
        if routing is None:
            out["routing"] = {"scorers": dict(bundle.routing_scorers)}
        elif isinstance(routing, dict) and "scorers" not in routing:
            out["routing"] = {**routing, "scorers": dict(bundle.routing_scorers)}
    scaling = out.get("autoscaling_config")
    if isinstance(scaling, dict) and bundle.target_ongoing_requests is not None:
        out["autoscaling_config"] = {
            "target_ongoing_requests": bundle.target_ongoing_requests,
            **scaling,
        }
    pd = out.get("disaggregation")
    if isinstance(pd, dict) and bundle.pd_min_uncached_tokens is not None:
        out["disaggregation"] = {"min_uncached_tokens": bundle.pd_min_uncached_tokens, **pd}
    return out


def _replicas(data: dict[str, Any]) -> int:
    """The most replicas a model's raw fields ask for (fixed or autoscaled)."""
    scaling = data.get("autoscaling_config")
    if isinstance(scaling, dict):
        return int(scaling.get("max_replicas", 1))
    return int(data.get("num_replicas", 1) or 1)
