# Engine KV-cache events -> the router's prefix index (precise mode).
#
# Rule: an engine publishes, per replica, batches of BlockStored (the engine's block
# hashes, its parent's hash, the blocks' token ids, per-block extra keys carrying the
# cache_salt), BlockRemoved and AllBlocksCleared — vLLM's ``kv_events_config`` wire
# format (ZMQ multipart: topic, 8-byte sequence number, msgpack ``[ts, events, dp]``),
# which the simulated engine publishes too. The router never relies on the engine's
# hash function (vLLM salts it per process unless PYTHONHASHSEED is pinned, and picks it
# by config): per replica it keeps engine hash -> its own hash, and computes its own
# hash of each stored block from the parent's translation and the block's token ids
# (``app.scheduler.blocks``: a chain root starts from the salt in its extra keys and
# the LoRA adapter it ran with). A
# stored block whose parent it never saw (events lost before it subscribed) is skipped:
# nothing under it can match. Blocks of another size than ``block_size`` are skipped
# and counted (set ``routing.prefix.block_size`` to the engine's KV block size).
# Removals and clears take blocks out of the replica's index.
#
# Parameters: ``block_size`` (``routing.prefix.block_size``).
"""Engine KV-cache events translated into router block hashes."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.engine.kv_events import BlockRemoved, BlockStored, EngineHash, KvEvent
from app.scheduler.blocks import adapter_of, routing_salt, salt_seed


def _salt(event: BlockStored) -> str | None:
    """The cache_salt among a chain root's extra keys (the string that is not the LoRA
    name), if any."""
    if not event.extra_keys or event.extra_keys[0] is None:
        return None
    found = [k for k in event.extra_keys[0] if isinstance(k, str) and k != event.lora_name]
    return found[-1] if found else None


@dataclass
class Changes:
    stored: list[int] = field(default_factory=list)  # router hashes, chain order
    removed: list[int] = field(default_factory=list)
    cleared: bool = False


class Translator:
    """One replica's engine hash -> router hash map."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ours: dict[EngineHash, int] = {}
        self.orphans = 0  # stored blocks whose parent was never seen
        self.mismatched = 0  # stored blocks of another block size

    def __len__(self) -> int:
        return len(self._ours)

    def apply(self, events: list[KvEvent]) -> Changes:
        out = Changes()
        for event in events:
            if isinstance(event, BlockStored):
                self._stored(event, out)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    ours = self._ours.pop(h, None)
                    if ours is not None:
                        out.removed.append(ours)
            else:
                self._ours.clear()
                out.stored, out.removed, out.cleared = [], [], True
        return out

    def _stored(self, event: BlockStored, out: Changes) -> None:
        bs = event.block_size
        if bs != self.block_size or len(event.token_ids) != bs * len(event.block_hashes):
            self.mismatched += len(event.block_hashes)
            return
        if event.parent_block_hash is None:
            parent = salt_seed(routing_salt(_salt(event), adapter_of(event.lora_name)))
        elif event.parent_block_hash in self._ours:
            parent = self._ours[event.parent_block_hash]
        else:
            self.orphans += len(event.block_hashes)
            return
        ids = tuple(event.token_ids)
        for i, engine_hash in enumerate(event.block_hashes):
            parent = hash((parent, ids[i * bs : (i + 1) * bs]))  # = blocks.chain_hashes
            self._ours[engine_hash] = parent
            out.stored.append(parent)
