"""FlashInfer's DCP all-to-all (``flashinfer.comm.dcp_alltoall``), emulated: the MNNVL workspace and the exchange.

Read from FlashInfer ``flashinfer/comm/dcp_alltoall.py`` (module docstring and
each function's), ``flashinfer/comm/mnnvl.py`` (``MnnvlConfig``,
``MnnvlMemory.set_comm_from_config`` / ``open_mnnvl_memory`` /
``as_torch_strided_tensor``), ``flashinfer/comm/mapping.py`` (``Mapping``),
``csrc/trtllm_dcp_alltoall.cu`` (the op's argument checks),
``csrc/nv_internal/tensorrt_llm/kernels/helixAllToAll.cu`` (workspace size),
and the tests ``tests/comm/test_dcp_alltoall.py`` (``_verify_transpose``, the
input-validation cases) and ``test_mnnvl_dcp_alltoall.py`` (workspace shape).
The contract, all in one place:

* **Protocol**: ``decode_cp_a2a_allocate_mnnvl_workspace(mapping, mnnvl_config=)``
  on every rank, then ``decode_cp_a2a_init_workspace(workspace, cp_rank,
  cp_size)`` (resets row ``cp_rank``), a cross-rank barrier, then any number of
  ``decode_cp_a2a_alltoall(partial_o, softmax_stats, workspace, cp_rank,
  cp_size, enable_pdl=None) -> (partial_o_out, softmax_stats_out)``.
* **Allocation**: the communicator is ``mnnvl_config.comm_backend.Split(
  mapping.pp_rank · mapping.cp_size + mapping.cp_rank, mapping.tp_rank)``
  (FlashInfer's ``CommBackend``: ``Get_rank``, ``Get_size``, ``allgather``,
  ``bcast``, ``barrier``, ``Split``); every rank allocates the same size
  (``allgather``, asserted). The workspace is an ``int64`` tensor
  ``[comm size, ws_elems_per_rank]``: row ``i`` is comm rank ``i``'s segment of
  one virtual address range every rank maps. Here the rows hold no bytes (a
  zero-stride view of one word per row) and the workspace carries, as an
  attribute, what the exchange needs: the communicator (the emulated fabric),
  this rank's place in it, an allocation id every rank shares, and the rows
  this rank initialised. ``ws_elems_per_rank`` is the library's formula
  (``computeHelixWorkspaceSizePerRank``) for a B200's 148 SMs.
* **Exchange** (``_verify_transpose``): on rank ``r``, ``partial_o_out[..., p, :]
  == partial_o[..., r, :]`` of rank ``p``, and the same for ``softmax_stats``
  — bit for bit, a transpose of the peer axis (the second-to-last) across
  ranks. Both outputs are new tensors of the inputs' shapes and dtypes.
  ``softmax_stats`` are moved as opaque float32 words: FlashInfer gives them no
  meaning (no LSE base, no use of slot 1); whatever the caller packs there,
  and its merge of the received partials, is the caller's.
* **The library's checks** (``RuntimeError``, as the op's ``TVM_FFI_ICHECK``
  raises): ``partial_o`` half or bfloat16, ``softmax_stats`` float32, both
  contiguous, at least 2-D, the same rank; the second-to-last dim of each is
  ``cp_size``; the last dim of ``softmax_stats`` even and ``>= 2``; batch dims
  equal; ``D · element_size`` a multiple of 16 bytes; ``workspace`` int64, 2-D,
  ``workspace.size(0) == cp_size``; ``0 <= cp_rank < cp_size`` (init).
* **What a GPU would not survive** (it deadlocks or writes a peer's FIFO): a
  row no rank initialised before the exchange (``OutOfContractError``
  "workspace"), ranks passing different allocations ("workspace"), a rank
  passing a ``cp_rank`` other than its own row (``OutOfRangeRead`` "cp_rank":
  it would write into FIFOs another rank reads — the caller's bug). The
  barrier between init and the first exchange is not observed: in-process
  ranks take turns and cannot race.
* **Not modelled** (``OutOfContractError``): a workspace that did not come
  from the emulated allocator (FlashInfer's single-GPU test shares one plain
  tensor between simulated ranks); ``mnnvl_config=None`` (MPI's
  ``COMM_WORLD``); ``Mapping`` options other than world size, rank, GPUs per
  node and the TP / PP / CP sizes.

``flashinfer.comm.mapping.Mapping`` and ``flashinfer.comm.mnnvl.MnnvlConfig``
are host classes, re-implemented for what the allocator reads (the library's
``ValueError`` checks kept); they compute nothing and are not logged as
emulated kernels.

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Optional

import torch

from .glue import OutOfContractError, OutOfRangeRead

__all__ = [
    "EMULATIONS",
    "Mapping",
    "MnnvlConfig",
    "decode_cp_a2a_allocate_mnnvl_workspace",
    "decode_cp_a2a_alltoall",
    "decode_cp_a2a_init_workspace",
    "decode_cp_a2a_workspace_size",
]

#: The SM count the workspace size formula is evaluated for (a B200, as ``flashinfer.py`` answers).
EMULATED_SM_COUNT = 148
_FIFO_TOTAL_BYTES = 128 * 1024 * 4  # HELIX_FIFO_ENTRY_BYTES * HELIX_FIFO_DEPTH
_FIFO_INFO_BYTES = 256  # sizeof(HelixFifoInfo): struct ALIGN_256
_MAX_GROUP_COUNT_PER_BLOCK = 8
_STATE = "_pytest_mla_dcp_a2a"  # the workspace attribute holding the emulated fabric


# ---- host classes ------------------------------------------------------------------------------


class Mapping:
    """``flashinfer.comm.mapping.Mapping`` for what the DCP allocator reads: sizes, rank, TP/PP/CP ranks."""

    def __init__(self, world_size: int = 1, rank: int = 0, gpus_per_node: int = 8, *, cp_size: int = 1,
                 cp_config: Any = None, tp_size: int = 1, pp_size: int = 1, moe_cluster_size: int = -1,
                 moe_tp_size: int = -1, moe_ep_size: int = -1, attn_tp_size: int = -1, attn_cp_size: int = -1,
                 auto_parallel: bool = False, enable_attention_dp: bool = False) -> None:
        for flag, value, default in (("cp_config", cp_config or None, None), ("moe_cluster_size", moe_cluster_size, -1),
                                     ("moe_tp_size", moe_tp_size, -1), ("moe_ep_size", moe_ep_size, -1),
                                     ("attn_tp_size", attn_tp_size, -1), ("attn_cp_size", attn_cp_size, -1),
                                     ("auto_parallel", auto_parallel, False),
                                     ("enable_attention_dp", enable_attention_dp, False)):
            if value != default:
                raise OutOfContractError(f"Mapping.{flag}", f"{value!r} is not modelled (only the TP / PP / CP split)")
        if tp_size * pp_size * cp_size != world_size:
            raise ValueError(f"world_size must equal to tp_size * pp_size * cp_size, but got {world_size} != "
                             f"{tp_size} * {pp_size} * {cp_size}.")
        if not isinstance(rank, int):  # the library's range test (`rank < 0 and rank >= world_size`) never fires
            raise ValueError(f"Rank should be an integer between 0 and {world_size - 1}, but got {rank}.")
        self.world_size, self.rank, self.gpus_per_node = world_size, rank, gpus_per_node
        self.tp_size, self.pp_size, self.cp_size = tp_size, pp_size, cp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def pp_rank(self) -> int:
        return self.rank // (self.tp_size * self.cp_size)

    @property
    def cp_rank(self) -> int:
        return self.rank % (self.tp_size * self.cp_size) // self.tp_size


@dataclasses.dataclass
class MnnvlConfig:
    """``flashinfer.comm.mnnvl.MnnvlConfig``."""

    comm_backend: Any = None
    allocation_granularity: int = 0
    fabric_page_size: int = 1 << 29


# ---- the workspace -----------------------------------------------------------------------------


@dataclasses.dataclass
class _Fabric:
    """What one rank's workspace must hold for the exchange: the mapped communicator and its place in it."""

    comm: Any
    comm_rank: int
    comm_size: int
    allocation: str  # the same on every rank of one allocation
    initialised: set = dataclasses.field(default_factory=set)  # rows this rank reset


def decode_cp_a2a_workspace_size(cp_size: int) -> int:
    """Bytes per rank: ``computeHelixWorkspaceSizePerRank`` (FIFOs and their sender / receiver infos)."""
    blocks_per_channel = -(-int(cp_size) // _MAX_GROUP_COUNT_PER_BLOCK) * 2  # send and receive
    channels = max(EMULATED_SM_COUNT // blocks_per_channel, 1)
    return (_FIFO_TOTAL_BYTES + 2 * _FIFO_INFO_BYTES) * int(cp_size) * channels


def decode_cp_a2a_allocate_mnnvl_workspace(mapping: Any, *, mnnvl_config: Optional[Any] = None) -> torch.Tensor:
    """The ``[comm size, ws_elems_per_rank]`` int64 workspace, mapped over ``mnnvl_config.comm_backend``."""
    if mnnvl_config is None:
        raise OutOfContractError("mnnvl_config", "None: FlashInfer then maps the workspace over MPI's COMM_WORLD "
                                                 "(mpi4py), which is not modelled")
    ws_bytes = decode_cp_a2a_workspace_size(mapping.cp_size)
    comm = mnnvl_config.comm_backend.Split(mapping.pp_rank * mapping.cp_size + mapping.cp_rank, mapping.tp_rank)
    rank, size = int(comm.Get_rank()), int(comm.Get_size())
    sizes = comm.allgather(ws_bytes)
    assert len(sizes) == size
    assert all(x == ws_bytes for x in sizes), "Not all rank allocating same size."
    allocation = comm.allgather(uuid.uuid4().hex)[0]  # the fabric address every rank maps: rank 0's
    elems = (ws_bytes + 7) // 8
    workspace = torch.zeros(size, 1, dtype=torch.int64).expand(size, elems)
    setattr(workspace, _STATE, _Fabric(comm=comm, comm_rank=rank, comm_size=size, allocation=allocation))
    return workspace


def _fabric(workspace: Any, function: str) -> _Fabric:
    fabric = getattr(workspace, _STATE, None)
    if fabric is None:
        raise OutOfContractError("workspace", f"{function} was given a workspace that did not come from "
                                              "decode_cp_a2a_allocate_mnnvl_workspace (emulated): a plain tensor "
                                              "shared by simulated ranks is not modelled")
    return fabric


def _check_workspace(workspace: torch.Tensor, cp_size: int) -> None:
    if workspace.dtype != torch.int64:
        raise RuntimeError(f"workspace must be int64, got {workspace.dtype}")
    if workspace.dim() != 2:
        raise RuntimeError("workspace must be 2D")
    if workspace.size(0) != cp_size:
        raise RuntimeError(f"workspace first dim must equal cp_size ({workspace.size(0)} != {cp_size})")


def decode_cp_a2a_init_workspace(workspace: torch.Tensor, cp_rank: int, cp_size: int) -> None:
    """Reset row ``cp_rank``'s FIFOs (the library's checks kept)."""
    fabric = _fabric(workspace, "decode_cp_a2a_init_workspace")
    _check_workspace(workspace, cp_size)
    if not 0 <= cp_rank < cp_size:
        raise RuntimeError(f"cp_rank must be in [0, cp_size) (got {cp_rank}, cp_size {cp_size})")
    fabric.initialised.add(int(cp_rank))


# ---- the exchange ------------------------------------------------------------------------------


def _check_alltoall(partial_o: torch.Tensor, softmax_stats: torch.Tensor, cp_size: int) -> None:
    """The op's ``TVM_FFI_ICHECK``s (``csrc/trtllm_dcp_alltoall.cu`` ``alltoallDcpNativeOp``)."""
    for name, t in (("partial_o", partial_o), ("softmax_stats", softmax_stats)):
        if not t.is_contiguous():
            raise RuntimeError(f"{name} must be contiguous")
    if partial_o.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"partial_o must be half or bfloat16, got {partial_o.dtype}")
    if softmax_stats.dtype != torch.float32:
        raise RuntimeError(f"softmax_stats must be float32, got {softmax_stats.dtype}")
    if partial_o.dim() < 2 or softmax_stats.dim() < 2:
        raise RuntimeError("partial_o and softmax_stats must have at least 2 dimensions")
    if partial_o.dim() != softmax_stats.dim():
        raise RuntimeError("partial_o and softmax_stats must have same number of dimensions")
    if partial_o.size(-2) != cp_size:
        raise RuntimeError(f"partial_o second-to-last dim must equal cp_size ({partial_o.size(-2)} != {cp_size})")
    if softmax_stats.size(-2) != cp_size:
        raise RuntimeError(f"softmax_stats second-to-last dim must equal cp_size "
                           f"({softmax_stats.size(-2)} != {cp_size})")
    stats = softmax_stats.size(-1)
    if stats % 2 or stats < 2:
        raise RuntimeError(f"softmax_stats last dim must be even and >= 2, got {stats}")
    if tuple(partial_o.shape[:-2]) != tuple(softmax_stats.shape[:-2]):
        raise RuntimeError(f"batch dimensions must match ({tuple(partial_o.shape[:-2])} vs "
                           f"{tuple(softmax_stats.shape[:-2])})")
    if partial_o.size(-1) * partial_o.element_size() % 16:
        raise RuntimeError("partial_o last dim must be 16-byte aligned")


def decode_cp_a2a_alltoall(partial_o: torch.Tensor, softmax_stats: torch.Tensor, workspace: torch.Tensor,
                           cp_rank: int, cp_size: int,
                           enable_pdl: Optional[bool] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partial_o_out, softmax_stats_out)``: slot ``p`` of the peer axis holds what rank ``p`` sent this rank."""
    del enable_pdl  # launch overlap only
    fabric = _fabric(workspace, "decode_cp_a2a_alltoall")
    _check_alltoall(partial_o, softmax_stats, cp_size)
    _check_workspace(workspace, cp_size)
    sent = {"allocation": fabric.allocation, "cp_rank": int(cp_rank), "initialised": sorted(fabric.initialised),
            "partial_o": partial_o.detach().cpu(), "softmax_stats": softmax_stats.detach().cpu()}
    peers = fabric.comm.allgather(sent)  # in comm rank order: peer p's segment is row p
    if len({p["allocation"] for p in peers}) != 1:
        raise OutOfContractError("workspace", "the ranks passed workspaces of different allocations: their FIFOs "
                                              "are not each other's")
    claimed = [p["cp_rank"] for p in peers]
    if claimed != list(range(fabric.comm_size)):
        raise OutOfRangeRead("cp_rank", f"the ranks of the workspace's communicator passed cp_rank {claimed}: "
                                        "each must pass its own row (its comm rank), or it writes into FIFOs "
                                        "another rank reads")
    missing = sorted(set(range(cp_size)) - {row for p in peers for row in p["initialised"]})
    if missing:
        raise OutOfContractError("workspace", f"rows {missing} were not reset by decode_cp_a2a_init_workspace "
                                              "before the exchange: the kernel would wait on them forever")
    o_out = torch.stack([p["partial_o"][..., cp_rank, :] for p in peers], dim=-2)
    s_out = torch.stack([p["softmax_stats"][..., cp_rank, :] for p in peers], dim=-2)
    return o_out.to(partial_o.device).contiguous(), s_out.to(softmax_stats.device).contiguous()


EMULATIONS = {
    "flashinfer.comm.dcp_alltoall:decode_cp_a2a_workspace_size": decode_cp_a2a_workspace_size,
    "flashinfer.comm.dcp_alltoall:decode_cp_a2a_allocate_mnnvl_workspace": decode_cp_a2a_allocate_mnnvl_workspace,
    "flashinfer.comm.dcp_alltoall:decode_cp_a2a_init_workspace": decode_cp_a2a_init_workspace,
    "flashinfer.comm.dcp_alltoall:decode_cp_a2a_alltoall": decode_cp_a2a_alltoall,
    "flashinfer.comm.mapping:Mapping": Mapping,
    "flashinfer.comm.mnnvl:MnnvlConfig": MnnvlConfig,
}
