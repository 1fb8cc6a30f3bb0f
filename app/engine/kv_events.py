# vLLM's KV-cache event wire format, which the simulated engine publishes too.
#
# Rule: with ``kv_events_config`` an engine publishes batches on a ZMQ PUB socket as
# multipart messages (topic, 8-byte big-endian sequence number, msgpack payload); the
# payload is ``[ts, events, data_parallel_rank]`` and each event a map tagged by its
# class name: BlockStored (the engine's hashes of the new full blocks, the parent's
# hash or None for a chain root, their token ids, the block size, per-block extra keys
# carrying the cache_salt), BlockRemoved (hashes), AllBlocksCleared. These structs
# declare the fields Switchyard uses; unknown fields are ignored when decoding, so
# newer vLLM versions still decode (a unit test decodes what the installed vLLM
# encodes).
"""KV-cache event structs (vLLM's wire format) and their msgpack codec."""

from __future__ import annotations

from typing import Any

import msgspec

EngineHash = int | bytes


class BlockStored(msgspec.Struct, tag=True):  # every field sent: vLLM requires some
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[EngineHash]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(KvEventBatch)
_encoder = msgspec.msgpack.Encoder()


def decode_batch(payload: bytes) -> KvEventBatch:
    return _decoder.decode(payload)


def encode_batch(batch: KvEventBatch) -> bytes:
    return _encoder.encode(batch)
