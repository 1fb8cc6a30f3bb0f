"""PEFT adapter checks: what an adapter directory must declare, table-driven."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from app.adapters.peft import (
    AdapterFiles,
    AdapterInvalid,
    base_weight_names,
    check_adapter,
    inspect_adapter,
)
from app.models.tiny import build_tiny_lora


def _edit_config(**change: object) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        config = json.loads((d / "adapter_config.json").read_text())
        config.update(change)
        (d / "adapter_config.json").write_text(json.dumps(config))

    return edit


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda d: (d / "adapter_config.json").unlink(), "no adapter_config.json"),
        (lambda d: (d / "adapter_config.json").write_text("{not json"), "not readable JSON"),
        (_edit_config(peft_type="PREFIX_TUNING"), "peft_type must be LORA"),
        (_edit_config(r=0), "must be a positive integer"),
        (_edit_config(target_modules=[]), "target_modules must name"),
        (lambda d: (d / "adapter_model.safetensors").unlink(), "holds no adapter weights"),
    ],
)
def test_a_spoiled_adapter_is_refused_naming_the_problem(
    tmp_path: Path, spoil: Callable[[Path], None], message: str
) -> None:
    d = build_tiny_lora(tmp_path / "a", seed=1)
    spoil(d)
    with pytest.raises(AdapterInvalid, match=message):
        inspect_adapter(d)


def test_a_good_adapter_declares_its_rank_and_targets(tmp_path: Path) -> None:
    files = inspect_adapter(build_tiny_lora(tmp_path / "a", seed=1, rank=16))
    assert files == AdapterFiles(16, ("q_proj", "v_proj"))
    with pytest.raises(AdapterInvalid, match="not a directory"):
        inspect_adapter(tmp_path / "missing")


def test_rank_and_targets_are_checked_against_the_base(tiny_model_dir: Path) -> None:
    names = base_weight_names(tiny_model_dir)
    assert "model.layers.0.self_attn.q_proj.weight" in names
    check_adapter(AdapterFiles(8, ("q_proj", "v_proj")), 8, names)  # fits: no error
    with pytest.raises(AdapterInvalid, match="exceeds the pool's max_lora_rank 8"):
        check_adapter(AdapterFiles(16, ("q_proj",)), 8, names)
    with pytest.raises(AdapterInvalid, match=r"\['w_gate'\] are not modules"):
        check_adapter(AdapterFiles(8, ("q_proj", "w_gate")), 8, names)
    check_adapter(AdapterFiles(8, ("w_gate",)), 8, None)  # base not on this node: rank only
