"""benchmarks.gpu_step_costs: the step-cost probe behind the simulated engine's H200
setting. Its decode attention (the query heads of one KV head read that head's cache
without copying it) computes what grouped-query attention computes; the fits recover a
line; the toy run measures every point it is asked for; and the H200 setting of
benchmarks.pd_disagg carries the fits of the committed measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from benchmarks import gpu_step_costs as probe
from benchmarks import pd_disagg

MEASURED = Path(__file__).parents[2] / "docs" / "benchmarks" / "gpu-step-costs-2026-12-04.json"


def _reference_decode(
    m: probe.Model, x: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """The same step with every KV head copied to each of its query heads."""
    s, b = m.s, x.shape[0]
    q_n, group = s.heads * s.head_dim, s.heads // s.kv_heads
    for p, (k, v) in zip(m.layers, kv, strict=True):
        qkv = probe._rms(x, p["norm1"]) @ p["qkv"]
        q = qkv[:, :q_n].view(b, s.heads, 1, s.head_dim)
        k_all, v_all = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        a = F.scaled_dot_product_attention(q, k_all, v_all)
        x = x + a.reshape(b, q_n) @ p["o"]
        x = m._mlp(x, p)
    return probe._rms(x, m.norm) @ m.lm_head


@pytest.mark.parametrize("batch,context", [(1, 5), (3, 17), (4, 64)])
def test_decode_is_grouped_query_attention(batch: int, context: int) -> None:
    torch.manual_seed(1)
    s = probe.TINY
    m = probe.Model(s, "cpu", torch.float32)
    x = torch.randn(batch, s.hidden)
    kv = [
        (torch.randn(batch, s.kv_heads, context, s.head_dim),
         torch.randn(batch, s.kv_heads, context, s.head_dim))
        for _ in range(s.layers)
    ]  # fmt: skip
    got = m.decode(x, kv)
    assert got.shape == (batch, s.vocab)
    torch.testing.assert_close(got, _reference_decode(m, x, kv), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "xs,a,b",
    [([1, 2, 3], 0.5, 2.0), ([128, 512, 4096], 0.0019, 2.87e-5), ([1, 256], 0.006, 7e-5)],
)
def test_fit_recovers_a_line(xs: list[float], a: float, b: float) -> None:
    got_a, got_b = probe.fit(xs, [a + b * x for x in xs])
    assert got_a == pytest.approx(a, rel=1e-9, abs=1e-12)
    assert got_b == pytest.approx(b, rel=1e-9)


def test_the_toy_run_measures_every_point() -> None:
    doc = probe.measure(probe.TINY, "cpu", (8, 16), (1, 2, 4), (8, 16))
    assert [p["tokens"] for p in doc["prefill"]["points"]] == [8, 16]
    assert set(doc["decode"]) == {"8", "16"}
    for d in doc["decode"].values():
        assert [p["batch"] for p in d["points"]] == [1, 2, 4]
        assert all(p["seconds"] > 0 for p in d["points"])
    assert doc["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 2


def test_the_h200_setting_carries_the_measured_fits() -> None:
    doc = json.loads(MEASURED.read_text())
    profiles = pd_disagg.SETTINGS["h200"].profiles
    contexts = {"long": "1600", "balanced": "384"}
    for kind, p in profiles.items():
        assert p.prefill_s_per_token == pytest.approx(doc["prefill"]["s_per_token"], rel=0.01)
        assert p.prefill_base_s == pytest.approx(doc["prefill"]["base_s"], rel=0.02)
        d = doc["decode"][contexts[kind]]
        assert p.decode_base_s == pytest.approx(d["base_s"], rel=0.02)
        assert p.decode_s_per_seq == pytest.approx(d["s_per_seq"], rel=0.02)
        assert p.kv_bytes_per_token == doc["kv_bytes_per_token"]
