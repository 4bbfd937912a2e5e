"""sgl-kernel's KV-cache writes of its CPU and XPU builds (``store_cache_cpu``, ``store_cache_xpu``), emulated.

The cases are the libraries' own tests of the ops: ``[batch, heads, head_size]``
rows (bf16, fp16, and uint8 for an fp8 cache stored as bytes on the CPU)
written at random slots of a cache; the expectation is a plain loop over the
rows, and every slot not written keeps its NaN (or its poison byte).
"""

from __future__ import annotations

import re

import pytest
import torch

from pytest_mla.kernels.emulated import EMULATIONS
from pytest_mla.kernels.emulated.glue import OutOfRangeRead
from pytest_mla.kernels.emulated.sgl_kernel_platforms import store_cache_cpu, store_cache_xpu

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


def test_registered_under_the_ops_qualified_names():
    assert EMULATIONS["torch.ops.sgl_kernel:store_cache_cpu"] is store_cache_cpu
    assert EMULATIONS["sgl_kernel:store_cache_xpu"] is store_cache_xpu


# ---- store_cache_xpu: 2-D rows, int64 slots, a negative slot skipped --------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_xpu_rows_land_at_their_slots_and_a_negative_slot_is_skipped(dtype):
    g = torch.Generator().manual_seed(11)
    k, v = rows((6, 256), dtype, g), rows((6, 256), dtype, g)
    k_cache, v_cache = poisoned_cache((SLOTS, 256), dtype), poisoned_cache((SLOTS, 256), dtype)
    slots = torch.tensor([5, -1, 40, 0, -1, 63])
    assert store_cache_xpu(k, v, k_cache, v_cache, slots) is None
    for b, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k_cache[slot], k[b]) and torch.equal(v_cache[slot], v[b])
    untouched = torch.tensor([s for s in range(SLOTS) if s not in (5, 40, 0, 63)])
    assert bool(k_cache[untouched].isnan().all()) and bool(v_cache[untouched].isnan().all())


@pytest.mark.parametrize(("change", "message"), [
    (lambda a: a.update(indices=a["indices"].to(torch.int32)), "indices must be int64"),
    (lambda a: a.update(k=a["k"].reshape(3, 4, 64), v=a["v"].reshape(3, 4, 64)), "k must be 2D [num_tokens, row_dim]"),
    (lambda a: a.update(v=a["v"][:2]), "v shape must match k shape"),
    (lambda a: a.update(k_cache=a["k_cache"][:, :128], v_cache=a["v_cache"][:, :128].contiguous()),
     "k_cache must be contiguous"),
    (lambda a: a.update(v_cache=a["v_cache"].half()), "k and v_cache must have the same dtype"),
    (lambda a: [a.update({n: a[n].to(torch.int16)}) for n in ("k", "v", "k_cache", "v_cache")],
     "\"store_cache_xpu\" not implemented for 'torch.int16'"),
])
def test_the_xpu_ops_own_checks_raise_as_it_does(change, message):
    g = torch.Generator().manual_seed(13)
    args = dict(k=rows((3, 256), torch.bfloat16, g), v=rows((3, 256), torch.bfloat16, g),
                k_cache=poisoned_cache((SLOTS, 256), torch.bfloat16), v_cache=poisoned_cache((SLOTS, 256), torch.bfloat16),
                indices=torch.tensor([1, 2, 3]))
    change(args)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        store_cache_xpu(**args)


def test_xpu_uint8_rows_of_an_fp8_cache_are_not_modelled():
    from pytest_mla.kernels.emulated.glue import OutOfContractError

    k = torch.zeros((2, 64), dtype=torch.uint8)
    with pytest.raises(OutOfContractError, match="dtype: uint8 rows"):
        store_cache_xpu(k, k.clone(), torch.zeros((SLOTS, 64), dtype=torch.uint8),
                        torch.zeros((SLOTS, 64), dtype=torch.uint8), torch.tensor([0, 1]))


def test_an_xpu_slot_past_the_cache_is_a_foreign_write():
    g = torch.Generator().manual_seed(17)
    k = rows((2, 64), torch.bfloat16, g)
    k_cache = poisoned_cache((SLOTS, 64), torch.bfloat16)
    with pytest.raises(OutOfRangeRead, match="would write"):
        store_cache_xpu(k, k.clone(), k_cache, k_cache.clone(), torch.tensor([3, SLOTS]))
    assert bool(k_cache.isnan().all())
