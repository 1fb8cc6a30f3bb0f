from __future__ import annotations

import base64
import json
import struct

import pytest

from app.api.openai_format import DONE, ResponseHeader, Usage, encode_embedding, sse
from app.engine.protocol import TokenLogprob

CHAT = ResponseHeader("chat", "chatcmpl-1", 100, "m")
COMP = ResponseHeader("completion", "cmpl-1", 100, "m")


def test_usage_totals_and_cached_details() -> None:
    assert Usage(3, 4).as_dict() == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert Usage(3, 4, cached_tokens=2).as_dict()["prompt_tokens_details"] == {"cached_tokens": 2}


@pytest.mark.parametrize(
    ("header", "stream_obj", "final_obj"),
    [
        (CHAT, "chat.completion.chunk", "chat.completion"),
        (COMP, "text_completion", "text_completion"),
    ],
)
def test_object_names(header: ResponseHeader, stream_obj: str, final_obj: str) -> None:
    assert header.chunk("x")["object"] == stream_obj
    assert header.response("x", "stop", Usage(1, 1))["object"] == final_obj


def test_chat_chunks() -> None:
    first = CHAT.chunk("", role=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    last = CHAT.chunk(None, "length")
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length"
    usage = CHAT.usage_chunk(Usage(1, 2))
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 3


def test_completion_chunk_and_response() -> None:
    assert COMP.chunk("hi")["choices"][0]["text"] == "hi"
    body = COMP.response("hello", "stop", Usage(2, 1))
    assert body["choices"][0]["text"] == "hello" and body["usage"]["completion_tokens"] == 1


def test_chat_response_message() -> None:
    body = CHAT.response("hello", "length", Usage(2, 1))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert body["id"] == "chatcmpl-1" and body["model"] == "m" and body["created"] == 100


def test_sse_framing() -> None:
    event = sse({"a": 1})
    assert event == 'data: {"a":1}\n\n'
    assert DONE == "data: [DONE]\n\n"
    assert json.loads(event[len("data: ") :]) == {"a": 1}


def test_embedding_encodings() -> None:
    vec = [0.5, -1.25, 3.0]
    assert encode_embedding(vec, "float") == vec
    packed = encode_embedding(vec, "base64")
    assert isinstance(packed, str)
    assert list(struct.unpack("<3f", base64.b64decode(packed))) == vec


TOKENS = (
    TokenLogprob("Hé", -0.25, (("Hé", -0.25), ("Ha", -1.5))),
    TokenLogprob("!", -0.5, (("!", -0.5),)),
)


def test_chat_logprobs_shape() -> None:
    header = ResponseHeader("chat", "chatcmpl-1", 1, "m")
    body = header.response("Hé!", "stop", Usage(3, 2), logprobs=TOKENS)
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["Hé", "!"]
    assert content[0]["bytes"] == list("Hé".encode())
    assert content[0]["top_logprobs"] == [
        {"token": "Hé", "logprob": -0.25, "bytes": list("Hé".encode())},
        {"token": "Ha", "logprob": -1.5, "bytes": [72, 97]},
    ]
    assert header.response("x", "stop", Usage(1, 1))["choices"][0]["logprobs"] is None
    chunk = header.chunk("!", logprobs=TOKENS[1:])
    assert chunk["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5


def test_completion_logprobs_shape_with_text_offsets() -> None:
    header = ResponseHeader("completion", "cmpl-1", 1, "m")
    lp = header.response("Hé!", "stop", Usage(3, 2), logprobs=TOKENS)["choices"][0]["logprobs"]
    assert lp == {
        "tokens": ["Hé", "!"],
        "token_logprobs": [-0.25, -0.5],
        "top_logprobs": [{"Hé": -0.25, "Ha": -1.5}, {"!": -0.5}],
        "text_offset": [0, 2],
    }
    later = header.chunk("!", logprobs=TOKENS[1:], offset=2)["choices"][0]["logprobs"]
    assert later["text_offset"] == [2]


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize(
    "text",
    [" hello", "a", 'quo"te\\slash\nnewline\ttab', "ünïcode 日本語", "\u2028\x00\x1f", "}]{["],
)
def test_a_text_event_is_the_chunk_it_stands_for_byte_for_byte(kind: str, text: str) -> None:
    header = ResponseHeader(kind, 'chatcmpl-"odd"\\id', 1700000000, "org/modél:ad")  # type: ignore[arg-type]
    fast = header.text_event(text)
    assert fast == sse(header.chunk(text))
    assert json.loads(fast.removeprefix("data: "))["choices"][0]["index"] == 0
