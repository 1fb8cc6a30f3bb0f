"""The fair queue in the deployed application (app.fairness, on Ray Serve with the
simulated engine): sim-one-slot has one engine slot, so the ingress queues the rest.
A tenant that floods within its limits does not keep another tenant waiting behind
its whole backlog. Asserted on the order the engine served them, not on time."""

from __future__ import annotations

import threading
import uuid

import httpx

from tests.integration.conftest import Gateway

CHAT = "/chat/completions"


def test_a_flooding_tenant_leaves_another_served_in_fair_order(sim_gateway: Gateway) -> None:
    """Noisy holds the slot and queues two more; quiet then queues one. FIFO would serve
    quiet last; VTC serves it next: it arrives lifted to noisy's counter, and noisy's
    running request adds its output when it ends."""
    run = uuid.uuid4().hex[:8]
    keys = {who: sim_gateway.new_key(tenant=f"{who}-{run}") for who in ("noisy", "quiet")}
    body = {"model": "sim-one-slot", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 12, "ignore_eos": True}  # fmt: skip
    finished: list[str] = []
    statuses: list[int] = []
    lock = threading.Lock()

    def send(who: str) -> None:
        headers = {"Authorization": f"Bearer {keys[who]}"}
        r = httpx.post(sim_gateway.v1 + CHAT, json=body, headers=headers, timeout=60)
        with lock:
            statuses.append(r.status_code)
            finished.append(who)

    def waiting() -> float:
        return sim_gateway.metric("switchyard_queue_waiting", pool="sim-one-slot", band="standard")

    def until(count: float) -> None:
        for _ in range(1000):
            if waiting() == count:
                return
            threading.Event().wait(0.01)
        raise AssertionError(f"the queue never held {count}: {waiting()}")

    assert waiting() == 0
    threads = []
    for who, queued in (("noisy", 0), ("noisy", 1), ("noisy", 2), ("quiet", 3)):
        t = threading.Thread(target=send, args=(who,))
        t.start()
        threads.append(t)
        until(queued)  # arrivals in this order: the first runs, the rest wait
    for t in threads:
        t.join()
    assert statuses == [200] * 4
    assert finished == ["noisy", "quiet", "noisy", "noisy"]
