from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, EmbeddingRequest
from app.request import Prompt

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 5}, 5),
        ({"max_completion_tokens": 7}, 7),
        ({"max_tokens": 5, "max_completion_tokens": 7}, 7),
        ({}, None),
    ],
)
def test_chat_max_tokens(fields: dict[str, Any], expected: int | None) -> None:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **fields})
    assert req.requested_max_tokens() == expected


def test_completion_default_max_tokens_is_sixteen() -> None:
    assert (
        CompletionRequest.model_validate({"model": "m", "prompt": "x"}).requested_max_tokens() == 16
    )


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("abc", Prompt(text="abc")),
        ([1, 2, 3], Prompt(token_ids=(1, 2, 3))),
        (["only"], Prompt(text="only")),
    ],
)
def test_completion_prompt_forms(prompt: Any, expected: Prompt) -> None:
    parsed = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert parsed.prompt_of() == expected


def test_several_prompts_are_refused() -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"]})


@pytest.mark.parametrize(
    ("stop", "expected"), [(None, ()), ("x", ("x",)), (["a", "b"], ("a", "b"))]
)
def test_stop_list(stop: Any, expected: tuple[str, ...]) -> None:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, "stop": stop})
    assert req.stop_list() == expected


@pytest.mark.parametrize(
    "bad",
    [
        {"n": 2},
        {"temperature": -0.1},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"stream_options": {"include_usage": True}},  # only with stream=true
        {"logit_bias_typo": {}},
    ],
)
def test_invalid_chat_fields(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **bad})


def test_content_parts_are_joined() -> None:
    msg = ChatMessage.model_validate(
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    )
    assert msg.text() == "ab"
    assert ChatMessage(role="assistant", content=None).text() == ""


def test_embedding_inputs() -> None:
    assert EmbeddingRequest.model_validate({"model": "m", "input": "x"}).inputs() == ["x"]
    assert EmbeddingRequest.model_validate({"model": "m", "input": ["x", "y"]}).inputs() == [
        "x",
        "y",
    ]
    with pytest.raises(ValidationError):
        EmbeddingRequest.model_validate({"model": "m", "input": "x", "encoding_format": "int8"})
