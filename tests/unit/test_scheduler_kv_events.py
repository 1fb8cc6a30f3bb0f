"""Engine KV events become the router's own block hashes, whatever the engine's hashes."""

from __future__ import annotations

import pytest

from app.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from app.scheduler.blocks import chain_hashes, routing_salt
from app.scheduler.kv_events import Translator

BS = 4
TOKENS = list(range(100, 116))  # four blocks


def _stored(hashes: list[object], parent: object, tokens: list[int], salt: str | None = None,
            bs: int = BS) -> BlockStored:  # fmt: skip
    extra = [(salt,) if salt is not None else None] + [None] * (len(hashes) - 1)
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,  # type: ignore[arg-type]
                       block_size=bs, extra_keys=extra)  # fmt: skip


@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_a_chain_stored_in_two_steps_translates_to_chain_hashes(salt: str | None) -> None:
    t = Translator(BS)
    first = t.apply([_stored(["e1", "e2"], None, TOKENS[:8], salt)])
    second = t.apply([_stored([b"e3", b"e4"], "e2", TOKENS[8:])])
    assert first.stored + second.stored == list(chain_hashes(TOKENS, BS, salt))


def test_the_salt_separates_chains() -> None:
    a = Translator(BS).apply([_stored(["x"], None, TOKENS[:4], "a")]).stored
    b = Translator(BS).apply([_stored(["x"], None, TOKENS[:4], "b")]).stored
    assert a != b


@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_a_lora_chain_translates_to_the_adapters_own_hashes(salt: str | None) -> None:
    # vLLM names the adapter in the event and keys the root block by it (and the salt)
    keys = ("m:a@3",) if salt is None else ("m:a@3", salt)
    event = BlockStored(block_hashes=["e1", "e2"], parent_block_hash=None,  # type: ignore[list-item]
                        token_ids=TOKENS[:8], block_size=BS, lora_id=3, lora_name="m:a@3",
                        extra_keys=[keys, None])  # fmt: skip
    got = Translator(BS).apply([event]).stored
    assert got == list(chain_hashes(TOKENS[:8], BS, routing_salt(salt, "m:a")))
    assert got != list(chain_hashes(TOKENS[:8], BS, salt))  # not the base's blocks


@pytest.mark.parametrize(
    ("event", "orphans", "mismatched"),
    [
        (_stored(["e9"], "never-seen", TOKENS[:4]), 1, 0),  # parent lost: unmatchable
        (_stored(["e9"], None, TOKENS[:8], bs=8), 0, 1),  # another block size
        (_stored(["e9", "e10"], None, TOKENS[:6]), 0, 2),  # a partial block
    ],
)
def test_blocks_that_cannot_be_translated_are_skipped_and_counted(
    event: BlockStored, orphans: int, mismatched: int
) -> None:
    t = Translator(BS)
    assert t.apply([event]).stored == []
    assert (t.orphans, t.mismatched, len(t)) == (orphans, mismatched, 0)


def test_removed_and_cleared_blocks_leave() -> None:
    t = Translator(BS)
    ours = t.apply([_stored(["e1", "e2"], None, TOKENS[:8])]).stored
    gone = t.apply([BlockRemoved(block_hashes=["e2", "unknown"])])  # type: ignore[list-item]
    assert gone.removed == [ours[1]] and len(t) == 1
    assert t.apply([AllBlocksCleared()]).cleared and len(t) == 0
