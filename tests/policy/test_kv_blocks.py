"""KV block allocator: sizing, check-then-act, integrity under random operations."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.step.kv_blocks import KVBlockAllocator


def test_allocate_and_free() -> None:
    kv = KVBlockAllocator(total_blocks=4, block_size_tokens=16, max_seq_tokens=64)
    assert kv.blocks_needed(0) == 0 and kv.blocks_needed(16) == 1 and kv.blocks_needed(17) == 2
    assert kv.allocate(1, 17) == (0, 1)
    assert kv.allocate(2, 32) == (2, 3)
    assert kv.free_blocks == 0 and kv.used_blocks == 4
    assert not kv.can_allocate(1) and kv.allocate(3, 1) is None
    assert kv.free(1) == 2 and kv.free(1) == 0
    assert kv.allocate(3, 20) == (0, 1)  # freed blocks come back
    assert kv.block_table(3) == (0, 1) and kv.block_table(99) == ()
    assert kv.sequences() == [2, 3]
    kv.check_integrity()


def test_duplicate_sequence_is_an_error() -> None:
    kv = KVBlockAllocator(4, 16, 64)
    kv.allocate(1, 5)
    with pytest.raises(ValueError, match="seq_id 1"):
        kv.allocate(1, 5)


def test_never_fits() -> None:
    kv = KVBlockAllocator(total_blocks=4, block_size_tokens=16, max_seq_tokens=100)
    assert kv.never_fits(101)  # over max_seq_tokens
    kv2 = KVBlockAllocator(total_blocks=4, block_size_tokens=16, max_seq_tokens=1000)
    assert kv2.never_fits(65) and not kv2.never_fits(64)  # more blocks than exist
    assert kv2.allocate(1, 65) is None


def test_for_context() -> None:
    unified = KVBlockAllocator.for_context(4096, 4, 16, unified=True)
    assert (unified.total_blocks, unified.max_seq_tokens) == (256, 4096)
    split = KVBlockAllocator.for_context(4096, 4, 16, unified=False)
    assert (split.total_blocks, split.max_seq_tokens) == (256, 1024)
    assert split.never_fits(1025)
    with pytest.raises(ValueError, match="n_seq_max"):
        KVBlockAllocator.for_context(4096, 0, 16, unified=True)
    with pytest.raises(ValueError, match="n_ctx_tokens"):
        KVBlockAllocator.for_context(8, 1, 16, unified=True)


@pytest.mark.parametrize("field", ["total_blocks", "block_size_tokens", "max_seq_tokens"])
def test_validation_names_field(field: str) -> None:
    args = {"total_blocks": 4, "block_size_tokens": 16, "max_seq_tokens": 64, field: 0}
    with pytest.raises(ValueError, match=field):
        KVBlockAllocator(**args)


@settings(max_examples=200, deadline=None)
@given(
    total=st.integers(1, 20),
    block=st.integers(1, 8),
    max_seq=st.integers(1, 100),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 9), st.integers(0, 80)),
                 max_size=100),
)
def test_random_operations_keep_integrity(
    total: int, block: int, max_seq: int, ops: list[tuple[Any, ...]]
) -> None:
    kv = KVBlockAllocator(total, block, max_seq)
    held: dict[int, int] = {}
    for is_alloc, seq, n_tokens in ops:
        if is_alloc:
            if seq in held:
                with pytest.raises(ValueError):
                    kv.allocate(seq, n_tokens)
                continue
            could = kv.can_allocate(n_tokens)
            table = kv.allocate(seq, n_tokens)
            assert (table is not None) == could
            if table is not None:
                assert len(table) == kv.blocks_needed(n_tokens)
                held[seq] = len(table)
        else:
            assert kv.free(seq) == held.pop(seq, 0)
        kv.check_integrity()
        assert kv.free_blocks + kv.used_blocks == total
        assert kv.used_blocks == sum(held.values())
