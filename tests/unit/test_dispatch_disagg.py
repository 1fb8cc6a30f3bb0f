"""The rule's inputs as the ingress reads them for a disaggregated pool
(app.dispatch.disagg.choose): the decode router's prefix index, the prefill router's
bookings, and the configured replica count before a router exists."""

from __future__ import annotations

from app.disagg.config import Disaggregation
from app.dispatch.disagg import DisaggregatedPool, choose
from app.request import Caller, InferenceRequest, Prompt
from app.scheduler.config import ReplicaRouting
from app.scheduler.loop import Scheduler
from app.scheduler.ray_router import routed_request
from app.scheduler.views import register

ROUTING = ReplicaRouting.model_validate({"prefix": {"block_size": 64}})
IDS = tuple(range(1000, 1600))  # 600 tokens: 9 full blocks of 64


def request(ids: tuple[int, ...] = IDS, n: int = 1) -> InferenceRequest:
    prompt = Prompt(messages=({"role": "user", "content": "x"},), token_ids=ids, tokenized_for="m")
    return InferenceRequest(id="r", endpoint="chat", model="m", caller=Caller("acme"),
                            prompt=prompt, n=n)  # fmt: skip


def pool(name: str, **settings: object) -> DisaggregatedPool:
    d = Disaggregation.model_validate({"min_uncached_tokens": 256, **settings})
    return DisaggregatedPool(f"{name}-decode", f"{name}-prefill", d, ROUTING)


def test_before_any_router_exists_a_long_prompt_goes_remote() -> None:
    choice = choose(pool("fresh"), request())
    assert (choice.mode, choice.reason, choice.uncached_tokens) == ("remote", "long_uncached", 600)


def test_what_the_decode_router_placed_counts_as_held() -> None:
    p = pool("held")
    decode = Scheduler(ROUTING)
    decode.set_replicas(["d0", "d1"])
    register(p.decode, decode)
    decode.routed("earlier", routed_request(request(), ROUTING), "d1")
    choice = choose(p, request())
    # 9 blocks of 64 held: 24 tokens left to compute, below the threshold
    assert (choice.mode, choice.reason, choice.uncached_tokens) == ("local", "cached", 24)
    longer = IDS + tuple(range(5000, 5400))
    assert choose(p, request(longer)).mode == "remote"  # 424 new tokens


def test_busy_prefill_replicas_keep_the_request_local() -> None:
    p = pool("busy", max_prefill_in_flight=1)
    prefill = Scheduler(ReplicaRouting())
    prefill.set_replicas(["p0"])
    register(p.prefill, prefill)
    prefill.routed("leg", routed_request(request(), ROUTING), "p0")
    assert choose(p, request()).reason == "prefill_busy"
    prefill.completed("leg")
    assert choose(p, request()).mode == "remote"


def test_a_prefill_router_whose_replicas_are_all_ejected_keeps_the_request_local() -> None:
    p = pool("ejected")
    prefill = Scheduler(ReplicaRouting.model_validate({"ejection": {"consecutive_failures": 1}}))
    prefill.set_replicas(["p0", "p1"])
    register(p.prefill, prefill)
    for replica in ("p0", "p1"):
        prefill.routed(f"ray-{replica}", routed_request(request(), ROUTING), replica)
        prefill.completed(f"ray-{replica}")
        prefill.ejections.report("r", False)  # the stream's verdict, by gateway id
    assert choose(p, request()).reason == "prefill_ejected"
    prefill.set_replicas(["p0", "p1", "p2"])  # a fresh replica can take the leg
    assert choose(p, request()).mode == "remote"


def test_several_choices_and_never_mode_stay_local() -> None:
    assert choose(pool("n"), request(n=3)).reason == "n"
    assert choose(pool("never", mode="never"), request()).reason == "mode"
