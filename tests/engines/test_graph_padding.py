"""A decode batch padded as vLLM's V2 runner pads it for a FULL CUDA graph (``engines/vllm/batch.py``).

The expected values are vLLM 0.34.0's rules written out by hand: ``prepare_inputs`` repeats the
batch's token count in ``query_start_loc`` for each dummy request, ``prepare_pos_seq_lens`` gives it
``seq_len`` 0, ``gather_block_tables`` a row of zeros (block 0, the block pool's null block).
"""

from __future__ import annotations

import pytest
import torch

from pytest_mla.core.errors import AdapterError
from pytest_mla.engines.vllm.batch import free_null_block, pad_for_graph


def test_dummy_requests_have_no_query_tokens_no_cached_tokens_and_the_null_block():
    seq_lens = torch.tensor([5, 70, 9], dtype=torch.int32)
    table = torch.tensor([[3, 0], [1, 2], [4, 0]], dtype=torch.int32)
    local = torch.tensor([3, 35, 5], dtype=torch.int32)
    qsl, lens, padded_table, padded_local = pad_for_graph(3, 4, 5, seq_lens, table, local)
    assert qsl.tolist() == [0, 4, 8, 12, 12, 12]
    assert lens.tolist() == [5, 70, 9, 0, 0]
    assert padded_table.tolist() == [[3, 0], [1, 2], [4, 0], [0, 0], [0, 0]]
    assert padded_local.tolist() == [3, 35, 5, 0, 0]
    assert pad_for_graph(2, 1, 4, seq_lens[:2], table[:2], None)[3] is None  # no DCP: no local lengths


def test_block_0_becomes_the_null_block_and_its_page_moves_to_a_free_block():
    cache = torch.arange(5 * 2 * 3, dtype=torch.float32).reshape(5, 2, 3)  # 5 blocks of 2 tokens
    original = cache.clone()
    # request 0 holds blocks 3, 0 (4 tokens); request 1 holds block 1 (2 tokens): blocks 2 and 4 are free,
    # and request 1's second entry is the table's filler 0, past its length
    table = torch.tensor([[3, 0], [1, 0]], dtype=torch.int32)
    free_null_block(cache, table, [4, 2], block=2, world=1)
    assert table.tolist() == [[3, 2], [1, 0]]  # the first free block, 2; the filler entry untouched
    assert torch.equal(cache[2], original[0]) and torch.isnan(cache[0]).all()
    for untouched in (1, 3, 4):
        assert torch.equal(cache[untouched], original[untouched])


def test_a_table_without_block_0_is_left_alone_and_a_full_cache_is_an_adapter_error():
    cache = torch.zeros(3, 2, 1)
    table = torch.tensor([[1], [2]], dtype=torch.int32)
    free_null_block(cache, table, [2, 2], block=2, world=1)
    assert table.tolist() == [[1], [2]] and not torch.isnan(cache).any()
    with pytest.raises(AdapterError, match="no free block"):
        free_null_block(torch.zeros(2, 2, 1), torch.tensor([[0], [1]], dtype=torch.int32), [2, 2], block=2, world=1)
