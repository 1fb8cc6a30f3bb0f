"""``build_random_lora``: PEFT files shaped after the base's own weights, for the modules
asked (and only those), deterministic per seed, refused when the base lacks them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from app.adapters.peft import base_weight_names, check_adapter, inspect_adapter
from app.models.lora import build_random_lora


def shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path / "adapter_model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118


@pytest.mark.parametrize(("rank", "targets"), [(8, ("q_proj", "v_proj")), (4, ("o_proj",))])
def test_shapes_follow_the_base(
    tiny_model_dir: Path, tmp_path: Path, rank: int, targets: tuple[str, ...]
) -> None:
    out = build_random_lora(tmp_path / "a", tiny_model_dir, rank=rank, targets=targets)
    got = shapes(out)
    base = {n for n in base_weight_names(tiny_model_dir) if n.rsplit(".", 2)[-2] in targets}
    assert len(got) == 2 * len(base) > 0
    for name in base:
        module = name.removesuffix(".weight")
        a, b = (
            got[f"base_model.model.{module}.lora_A.weight"],
            got[f"base_model.model.{module}.lora_B.weight"],
        )
        assert a[0] == rank and b[1] == rank
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (
        rank,
        2 * rank,
        list(targets),
    )
    check_adapter(inspect_adapter(out), 16, base_weight_names(tiny_model_dir))


def test_same_seed_same_files_other_seed_other(tiny_model_dir: Path, tmp_path: Path) -> None:
    read = lambda p: (p / "adapter_model.safetensors").read_bytes()  # noqa: E731
    one = read(build_random_lora(tmp_path / "1", tiny_model_dir, seed=3))
    assert one == read(build_random_lora(tmp_path / "2", tiny_model_dir, seed=3))
    assert one != read(build_random_lora(tmp_path / "3", tiny_model_dir, seed=4))


def test_a_base_without_the_modules_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no weights of the modules"):
        build_random_lora(tmp_path / "x", tiny_model_dir, targets=("w_pack",))
    assert not (tmp_path / "x").exists()
