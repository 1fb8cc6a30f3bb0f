"""Test helper: an ``InferenceRequest`` from the few fields a test of one layer cares
about (a prompt in one of its forms, the output length, sampling)."""

from __future__ import annotations

import uuid

from app.engine.protocol import SamplingOptions
from app.request import Caller, Endpoint, InferenceRequest, Prompt


def inference(
    request_id: str = "r",
    *,
    messages: tuple[dict[str, str], ...] | None = None,
    prompt_text: str | None = None,
    prompt_token_ids: tuple[int, ...] | None = None,
    max_tokens: int | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: tuple[str, ...] = (),
    ignore_eos: bool = False,
    endpoint: Endpoint | None = None,
    tenant: str = "t",
) -> InferenceRequest:
    prompt = Prompt(messages=messages, text=prompt_text, token_ids=prompt_token_ids)
    return InferenceRequest(
        id=request_id,
        endpoint=endpoint or ("chat" if messages is not None else "completion"),
        model="m",
        prompt=prompt,
        max_tokens=max_tokens,
        sampling=SamplingOptions(
            temperature=temperature, top_p=top_p, seed=seed, stop=stop, ignore_eos=ignore_eos
        ),
        caller=Caller(tenant=tenant),
    )


def embedding(inputs: list[str], request_id: str = "e") -> InferenceRequest:
    return InferenceRequest(
        id=request_id,
        endpoint="embeddings",
        model="m",
        prompt=Prompt(inputs=tuple(inputs)),
        max_tokens=0,
        caller=Caller(tenant="t"),
    )


def gated(
    caller: Caller,
    *,
    model: str = "m",
    max_tokens: int | None = None,
    session_id: str | None = None,
    request_id: str | None = None,
    client_request_id: str | None = None,
    endpoint: Endpoint = "chat",
) -> InferenceRequest:
    """A request as the gate admits it (a fresh id unless given)."""
    return InferenceRequest(
        id=request_id or uuid.uuid4().hex,
        endpoint=endpoint,
        model=model,
        prompt=Prompt(text=""),
        max_tokens=max_tokens,
        caller=caller,
        session_id=session_id,
        client_request_id=client_request_id,
    )
