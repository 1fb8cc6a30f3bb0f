"""Switchyard's KV-event structs speak the installed vLLM's wire format both ways."""

from __future__ import annotations

import msgspec
from vllm.distributed import kv_events as vllm_events

from app.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    decode_batch,
    encode_batch,
)


def _vllm_batch() -> bytes:
    stored = vllm_events.BlockStored(
        block_hashes=[11, 12], parent_block_hash=None, token_ids=[1, 2, 3, 4],
        block_size=2, lora_id=None, medium="GPU", lora_name=None,
        extra_keys=[("tenant-salt",), None],
    )  # fmt: skip
    chained = vllm_events.BlockStored(
        block_hashes=[b"\x01" * 32], parent_block_hash=12, token_ids=[5, 6],
        block_size=2, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip
    batch = vllm_events.KVEventBatch(
        ts=1.5,
        events=[
            stored,
            chained,
            vllm_events.BlockRemoved(block_hashes=[11], medium="GPU"),
            vllm_events.AllBlocksCleared(),
        ],
    )
    return msgspec.msgpack.Encoder().encode(batch)


def test_what_vllm_publishes_decodes() -> None:
    batch = decode_batch(_vllm_batch())
    assert batch.ts == 1.5
    stored, chained, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == [11, 12]
    assert stored.parent_block_hash is None and stored.token_ids == [1, 2, 3, 4]
    assert stored.extra_keys == [("tenant-salt",), None]
    assert isinstance(chained, BlockStored)
    assert chained.block_hashes == [b"\x01" * 32] and chained.parent_block_hash == 12
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [11]
    assert isinstance(cleared, AllBlocksCleared)


def test_what_the_simulated_engine_publishes_decodes_in_vllm() -> None:
    ours = KvEventBatch(
        ts=2.0,
        events=[
            BlockStored(
                block_hashes=[b"h"],
                parent_block_hash=None,
                token_ids=[7, 8],
                block_size=2,
                extra_keys=[("s",)],
            ),
            BlockRemoved(block_hashes=[b"h"]),
        ],
    )
    theirs = msgspec.msgpack.Decoder(vllm_events.KVEventBatch).decode(encode_batch(ours))
    assert isinstance(theirs.events[0], vllm_events.BlockStored)
    assert theirs.events[0].token_ids == [7, 8] and theirs.events[0].block_hashes == [b"h"]
    assert isinstance(theirs.events[1], vllm_events.BlockRemoved)
