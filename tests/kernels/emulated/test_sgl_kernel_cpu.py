"""sgl-kernel's CPU KV-cache write (``torch.ops.sgl_kernel.store_cache_cpu``), emulated.

The cases are SGLang's own CPU test of the op: ``[batch, heads, head_size]``
rows (bf16, fp16, and uint8 for an fp8 cache stored as bytes) written at
random slots of a ``[slots, heads, head_size]`` cache; the expectation is a
plain loop over the rows, and every slot not written keeps its NaN (or its
poison byte).
"""

from __future__ import annotations

import re

import pytest
import torch

from pytest_mla.kernels.emulated import EMULATIONS
from pytest_mla.kernels.emulated.glue import OutOfRangeRead
from pytest_mla.kernels.emulated.sgl_kernel_cpu import store_cache_cpu

SLOTS = 64


def rows(shape, dtype, generator):
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    return torch.randn(shape, generator=generator).to(dtype)


def poisoned_cache(shape, dtype):
    return torch.full(shape, 0x7F, dtype=torch.uint8) if dtype == torch.uint8 else torch.full(shape, float("nan"),
                                                                                                dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.uint8])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("batch", "heads", "head_size"), [(1, 1, 64), (7, 8, 128), (13, 4, 64)])
def test_each_row_lands_at_its_slot_and_nothing_else_changes(dtype, index_dtype, batch, heads, head_size):
    g = torch.Generator().manual_seed(batch * 1000 + heads * 10 + head_size)
    k, v = rows((batch, heads, head_size), dtype, g), rows((batch, heads, head_size), dtype, g)
    k_cache, v_cache = poisoned_cache((SLOTS, heads, head_size), dtype), poisoned_cache((SLOTS, heads, head_size), dtype)
    slots = torch.randperm(SLOTS, generator=g)[:batch].to(index_dtype)
    assert store_cache_cpu(k, v, k_cache, v_cache, slots, heads * head_size) is None
    written = set(slots.tolist())
    for b, slot in enumerate(slots.tolist()):
        assert torch.equal(k_cache[slot], k[b]) and torch.equal(v_cache[slot], v[b])
    untouched = torch.tensor([s for s in range(SLOTS) if s not in written])
    if dtype == torch.uint8:
        assert bool((k_cache[untouched] == 0x7F).all()) and bool((v_cache[untouched] == 0x7F).all())
    else:
        assert bool(k_cache[untouched].isnan().all()) and bool(v_cache[untouched].isnan().all())


def test_row_dim_is_optional_and_strided_batch_rows_are_read_by_their_stride():
    g = torch.Generator().manual_seed(3)
    wide = rows((5, 2, 4, 64), torch.bfloat16, g)  # k and v as halves of one tensor: batch stride 512, not 256
    k, v = wide[:, 0], wide[:, 1]
    k_cache, v_cache = poisoned_cache((SLOTS, 4, 64), torch.bfloat16), poisoned_cache((SLOTS, 4, 64), torch.bfloat16)
    slots = torch.tensor([9, 0, 63, 17, 4])
    store_cache_cpu(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache[slots], k) and torch.equal(v_cache[slots], v)


@pytest.mark.parametrize(("change", "message"), [
    (lambda a: a.update(row_dim=999), "row_dim == num_heads * head_size"),
    (lambda a: a.update(indices=a["indices"][:2]), "indices.size(0) == batch_size"),
    (lambda a: a.update(v_cache=a["v_cache"].half()), "must have the same dtype"),
    (lambda a: a.update(indices=a["indices"].to(torch.int16)), "indices must be int64 or int32"),
    (lambda a: a.update(k=a["k"].reshape(3, -1)), "k must have 3 dimensions"),
    (lambda a: a.update(k_cache=a["k_cache"].transpose(1, 2)), "k_cache must be contiguous at the last two"),
    (lambda a: [a.update({n: a[n].float()}) for n in ("k", "v", "k_cache", "v_cache")], "not implemented for 'float32'"),
])
def test_the_ops_own_checks_raise_as_it_does(change, message):
    g = torch.Generator().manual_seed(5)
    args = dict(k=rows((3, 4, 64), torch.bfloat16, g), v=rows((3, 4, 64), torch.bfloat16, g),
                k_cache=poisoned_cache((SLOTS, 4, 64), torch.bfloat16),
                v_cache=poisoned_cache((SLOTS, 4, 64), torch.bfloat16), indices=torch.tensor([1, 2, 3]), row_dim=256)
    change(args)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        store_cache_cpu(**args)


@pytest.mark.parametrize("slot", [SLOTS, -1])
def test_a_slot_outside_the_cache_is_a_write_the_op_would_make_into_foreign_memory(slot):
    g = torch.Generator().manual_seed(7)
    k, v = rows((2, 1, 64), torch.bfloat16, g), rows((2, 1, 64), torch.bfloat16, g)
    k_cache = poisoned_cache((SLOTS, 1, 64), torch.bfloat16)
    with pytest.raises(OutOfRangeRead, match="would write"):
        store_cache_cpu(k, v, k_cache, k_cache.clone(), torch.tensor([0, slot]))
    assert bool(k_cache.isnan().all())  # checked before anything is written


def test_registered_under_the_ops_qualified_name():
    assert EMULATIONS["torch.ops.sgl_kernel:store_cache_cpu"] is store_cache_cpu
