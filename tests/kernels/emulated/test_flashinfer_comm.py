"""FlashInfer's DCP all-to-all, emulated: ranks in one process exchange through real (turn-taking) collectives.

The expectation is FlashInfer's own ``_verify_transpose`` (tests/comm/test_dcp_alltoall.py),
written out here element by element: on rank ``r``, slot ``p`` of the peer axis holds what
rank ``p`` put in slot ``r``, bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.collectives import run_ranks_in_process
from pytest_mla.kernels.emulated import flashinfer_comm as fc
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead


class CollectivesBackend:
    """FlashInfer's ``CommBackend`` interface over the harness's collectives (what SGLang's
    ``TorchDistributedCommBackend`` is over a process group)."""

    def __init__(self, collectives):
        self.c = collectives
        self.splits = []

    def Get_rank(self):
        return self.c.rank

    def Get_size(self):
        return self.c.world

    def allgather(self, data):
        return self.c.all_gather_object(data)

    def bcast(self, data, root=0):
        return self.c.all_gather_object(data)[root]

    def barrier(self):
        self.c.barrier()

    def Split(self, color, key):
        self.splits.append((color, key))
        return self


def _inputs(rank, cp, lead=(3, 2), d=32, s=2, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(1000 + rank)
    o = torch.randn(*lead, cp, d, generator=g).to(dtype)
    stats = torch.randn(*lead, cp, s, generator=g)
    stats[..., 0, 0] = -math.inf  # an empty partial's LSE travels as it is
    return o, stats


def _workspace(c, cp):
    mapping = fc.Mapping(world_size=cp, rank=c.rank, gpus_per_node=8, cp_size=cp, tp_size=1, pp_size=1)
    return fc.decode_cp_a2a_allocate_mnnvl_workspace(mapping, mnnvl_config=fc.MnnvlConfig(
        comm_backend=CollectivesBackend(c)))


@pytest.mark.parametrize("cp,lead,d,s,dtype", [
    (2, (5,), 64, 2, torch.bfloat16),
    (4, (3, 2), 32, 2, torch.bfloat16),  # SGLang's [B, H/N, N, D] / [B, H/N, N, 2]
    (4, (1, 3), 16, 4, torch.float16),
])
def test_exchange_hands_each_rank_every_peer_slot_addressed_to_it(cp, lead, d, s, dtype):
    def rank(c):
        ws = _workspace(c, cp)
        fc.decode_cp_a2a_init_workspace(ws, c.rank, cp)
        c.barrier()
        o, stats = _inputs(c.rank, cp, lead, d, s, dtype)
        return fc.decode_cp_a2a_alltoall(o, stats, ws, c.rank, cp)

    results = run_ranks_in_process(rank, cp)
    sent = [_inputs(p, cp, lead, d, s, dtype) for p in range(cp)]
    for r, (o_out, s_out) in enumerate(results):
        assert o_out.shape == sent[r][0].shape and o_out.dtype == dtype
        assert s_out.shape == sent[r][1].shape and s_out.dtype == torch.float32
        for p in range(cp):
            assert torch.equal(o_out[..., p, :].view(torch.int16), sent[p][0][..., r, :].view(torch.int16)), (r, p)
            assert torch.equal(s_out[..., p, :].view(torch.int32), sent[p][1][..., r, :].view(torch.int32)), (r, p)
    # rank 1 did not get its own inputs back: the exchange moved data
    assert not torch.equal(results[1][0], sent[1][0])


def test_exchange_can_repeat_on_one_workspace():
    cp = 2

    def rank(c):
        ws = _workspace(c, cp)
        fc.decode_cp_a2a_init_workspace(ws, c.rank, cp)
        outs = []
        for round_ in range(3):
            o, stats = _inputs(c.rank + 10 * round_, cp)
            outs.append(fc.decode_cp_a2a_alltoall(o, stats, ws, c.rank, cp)[0])
        return outs

    results = run_ranks_in_process(rank, cp)
    for round_ in range(3):
        peer_sent = _inputs(1 + 10 * round_, cp)[0]
        assert torch.equal(results[0][round_][..., 1, :], peer_sent[..., 0, :])


def test_workspace_is_the_librarys_shape_over_the_split_communicator():
    cp = 4
    backends = {}

    def rank(c):
        backend = backends.setdefault(c.rank, CollectivesBackend(c))
        mapping = fc.Mapping(world_size=cp, rank=c.rank, cp_size=cp, tp_size=1, pp_size=1)
        return fc.decode_cp_a2a_allocate_mnnvl_workspace(mapping, mnnvl_config=fc.MnnvlConfig(comm_backend=backend))

    workspaces = run_ranks_in_process(rank, cp)
    # computeHelixWorkspaceSizePerRank for 148 SMs: 148 // (ceil(4 / 8) * 2) = 74 channels,
    # (512 KiB FIFO + two 256-byte FIFO infos) per peer and channel
    per_rank = (512 * 1024 + 2 * 256) * 4 * 74
    for ws in workspaces:
        assert ws.dtype == torch.int64 and tuple(ws.shape) == (4, per_rank // 8)
    # MnnvlMemory.set_comm_from_config: Split(pp_rank * cp_size + cp_rank, tp_rank)
    assert [backends[r].splits for r in range(cp)] == [[(r, 0)] for r in range(cp)]


def test_a_row_nobody_initialised_is_refused_naming_the_workspace():
    cp = 2

    def rank(c):
        ws = _workspace(c, cp)
        if c.rank == 0:
            fc.decode_cp_a2a_init_workspace(ws, 0, cp)
        o, stats = _inputs(c.rank, cp)
        return fc.decode_cp_a2a_alltoall(o, stats, ws, c.rank, cp)

    with pytest.raises(OutOfContractError, match=r"^workspace: rows \[1\] were not reset"):
        run_ranks_in_process(rank, cp)


def test_a_rank_passing_another_rows_cp_rank_is_the_callers_bug():
    cp = 2

    def rank(c):
        ws = _workspace(c, cp)
        fc.decode_cp_a2a_init_workspace(ws, c.rank, cp)
        o, stats = _inputs(c.rank, cp)
        return fc.decode_cp_a2a_alltoall(o, stats, ws, 1 - c.rank, cp)

    with pytest.raises(OutOfRangeRead, match=r"^cp_rank: .*passed cp_rank \[1, 0\]"):
        run_ranks_in_process(rank, cp)


def _solo_workspace(cp=2):
    class Solo:
        def Split(self, color, key):
            return self

        def Get_rank(self):
            return 0

        def Get_size(self):
            return cp

        def allgather(self, data):
            return [data] * cp

    mapping = fc.Mapping(world_size=cp, rank=0, cp_size=cp)
    return fc.decode_cp_a2a_allocate_mnnvl_workspace(mapping, mnnvl_config=fc.MnnvlConfig(comm_backend=Solo()))


@pytest.mark.parametrize("o,stats,cp,match", [
    (torch.zeros(4, 2, 64, dtype=torch.float32), torch.zeros(4, 2, 2), 2, "partial_o must be half or bfloat16"),
    (torch.zeros(4, 2, 64, dtype=torch.bfloat16), torch.zeros(4, 2, 1), 2, "last dim must be even and >= 2"),
    (torch.zeros(4, 2, 64, dtype=torch.bfloat16), torch.zeros(8, 2, 2), 2, "batch dimensions must match"),
    (torch.zeros(4, 2, 64, dtype=torch.bfloat16), torch.zeros(4, 2, 2, dtype=torch.float16), 2,
     "softmax_stats must be float32"),
    (torch.zeros(4, 2, 4, dtype=torch.bfloat16), torch.zeros(4, 2, 2), 2, "16-byte aligned"),
    (torch.zeros(4, 64, 2, dtype=torch.bfloat16).transpose(1, 2), torch.zeros(4, 2, 2), 2, "must be contiguous"),
    (torch.zeros(4, 3, 64, dtype=torch.bfloat16), torch.zeros(4, 3, 2), 3, "workspace first dim must equal cp_size"),
    (torch.zeros(4, 3, 64, dtype=torch.bfloat16), torch.zeros(4, 2, 2), 2, "partial_o second-to-last dim"),
])
def test_the_ops_own_checks_raise_runtime_error(o, stats, cp, match):
    ws = _solo_workspace()
    fc.decode_cp_a2a_init_workspace(ws, 0, 2)
    with pytest.raises(RuntimeError, match=match):
        fc.decode_cp_a2a_alltoall(o, stats, ws, 0, cp)


def test_init_checks_the_rank_and_the_workspace():
    ws = _solo_workspace()
    with pytest.raises(RuntimeError, match=r"cp_rank must be in \[0, cp_size\)"):
        fc.decode_cp_a2a_init_workspace(ws, 2, 2)
    with pytest.raises(RuntimeError, match="workspace first dim must equal cp_size"):
        fc.decode_cp_a2a_init_workspace(ws, 0, 4)


def test_what_is_not_modelled_raises_naming_the_flag():
    plain = torch.zeros(2, 16, dtype=torch.int64)  # FlashInfer's single-GPU simulation shares one tensor
    with pytest.raises(OutOfContractError, match="^workspace: decode_cp_a2a_init_workspace was given a workspace"):
        fc.decode_cp_a2a_init_workspace(plain, 0, 2)
    with pytest.raises(OutOfContractError, match="^workspace: decode_cp_a2a_alltoall"):
        fc.decode_cp_a2a_alltoall(torch.zeros(1, 2, 64, dtype=torch.bfloat16), torch.zeros(1, 2, 2), plain, 0, 2)
    with pytest.raises(OutOfContractError, match="^mnnvl_config: None"):
        fc.decode_cp_a2a_allocate_mnnvl_workspace(fc.Mapping(world_size=2, rank=0, cp_size=2))
    with pytest.raises(OutOfContractError, match="^Mapping.moe_ep_size: 2"):
        fc.Mapping(world_size=2, rank=0, tp_size=2, moe_ep_size=2)


def test_mapping_keeps_the_librarys_checks_and_rank_split():
    with pytest.raises(ValueError, match="world_size must equal to tp_size \\* pp_size \\* cp_size"):
        fc.Mapping(world_size=4, rank=0, cp_size=2)
    m = fc.Mapping(world_size=8, rank=5, cp_size=2, tp_size=2, pp_size=2)
    # rank 5 of tp 2 x cp 2 x pp 2: tp rank 1, cp rank (5 % 4) // 2 = 0, pp rank 5 // 4 = 1
    assert (m.tp_rank, m.cp_rank, m.pp_rank) == (1, 0, 1)


def test_in_process_object_gather_gives_each_rank_its_own_copy():
    def rank(c):
        got = c.all_gather_object({"rank": c.rank, "t": torch.full((2,), float(c.rank))})
        got[0]["t"].add_(100.0)  # a rank's copy is its own
        return got

    results = run_ranks_in_process(rank, 3)
    for r in range(3):
        assert [g["rank"] for g in results[r]] == [0, 1, 2]
        assert results[r][1]["t"].tolist() == [1.0, 1.0]
        assert results[r][0]["t"].tolist() == [100.0, 100.0]
