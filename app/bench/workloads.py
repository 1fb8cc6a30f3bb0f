"""Workloads: what the load generator sends, deterministic in (seed, request index).

Every generation body is ``{"model", "messages"}`` (chat; one user message unless
stated) or ``{"model", "prompt"}`` (completions), plus ``max_tokens`` = the output
length, ``temperature`` (default 0.0) and ``ignore_eos`` (default True, so output
lengths are exact); ``stream``/``stream_options`` are the client's. Request ``i`` draws
from its own RNG seeded by (workload, seed, i), so any request can be built alone and
in any order. Prompt texts come from :class:`~app.bench.prompts.PromptFactory`, unique
per request unless a workload shares a prefix on purpose. ``input_tokens`` is the
nominal prompt length: raw text, without the chat template.

* ``fixed``: every request ``input_tokens`` in, ``output_tokens`` out (kind ``fixed``).
* ``mix`` (seed 003 §8.3): ``short`` 50 % (input 64–256, output 32–128), ``chat`` 30 %
  (256–1,024 / 128–512), ``long_doc`` 15 % (4,096–16,384 / 128–512), ``long_gen`` 5 %
  (256–1,024 / 1,024–4,096); class drawn with the weights, lengths uniform integers in
  the inclusive ranges. Context cap, applied to every draw: the output is capped first,
  to ``max_model_len // 2``; then the input, to ``max_model_len - output -
  template_margin`` (the margin covers the chat template and special tokens). A request
  is "capped" when either length changed; ``describe(n)`` counts them per class.
* ``shared_prefix``: ``tenants`` tenants ``tenant-1..tenant-T``, each with its own
  system prompt of ``prefix_tokens`` tokens (fixed per seed and tenant), then a unique
  question of ``suffix_tokens`` tokens; the tenant is drawn uniformly or Zipf (rank k
  weighs k^-s). Completions send one prompt: the tenant prefix, a blank line, the
  question (``prefix_tokens + suffix_tokens`` tokens in all). With ``tenant_keys`` a
  request carries ``Authorization: Bearer <its tenant's key>``.

Two more kinds follow the same body rules: ``trace`` (replay of a JSONL file, see
:mod:`app.bench.trace`) and ``agentic`` (chained sessions, see :mod:`app.bench.agentic`).
Specs and :func:`~app.bench.specs.build_workload`, which makes any of them, are in
:mod:`app.bench.specs`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, Protocol

from app.bench.prompts import PromptFactory
from app.bench.records import RequestSpec

GenEndpoint = Literal["chat", "completions"]
Prompt = str | list[dict[str, Any]]
Body = dict[str, Any]
MIX_CLASSES: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "short": ((64, 256), (32, 128)),
    "chat": ((256, 1024), (128, 512)),
    "long_doc": ((4096, 16384), (128, 512)),
    "long_gen": ((256, 1024), (1024, 4096)),
}
"""Class -> ((input min, max), (output min, max)), inclusive (seed 003 §8.3)."""
MIX_WEIGHTS: dict[str, float] = {"short": 0.50, "chat": 0.30, "long_doc": 0.15, "long_gen": 0.05}
CAP_RULE = (
    "output = min(output, max_model_len // 2); "
    "input = min(input, max_model_len - output - template_margin)"
)
DATASET = "synthetic: random words of a fixed English list after a unique id"


class Workload(Protocol):
    name: str

    def request(self, index: int) -> RequestSpec: ...

    def describe(self) -> dict[str, Any]: ...


def generation_body(
    endpoint: GenEndpoint,
    model: str,
    prompt: Prompt,
    max_tokens: int,
    temperature: float = 0.0,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """A chat or completions body; a ``str`` prompt is one user message for chat."""
    body: dict[str, Any] = {"model": model}
    if endpoint == "chat":
        body["messages"] = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        )
    elif isinstance(prompt, str):
        body["prompt"] = prompt
    else:
        raise ValueError("the completions endpoint takes a prompt string, not messages")
    body.update(max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos)
    return body


class WorkloadBase:
    """Helpers over the fields every workload has; ``_rng(i)`` is request i's own RNG."""

    name = "base"
    model: str
    factory: PromptFactory
    seed: int
    endpoint: GenEndpoint
    temperature: float
    ignore_eos: bool

    def _rng(self, index: int, use: str = "") -> random.Random:
        return random.Random(f"{self.name}{use}:{self.seed}:{index}")

    def _body(self, prompt: Prompt, max_tokens: int, endpoint: GenEndpoint | None = None) -> Body:
        return generation_body(
            endpoint or self.endpoint, self.model, prompt, max_tokens, self.temperature,
            self.ignore_eos,
        )  # fmt: skip

    def _meta(self, dataset: str, **fields: Any) -> dict[str, Any]:
        return {
            "workload": self.name, "dataset": dataset, "endpoint": self.endpoint, **fields,
            "temperature": self.temperature, "ignore_eos": self.ignore_eos, "seed": self.seed,
        }  # fmt: skip


@dataclass
class FixedWorkload(WorkloadBase):
    name = "fixed"
    model: str
    endpoint: GenEndpoint
    input_tokens: int
    output_tokens: int
    factory: PromptFactory
    seed: int
    _: KW_ONLY
    temperature: float = 0.0
    ignore_eos: bool = True

    def request(self, index: int) -> RequestSpec:
        text = self.factory.text(self.input_tokens, self._rng(index))
        body = self._body(text, self.output_tokens)
        return RequestSpec(self.endpoint, body, self.input_tokens, self.output_tokens, "fixed")

    def describe(self) -> dict[str, Any]:
        return self._meta(
            DATASET,
            input_lengths=f"fixed {self.input_tokens}",
            output_lengths=f"fixed {self.output_tokens}",
        )


@dataclass(frozen=True)
class MixDraw:
    """One request of the mix: its class, the lengths drawn and the lengths sent."""

    kind: str
    drawn_input: int
    drawn_output: int
    input_tokens: int
    output_tokens: int

    @property
    def capped(self) -> bool:
        return (self.input_tokens, self.output_tokens) != (self.drawn_input, self.drawn_output)


@dataclass
class MixWorkload(WorkloadBase):
    name = "mix"
    model: str
    factory: PromptFactory
    seed: int
    max_model_len: int
    _: KW_ONLY
    endpoint: GenEndpoint = "chat"
    weights: Mapping[str, float] = field(default_factory=lambda: dict(MIX_WEIGHTS))
    template_margin: int = 64
    temperature: float = 0.0
    ignore_eos: bool = True
    _produced: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if unknown := set(self.weights) - set(MIX_CLASSES):
            raise ValueError(f"unknown mix classes {sorted(unknown)}; known: {list(MIX_CLASSES)}")
        if any(w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise ValueError("mix weights must be non-negative with a positive sum")
        if self.max_model_len - self.max_model_len // 2 - self.template_margin <= 16:
            raise ValueError(f"max_model_len {self.max_model_len} leaves no room for a prompt")
        self.weights = {k: float(self.weights.get(k, 0.0)) for k in MIX_CLASSES}

    def draw(self, index: int) -> MixDraw:
        """The class and lengths of request ``index``, with the context cap applied."""
        rng = self._rng(index)
        (kind,) = rng.choices(list(self.weights), weights=list(self.weights.values()))
        (in_lo, in_hi), (out_lo, out_hi) = MIX_CLASSES[kind]
        drawn_in, drawn_out = rng.randint(in_lo, in_hi), rng.randint(out_lo, out_hi)
        out = min(drawn_out, self.max_model_len // 2)
        inp = min(drawn_in, self.max_model_len - out - self.template_margin)
        return MixDraw(kind, drawn_in, drawn_out, inp, out)

    def request(self, index: int) -> RequestSpec:
        d = self.draw(index)
        text = self.factory.text(d.input_tokens, self._rng(index, "-text"))
        self._produced = max(self._produced, index + 1)
        body = self._body(text, d.output_tokens)
        return RequestSpec(self.endpoint, body, d.input_tokens, d.output_tokens, d.kind)

    def describe(self, n: int | None = None) -> dict[str, Any]:
        """Cap counts are over requests ``0..n-1``; by default up to the highest index
        produced so far."""
        n = self._produced if n is None else n
        draws = [self.draw(i) for i in range(n)]
        classes = {
            kind: {
                "weight": self.weights[kind],
                "input_tokens": f"uniform integer {i_lo}–{i_hi}",
                "output_tokens": f"uniform integer {o_lo}–{o_hi}",
            }
            for kind, ((i_lo, i_hi), (o_lo, o_hi)) in MIX_CLASSES.items()
        }
        cap = {
            "max_model_len": self.max_model_len,
            "template_margin": self.template_margin,
            "rule": CAP_RULE,
            "requests": n,
            "by_kind": dict(Counter(d.kind for d in draws)),
            "capped": dict(Counter(d.kind for d in draws if d.capped)),
        }
        return self._meta(
            DATASET + " (seed 003 §8.3 mix)",
            input_lengths=_by_class(0, self.weights),
            output_lengths=_by_class(1, self.weights),
            classes=classes,
            context_cap=cap,
        )


def _by_class(which: int, weights: Mapping[str, float]) -> str:
    total = sum(weights.values())
    return (
        ", ".join(
            f"{kind} {weights[kind] / total:.0%}: {ranges[which][0]}–{ranges[which][1]}"
            for kind, ranges in MIX_CLASSES.items()
        )
        + " (uniform integers; context cap applied)"
    )


@dataclass
class SharedPrefixWorkload(WorkloadBase):
    name = "shared_prefix"
    model: str
    factory: PromptFactory
    seed: int
    _: KW_ONLY
    tenants: int
    prefix_tokens: int
    suffix_tokens: int
    output_tokens: int
    distribution: Literal["uniform", "zipf"] = "uniform"
    zipf_s: float = 1.0
    tenant_keys: Mapping[str, str] | None = None
    endpoint: GenEndpoint = "chat"
    temperature: float = 0.0
    ignore_eos: bool = True
    _prefixes: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.tenants < 1:
            raise ValueError("tenants must be at least 1")
        self.names = [f"tenant-{k}" for k in range(1, self.tenants + 1)]
        if self.tenant_keys is not None and (missing := set(self.names) - set(self.tenant_keys)):
            raise ValueError(f"tenant_keys lacks {sorted(missing)}")
        zipf = self.distribution == "zipf"
        self.weights = [k**-self.zipf_s if zipf else 1.0 for k in range(1, self.tenants + 1)]

    def prefix(self, tenant: str) -> str:
        """The tenant's system prompt, the same text for every request of the tenant."""
        if tenant not in self._prefixes:
            key = f"{self.name}:{self.seed}:{tenant}"
            self._prefixes[tenant] = self.factory.shared(self.prefix_tokens, key)
        return self._prefixes[tenant]

    def request(self, index: int) -> RequestSpec:
        rng = self._rng(index)
        (tenant,) = rng.choices(self.names, weights=self.weights)
        total = self.prefix_tokens + self.suffix_tokens
        prompt: Prompt
        if self.endpoint == "chat":
            question = self.factory.text(self.suffix_tokens, rng)
            prompt = [
                {"role": "system", "content": self.prefix(tenant)},
                {"role": "user", "content": question},
            ]
        else:
            prompt = self.factory.text(total, rng, prefix=self.prefix(tenant) + "\n\n")
        keys = self.tenant_keys
        headers = {"Authorization": f"Bearer {keys[tenant]}"} if keys else {}
        body = self._body(prompt, self.output_tokens)
        return RequestSpec(
            self.endpoint, body, total, self.output_tokens, "shared_prefix", tenant, headers
        )

    def describe(self) -> dict[str, Any]:
        zipf = self.distribution == "zipf"
        return self._meta(
            DATASET + " (a system prompt per tenant + a unique question)",
            tenants=self.tenants,
            tenant_distribution=f"zipf s={self.zipf_s}" if zipf else "uniform",
            input_lengths=f"fixed {self.prefix_tokens} shared + {self.suffix_tokens} unique",
            output_lengths=f"fixed {self.output_tokens}",
            tenant_keys=self.tenant_keys is not None,
        )
