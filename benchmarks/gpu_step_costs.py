"""Engine step costs of a Llama-3-8B-shaped decoder on a GPU: the calibration of the
simulated engine's GPU profile (``benchmarks.pd_disagg --setting h200``).

    python3 benchmarks/gpu_step_costs.py [--out FILE] [--tiny]

Runs with nothing but PyTorch (the device machine's own; no vLLM, no weights from a hub):
random bf16 weights of Llama-3-8B's shape (32 layers, hidden 4096, 32 query and 8 KV
heads of 128, SwiGLU 14336, vocabulary 128256), RMSNorm, fused QKV, scaled-dot-product
attention, logits of each sequence's last token. Rotary embeddings and the KV-cache
writes are left out (element-wise, a few percent of a step).

- **Prefill**: one sequence of T tokens, causal, T in ``PREFILL_T``, captured in a CUDA
  graph like the decode step: launched eagerly, a step cost ~25 ms at any T up to 512 on
  the device machine (its kernel launches are slow), which vLLM's piecewise CUDA graphs
  do not pay.
- **Decode**: B sequences of one new token over an L-token KV cache each, the whole step
  captured in one CUDA graph and replayed (vLLM's GPU engine captures decode steps the
  same way), B in ``DECODE_B``, L in ``CONTEXTS``.

Each point is the median of ``REPS`` timed runs after warm-ups (CUDA events). Fits by
least squares: prefill step = base + per_token × T; decode step = base + per_seq × B at
each L (the simulated engine's timing rule, app/engine/simulated.py). ``--tiny``: a
two-layer toy of the same code on the CPU, to check the script, not to calibrate.
Writes a JSON document (stdout, or ``--out``); ``--report JSON`` turns a document into
its Markdown page and plot beside it (here, where matplotlib is).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

PREFILL_T = (128, 256, 512, 1024, 1500, 2048, 4096)
DECODE_B = (1, 8, 32, 64, 128, 256)
CONTEXTS = (384, 1600)
REPS = 7


@dataclass(frozen=True)
class Shape:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 14336
    vocab: int = 128256

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer, bf16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


TINY = Shape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=1024)


class Model:
    def __init__(self, s: Shape, device: str, dtype: torch.dtype) -> None:
        self.s = s

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=device, dtype=dtype) * 0.02

        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.layers = [
            {
                "norm1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": w(s.hidden, q + 2 * kv),
                "o": w(q, s.hidden),
                "norm2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": w(s.hidden, 2 * s.ffn),
                "down": w(s.ffn, s.hidden),
            }
            for _ in range(s.layers)
        ]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.hidden, s.vocab)

    def _mlp(self, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        gate, up = (_rms(x, p["norm2"]) @ p["gate_up"]).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ p["down"]

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """One sequence, ``x``: (T, hidden); logits of its last token."""
        s, t = self.s, x.shape[0]
        q_n, kv_n = s.heads * s.head_dim, s.kv_heads * s.head_dim
        for p in self.layers:
            qkv = _rms(x, p["norm1"]) @ p["qkv"]
            # (1, heads, T, head_dim): four dimensions, so the fused (flash) kernels apply
            q = qkv[:, :q_n].view(1, t, s.heads, s.head_dim).transpose(1, 2)
            k = qkv[:, q_n : q_n + kv_n].view(1, t, s.kv_heads, s.head_dim).transpose(1, 2)
            v = qkv[:, q_n + kv_n :].view(1, t, s.kv_heads, s.head_dim).transpose(1, 2)
            group = s.heads // s.kv_heads  # GQA: each KV head serves `group` query heads
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(t, q_n) @ p["o"]
            x = self._mlp(x, p)
        return _rms(x[-1:], self.norm) @ self.lm_head

    def decode(self, x: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """B sequences, one new token each, ``x``: (B, hidden); ``kv``: per layer the
        caches (B, kv_heads, L, head_dim). The query heads of one KV head are that
        head's queries (GQA without copying the cache)."""
        s, b = self.s, x.shape[0]
        q_n, group = s.heads * s.head_dim, s.heads // s.kv_heads
        for p, (k_cache, v_cache) in zip(self.layers, kv, strict=True):
            qkv = _rms(x, p["norm1"]) @ p["qkv"]
            q = qkv[:, :q_n].view(b, s.kv_heads, group, s.head_dim)
            a = F.scaled_dot_product_attention(q, k_cache, v_cache)
            x = x + a.reshape(b, q_n) @ p["o"]
            x = self._mlp(x, p)
        return _rms(x, self.norm) @ self.lm_head


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + 1e-5)).to(x.dtype) * weight


def _graphed(fn: Callable[[], Any], cuda: bool) -> Callable[[], Any]:
    """``fn`` captured in a CUDA graph (its replay), or ``fn`` itself on the CPU."""
    if not cuda:
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _time(fn: Callable[[], Any], cuda: bool, reps: int = REPS, warm: int = 2) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after ``warm`` runs."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``: (a, b)."""
    n, mx, my = len(xs), statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if n > 1 else 0.0
    return my - b * mx, b


def measure(s: Shape, device: str, prefill_t: tuple[int, ...], decode_b: tuple[int, ...],
            contexts: tuple[int, ...]) -> dict[str, Any]:  # fmt: skip
    cuda = device == "cuda"
    dtype = torch.bfloat16
    torch.manual_seed(0)
    model = Model(s, device, dtype)
    out: dict[str, Any] = {"shape": asdict(s), "kv_bytes_per_token": s.kv_bytes_per_token}
    prefill = []
    with torch.inference_mode():
        for t in prefill_t:
            x = torch.randn(t, s.hidden, device=device, dtype=dtype)
            sec = _time(_graphed(lambda x=x: model.prefill(x), cuda), cuda)
            prefill.append({"tokens": t, "seconds": sec})
            print(f"prefill T={t}: {sec * 1000:.2f} ms", flush=True)
    base, per_token = fit([p["tokens"] for p in prefill], [p["seconds"] for p in prefill])
    out["prefill"] = {"points": prefill, "base_s": base, "s_per_token": per_token}
    out["decode"] = {}
    for ctx in contexts:
        points = []
        for b in decode_b:
            with torch.inference_mode():
                kv = [
                    (torch.randn(b, s.kv_heads, ctx, s.head_dim, device=device, dtype=dtype),
                     torch.randn(b, s.kv_heads, ctx, s.head_dim, device=device, dtype=dtype))
                    for _ in range(s.layers)
                ]  # fmt: skip
                x = torch.randn(b, s.hidden, device=device, dtype=dtype)
                step = _graphed(lambda x=x, kv=kv: model.decode(x, kv), cuda)
                sec = _time(step, cuda, reps=REPS * 3)
            points.append({"batch": b, "seconds": sec})
            print(f"decode L={ctx} B={b}: {sec * 1000:.2f} ms", flush=True)
            del kv, x, step
            if cuda:
                torch.cuda.empty_cache()
        base, per_seq = fit([p["batch"] for p in points], [p["seconds"] for p in points])
        out["decode"][str(ctx)] = {"points": points, "base_s": base, "s_per_seq": per_seq}
    return out


def report(path: Path) -> Path:
    """``path``'s Markdown page and plot (same stem)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(path.read_text())
    pre, dec = doc["prefill"], doc["decode"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    ts = [p["tokens"] for p in pre["points"]]
    a.plot(ts, [1000 * p["seconds"] for p in pre["points"]], "o-", label="measured (graphed)")
    a.plot(ts, [1000 * (pre["base_s"] + pre["s_per_token"] * t) for t in ts], "--", label="fit")
    if "eager_prefill" in doc:
        pts = doc["eager_prefill"]["points"]
        a.plot([p["tokens"] for p in pts], [1000 * p["seconds"] for p in pts], "x:",
               label="launched eagerly")  # fmt: skip
    a.set(title="prefill step, one sequence", xlabel="prompt tokens", ylabel="ms")
    a.legend()
    for ctx, d in dec.items():
        bs = [p["batch"] for p in d["points"]]
        b.plot(bs, [1000 * p["seconds"] for p in d["points"]], "o-", label=f"context {ctx}")
        b.plot(bs, [1000 * (d["base_s"] + d["s_per_seq"] * x) for x in bs], "--",
               label=f"fit, context {ctx}")  # fmt: skip
    b.set(title="decode step (CUDA graph)", xlabel="sequences in the batch", ylabel="ms")
    b.legend()
    fig.suptitle(f"Step costs of a Llama-3-8B-shaped model, bf16, {doc.get('gpu', 'CPU toy')}")
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=110)
    lines = [
        f"# Engine step costs on {doc.get('gpu', 'the CPU (toy)')} — {doc.get('date', '')}",
        "",
        f"`{doc.get('command', 'python3 benchmarks/gpu_step_costs.py')}`: random bf16 "
        "weights of Llama-3-8B's shape, plain PyTorch "
        f"{doc['torch']} (no vLLM can be installed on the device machine), each step "
        "captured in a CUDA graph; median of repeated runs. This calibrates the simulated "
        "engine's `h200` setting (`benchmarks.pd_disagg --setting h200`); it is not a "
        "vLLM measurement (vLLM adds its scheduler, paged attention and sampling).",
        "",
        f"Fits: prefill {1000 * pre['base_s']:.2f} ms + {1e6 * pre['s_per_token']:.1f} µs "
        "a token; decode "
        + "; ".join(f"{1000 * d['base_s']:.2f} ms + {1e6 * d['s_per_seq']:.0f} µs a sequence "
                    f"at a {ctx}-token context" for ctx, d in dec.items())
        + f". KV per token: {doc['kv_bytes_per_token']} bytes.",
        "",
        "| prefill tokens | ms |",
        "|---|---|",
        *[f"| {p['tokens']} | {1000 * p['seconds']:.2f} |" for p in pre["points"]],
        "",
        "| context | batch | decode step ms |",
        "|---|---|---|",
        *[f"| {ctx} | {p['batch']} | {1000 * p['seconds']:.2f} |"
          for ctx, d in dec.items() for p in d["points"]],
        "",
        f"![step costs]({png.name})",
        "",
        "## Environment",
        "",
        "```json",
        json.dumps({k: doc[k] for k in ("gpu", "torch", "python", "nvidia_smi", "git_commit")
                    if k in doc}, indent=1),
        "```",
        "",
    ]  # fmt: skip
    md = path.with_suffix(".md")
    md.write_text("\n".join(lines))
    return md


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--tiny", action="store_true", help="a toy on the CPU (checks the code)")
    parser.add_argument("--report", type=Path, help="write the page and plot of a document")
    args = parser.parse_args()
    if args.report:
        print(f"wrote {report(args.report)}")
        return
    if args.tiny:
        doc = measure(TINY, "cpu", (16, 64, 128), (1, 4, 8), (32,))
    else:
        assert torch.cuda.is_available(), "needs a CUDA GPU (or --tiny)"
        doc = measure(Shape(), "cuda", PREFILL_T, DECODE_B, CONTEXTS)
        doc["gpu"] = torch.cuda.get_device_name(0)
    doc.update(torch=torch.__version__, python=platform.python_version(), tiny=args.tiny)
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
