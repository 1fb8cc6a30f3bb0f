"""Chained block hashes: full blocks only, a prefix names its blocks, salts separate,
and the same values in every process (the router's ingress replicas must agree)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.scheduler.blocks import chain_hashes

IDS = list(range(100, 150))  # 50 tokens


def test_full_blocks_only_and_shared_prefixes_share_hashes() -> None:
    h = chain_hashes(IDS, 16)
    assert len(h) == 3  # 48 of 50 tokens; the partial block is not hashed
    other = chain_hashes([*IDS[:32], 7, *IDS[33:]], 16)
    assert other[:2] == h[:2] and other[2] != h[2]
    changed_first = chain_hashes([0, *IDS[1:]], 16)
    assert not set(changed_first) & set(h)  # a changed block changes every later hash


def test_salts_share_nothing() -> None:
    a, b = chain_hashes(IDS, 16, "tenant-a"), chain_hashes(IDS, 16, "tenant-b")
    assert not set(a) & set(b) and not set(a) & set(chain_hashes(IDS, 16))
    assert chain_hashes(IDS, 16, "tenant-a") == a


def test_the_same_in_another_process_with_another_hash_seed() -> None:
    code = (
        "from app.scheduler.blocks import chain_hashes; "
        "print(chain_hashes(range(100, 150), 16, 'tenant-a'))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(chain_hashes(IDS, 16, "tenant-a"))


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        chain_hashes(IDS, 0)
