"""The scheduler loop of one pool: filters → weighted scorers → picker, timed per plugin.

Rule: the candidates are the replicas Ray offers (alive, in this deployment), less the
ejected ones (``app.scheduler.ejection``) while any other remains. Each
scorer of weight w > 0 (``routing.scorers``) gives every candidate a score in [0, 1];
total = Σ w·score ÷ Σ w. When the load is imbalanced (``plugins.load.imbalanced``) only
the load scorer counts. The picker takes the highest total, ties by rendezvous hash of
the request id. ``Decision.scorer`` names what decided: the scorer whose weighted
difference between the winner and the runner-up is largest, ``load:imbalance`` when the
imbalance rule applied, ``tiebreak`` when the totals were equal, ``only`` with one
candidate. The decision carries the winner's matched prefix blocks and its load at
decision time, so a log line reproduces it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.engine.kv_events import KvEvent
from app.scheduler.adapter_placement import AdapterPlacement
from app.scheduler.config import ReplicaRouting
from app.scheduler.ejection import Ejections
from app.scheduler.kv_events import Changes, Translator
from app.scheduler.plugins import PoolContext, Scorer
from app.scheduler.plugins.adapter import AdapterScorer
from app.scheduler.plugins.load import LoadScorer, imbalanced
from app.scheduler.plugins.picker import TIE, pick
from app.scheduler.plugins.prefill import PrefillScorer
from app.scheduler.plugins.prefix import PrefixScorer
from app.scheduler.plugins.session import SessionScorer
from app.scheduler.prefix_index import PrefixIndex
from app.scheduler.session_ring import SessionRing
from app.scheduler.state import LoadBook, RoutedRequest

log = logging.getLogger(__name__)

Scorers = PrefixScorer | LoadScorer | SessionScorer | AdapterScorer | PrefillScorer
SCORER_TYPES: dict[str, type[Scorers]] = {
    "prefix": PrefixScorer,
    "load": LoadScorer,
    "session": SessionScorer,
    "adapter": AdapterScorer,
    "prefill": PrefillScorer,
}


@dataclass(frozen=True)
class Decision:
    replica: str
    ranking: tuple[str, ...]  # winner, runner-up, then the others as offered
    scorer: str
    matched_blocks: int
    prompt_blocks: int
    load: float  # the winner's load before this request was booked
    totals: dict[str, float] = field(default_factory=dict)
    index_blocks: int = 0  # block hashes in the router's index (all replicas)
    timings_ns: dict[str, int] = field(default_factory=dict, compare=False)

    def header(self) -> str:
        """``replica=…; scorer=…; prefix=m/n; load=x`` for the route header and logs."""
        return (
            f"replica={self.replica}; scorer={self.scorer}; "
            f"prefix={self.matched_blocks}/{self.prompt_blocks}; load={self.load:.2f}"
        )


class Scheduler:
    def __init__(self, config: ReplicaRouting) -> None:
        self.config = config
        self.ctx = PoolContext(
            config=config,
            index=PrefixIndex(config.prefix.max_blocks),
            ring=SessionRing(config.session.virtual_nodes, config.session.epsilon),
            book=LoadBook(config.load.tokens_per_request),
            adapters=AdapterPlacement(config.adapter.recent_s),
        )
        self.ejections = Ejections(config.ejection.consecutive_failures, config.ejection.cooldown_s)
        self._translators: dict[str, Translator] = {}  # precise mode, per replica
        self._replicas: tuple[str, ...] = ()
        self.scorers: list[tuple[Scorer, float]] = [
            (SCORER_TYPES[name](), weight) for name, weight in config.scorers.items()
        ]

    def set_replicas(self, replicas: Sequence[str]) -> None:
        """The deployment's replicas changed: forget the ones that left."""
        before = set(self._replicas) | set(self.ctx.index.replicas())
        self._replicas = tuple(replicas)
        self.ctx.ring.set_members(replicas)
        alive = set(replicas)
        for gone in sorted(before - alive):
            self.forget(gone)

    def replicas(self) -> tuple[str, ...]:
        """The deployment's replicas, as last set."""
        return self._replicas

    def forget(self, replica: str) -> None:
        self._replicas = tuple(r for r in self._replicas if r != replica)
        self.ctx.index.drop(replica)
        self.ctx.adapters.drop(replica)
        self.ctx.book.drop(replica)
        self.ctx.prefill.drop(replica)
        self.ejections.drop(replica)
        self._translators.pop(replica, None)

    def engine_events(self, replica: str, events: list[KvEvent]) -> Changes:
        """Precise mode: what the replica's engine reports storing and evicting."""
        translator = self._translators.get(replica)
        if translator is None:
            translator = self._translators[replica] = Translator(self.config.prefix.block_size)
        mismatched = translator.mismatched
        changes = translator.apply(events)
        self.ctx.matches_for = None
        if translator.mismatched and not mismatched:
            log.warning(
                "replica %s reports KV blocks of another size than routing.prefix.block_size"
                " (%d): set it to the engine's block size for precise mode",
                replica,
                self.config.prefix.block_size,
            )
        index = self.ctx.index
        if changes.cleared:
            index.drop(replica)
        if changes.removed:
            index.remove(replica, changes.removed)
        if changes.stored:
            index.insert(replica, changes.stored)
        return changes

    def decide(self, request: RoutedRequest, candidates: Sequence[str]) -> Decision:
        if not candidates:
            raise ValueError("no candidate replica")
        cands = self.ctx.book.candidates(self.ejections.available(candidates) or candidates)
        self.ctx.matches_for = None  # the index may have changed since the last decision
        matches = self.ctx.matched(request, cands.ids)
        timings: dict[str, int] = {}
        scores: dict[str, list[float]] = {}
        weights: dict[str, float] = {}
        balance = imbalanced(cands.in_flight, self.config.load)
        for scorer, weight in self.scorers:
            if balance and scorer.name != "load":
                continue
            started = time.perf_counter_ns()
            scores[scorer.name] = scorer.score(request, cands, self.ctx)
            timings[scorer.name] = time.perf_counter_ns() - started
            weights[scorer.name] = weight
        if balance and "load" not in scores:  # balance wins even with load weighted 0
            scores["load"] = LoadScorer().score(request, cands, self.ctx)
            weights["load"] = 1.0
        total_w = sum(weights.values()) or 1.0
        totals = [0.0] * len(cands.ids)
        for name, xs in scores.items():
            w = weights[name] / total_w
            totals = [t + w * x for t, x in zip(totals, xs, strict=True)]
        order = pick(request.key, cands.ids, totals)
        winner = cands.ids[order[0]]
        return Decision(
            replica=winner,
            ranking=tuple(cands.ids[i] for i in order),
            scorer=self._decider(order, totals, scores, weights, balance),
            matched_blocks=matches.get(winner, 0),
            prompt_blocks=len(request.hashes),
            load=cands.load[order[0]],
            totals=dict(zip(cands.ids, totals, strict=True)),
            index_blocks=self.ctx.index.size(),
            timings_ns=timings,
        )

    @staticmethod
    def _decider(
        order: list[int],
        totals: list[float],
        scores: dict[str, list[float]],
        weights: dict[str, float],
        balance: bool,
    ) -> str:
        if len(order) == 1:
            return "only"
        if balance:
            return "load:imbalance"
        winner, second = order[0], order[1]
        if totals[second] >= totals[winner] - TIE:
            return "tiebreak"
        gains = {n: weights[n] * (scores[n][winner] - scores[n][second]) for n in scores}
        return max(gains, key=lambda n: gains[n])

    def routed(self, request_id: str, request: RoutedRequest, replica: str) -> None:
        """The request went to ``replica``: book it there with the prompt tokens the
        replica must compute (those beyond the blocks it is believed to hold), pending
        until its first token, and remember its prefix."""
        if self.ctx.matches_for == request.key and replica in self.ctx.matches:
            held = self.ctx.matches[replica]  # what the decision just found
        else:
            held = self.ctx.index.match(replica, request.hashes)
        held *= self.config.prefix.block_size
        to_compute = max(0, request.prompt_tokens - held)
        self.ctx.book.book(request_id, replica, to_compute)
        self.ctx.prefill.start(request.key, replica, to_compute)
        self.ejections.routed(request.key, replica)
        if request.adapter is not None:
            self.ctx.adapters.routed(replica, request.adapter)
        if request.hashes:
            self.ctx.index.insert(replica, request.hashes)
        self.ctx.matches_for = None  # the index changed

    def first_token(self, key: str) -> None:
        """The request of gateway id ``key`` had its first token: its prompt is computed."""
        self.ctx.prefill.done(key)

    def completed(self, request_id: str, key: str | None = None) -> None:
        """Ray reports the request done (``key``: its gateway id, when known here)."""
        self.ctx.book.release(request_id)
        if key is not None:
            self.ctx.prefill.done(key)
