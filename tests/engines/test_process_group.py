"""The engines' one DCP group stand-in, over the harness's in-process collectives."""

from __future__ import annotations

import threading
import types

import torch
import torch.distributed as dist

from pytest_mla.engines.common.process_group import (DcpGroup, InProcessGroup, PerThread, ThreadBound,
                                                     torch_collectives_in_process)
from pytest_mla.kernels.collectives import SoloCollectives, run_ranks_in_process


def test_the_group_gathers_and_reduce_scatters_over_the_ranks():
    def rank(collectives):
        group = DcpGroup(collectives, torch.device("cpu"))
        mine = torch.full((2, 2), float(collectives.rank))
        return group.world_size, group.rank_in_group, group.all_gather(mine, dim=0), group.reduce_scatter(mine, dim=0)

    results = run_ranks_in_process(rank, 2)
    for r, (world, rank_in_group, gathered, scattered) in enumerate(results):
        assert (world, rank_in_group) == (2, r)
        assert torch.equal(gathered, torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]))
        assert torch.equal(scattered, torch.ones(1, 2))  # the sum 0 + 1, this rank's row of it


def test_a_group_of_one_passes_tensors_through_and_has_no_device_group_of_its_own():
    group = DcpGroup(SoloCollectives(), torch.device("cpu"))
    x = torch.arange(4.0)
    assert group.all_gather(x) is x and group.reduce_scatter(x) is x and group.all_reduce(x) is x
    assert group.device_group is None


def test_torch_all_gather_into_tensor_on_in_process_ranks_uses_their_collectives():
    original = dist.all_gather_into_tensor

    def rank(collectives):
        group = DcpGroup(collectives, torch.device("cpu"))
        assert isinstance(group.device_group, InProcessGroup)
        out = torch.empty(2, 3)
        with torch_collectives_in_process():
            dist.all_gather_into_tensor(out, torch.full((1, 3), float(collectives.rank)), group=group.device_group)
        return out

    for out in run_ranks_in_process(rank, 2):
        assert torch.equal(out, torch.tensor([[0.0] * 3, [1.0] * 3]))
    assert dist.all_gather_into_tensor is original  # the last rank out put torch's back


def test_each_thread_sees_its_own_binding_and_its_own_instance():
    bound, made = ThreadBound(), PerThread(lambda: types.SimpleNamespace(token=object()))
    seen = {}

    def body(name):
        bound.bind(type("Group", (), {"name": name})())
        seen[name] = (bound.name, made.token, made.token)

    threads = [threading.Thread(target=body, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert seen["a"][0] == "a" and seen["b"][0] == "b"
    assert seen["a"][1] is seen["a"][2] and seen["a"][1] is not seen["b"][1]  # made once in each thread


def test_the_exchanges_sglang_uses_and_the_after_hook():
    """SGLang's DCP merge: a gather into given tensors, an equal-split all-to-all, a barrier; after each,
    the rank's ``after`` hook runs (SGLang states the rank's place again there)."""
    calls = []

    def rank(collectives):
        me = collectives.rank
        group = DcpGroup(collectives, after=lambda: calls.append(me), name="pytest-mla:dcp", cpu_group=False)
        outs = [torch.empty(2) for _ in range(2)]
        assert group.all_gather(torch.full((2,), float(me)), output_tensor_list=outs) is None
        exchanged = torch.empty(4)
        group.all_to_all_single(exchanged, torch.tensor([10.0, 11.0, 20.0, 21.0]) + 100 * me)
        group.barrier()
        return outs, exchanged, group.cpu_group, group.unique_name, group.is_last_rank

    results = run_ranks_in_process(rank, 2)
    for me, (outs, exchanged, cpu_group, name, last) in enumerate(results):
        assert [o.tolist() for o in outs] == [[0.0, 0.0], [1.0, 1.0]]
        # chunk j of each rank's input goes to rank j: rank 0 gets the first halves, rank 1 the second
        assert exchanged.tolist() == ([10.0, 11.0, 110.0, 111.0] if me == 0 else [20.0, 21.0, 120.0, 121.0])
        assert (cpu_group, name, last) == (None, "pytest-mla:dcp", me == 1)
    assert sorted(calls) == [0, 0, 0, 1, 1, 1]  # three collectives, each returned to both ranks


def test_torch_object_collectives_and_barrier_on_in_process_ranks():
    originals = {n: getattr(dist, n) for n in ("all_gather_object", "broadcast_object_list", "barrier")}

    def rank(collectives):
        group = DcpGroup(collectives)
        gathered, broadcast = [None, None], [f"from {collectives.rank}"]
        with torch_collectives_in_process():
            dist.all_gather_object(gathered, {"rank": collectives.rank}, group=group.device_group)
            dist.broadcast_object_list(broadcast, src=1, group=group.device_group)
            dist.barrier(group=group.device_group)
        return gathered, broadcast, group.device_group.rank(), group.device_group.size()

    for me, (gathered, broadcast, rank_of, size) in enumerate(run_ranks_in_process(rank, 2)):
        assert gathered == [{"rank": 0}, {"rank": 1}] and broadcast == ["from 1"] and (rank_of, size) == (me, 2)
    assert {n: getattr(dist, n) for n in originals} == originals
