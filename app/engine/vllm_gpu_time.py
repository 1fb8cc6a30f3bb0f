"""vLLM's scheduler, metered: each engine step's time split across the requests in it
(``app.engine.gpu_time``'s rule), sent back on every output of a request.

vLLM names the scheduler class it runs (``scheduler_cls``, a qualified name resolved in
the engine-core process). ``MeteredScheduler`` is vLLM's own scheduler — the
asynchronous one where the engine schedules asynchronously — that also notes, for each
step, the tokens it scheduled per request (prompt tokens: those below the prompt's
length; the rest decode) and how long the step ran, timed as vLLM times its iterations:
from when the engine, the step handed to the model, asks for the step's grammar bitmask
and starts waiting for the model (or from the previous step's update, whichever is
later: an asynchronous engine schedules ahead) to the start of the step's update. So
the charges add up to the busy time vLLM's iteration details report (what
``app.engine.vllm_stats`` sums), less the steps of requests aborted inside the engine.

Every output carries the request's charge so far in its ``kv_transfer_params`` under
``GPU_SECONDS_KEY``, so the front end reads a stop string's or a cancelled request's
charge from its last output as well as a finished one's; ``strip`` takes the key out
again before a connector's parameters go anywhere.
"""

from __future__ import annotations

import time
from typing import Any

from app.engine.gpu_time import GpuTimeBook, StepCostFit, Work

GPU_SECONDS_KEY = "switchyard_gpu_s"
QUALNAME = "app.engine.vllm_gpu_time.MeteredScheduler"


def strip(params: dict[str, Any] | None) -> tuple[dict[str, Any] | None, float | None]:
    """(the connector's own parameters or None, the charge in seconds or None)."""
    if not params or GPU_SECONDS_KEY not in params:
        return params, None
    rest = {k: v for k, v in params.items() if k != GPU_SECONDS_KEY}
    return rest or None, float(params[GPU_SECONDS_KEY])


class _Metering:
    """The metering half; mixed in before one of vLLM's schedulers."""

    requests: dict[str, Any]

    def _meter_init(self) -> None:
        self._book = GpuTimeBook()
        self._fit = StepCostFit()
        self._work: dict[int, tuple[float, dict[str, Work]]] = {}  # by scheduler output
        self._last_update = 0.0

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        if output.total_num_scheduled_tokens > 0:
            work = {}
            for rid, n in output.num_scheduled_tokens.items():
                request = self.requests.get(rid)
                if request is None:
                    continue
                before = request.num_computed_tokens - n  # vLLM has advanced it by n
                prompt = max(0, min(n, request.num_prompt_tokens - before))
                work[rid] = Work(prompt, n - prompt)
            self._work[id(output)] = (time.monotonic(), work)
        return output

    def get_grammar_bitmask(self, scheduler_output: Any) -> Any:
        """vLLM asks for it after handing the step to the model and just before it
        waits for the model's answer: the step starts here, as vLLM times it."""
        found = super().get_grammar_bitmask(scheduler_output)  # type: ignore[misc]
        noted = self._work.get(id(scheduler_output))
        if noted is not None:
            self._work[id(scheduler_output)] = (time.monotonic(), noted[1])
        return found

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        now = time.monotonic()
        noted = self._work.pop(id(scheduler_output), None)
        if noted is not None:
            started, work = noted
            seconds = now - max(started, self._last_update)
            prompt = sum(w.prompt_tokens for w in work.values())
            decode = sum(w.decode_tokens for w in work.values())
            self._fit.observe(seconds, prompt, decode)
            self._book.step(seconds, work, *self._fit.costs())
        outputs = super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output
        )
        for batch in outputs.values():
            for out in batch.outputs:
                rid = out.request_id
                charged = self._book.charged(rid)
                if out.finish_reason is not None:
                    charged = self._book.close(rid)
                params = out.kv_transfer_params or {}
                out.kv_transfer_params = {**params, GPU_SECONDS_KEY: charged}
        self._last_update = time.monotonic()
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        finished = super().finish_requests(request_ids, finished_status)  # type: ignore[misc]
        for request in finished:
            self._book.drop(request.request_id)
        return finished


def _metered(base: type) -> type:
    class Metered(_Metering, base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._meter_init()

    Metered.__name__ = Metered.__qualname__ = f"Metered{base.__name__}"
    return Metered


class MeteredScheduler:
    """What vLLM instantiates: a metered ``Scheduler``, or ``AsyncScheduler`` when the
    engine schedules asynchronously (a GPU engine by default)."""

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        base = AsyncScheduler if vllm_config.scheduler_config.async_scheduling else Scheduler
        return _metered(base)(vllm_config, *args, **kwargs)
