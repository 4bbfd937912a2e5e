"""The collectives a DCP rank needs, in one process or over real ``torch.distributed`` ranks.

An engine's cross-rank merge (SGLang's ``cp_lse_ag_out_rs_*``, vLLM's DCP
LSE correction) all-gathers LSEs and reduces outputs *inside* one function
call, so every rank must be inside that call at once. Three implementations
of one small interface (``all_gather`` returns every rank's tensor in rank
order, ``all_reduce`` sums):

* ``SoloCollectives``: one rank, nothing to exchange.
* ``run_ranks_in_process``: one thread per rank that **take turns**: exactly
  one rank runs at any moment and the turn passes only at a collective (or
  when a rank returns), in rank order. The engine's code therefore runs
  unchanged, one rank at a time, which also keeps the Triton interpreter
  (which patches ``triton.language`` while a kernel runs) single-threaded.
  A rank that raises aborts the others; a rank that returns while the others
  wait in a collective is reported instead of hanging.
* ``TorchCollectives``: a real process group (gloo on loopback, nccl with one
  GPU per rank), used by ``--mla-dcp-mode=distributed``.

An engine adapter wraps these in whatever its merge function expects (a
stand-in for SGLang's ``GroupCoordinator``, say); in distributed mode it may
build the engine's own group on top of ``process_group`` instead.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Protocol, Sequence, TypeVar

import torch

__all__ = ["Collectives", "CollectiveError", "SoloCollectives", "TorchCollectives", "run_ranks_in_process"]

T = TypeVar("T")


class CollectiveError(RuntimeError):
    """The ranks did not meet: one failed, returned early, or the wait timed out."""


class Collectives(Protocol):
    rank: int
    world: int
    #: A ``torch.distributed`` process group over the ranks (distributed mode), else None.
    process_group: Any

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape on all ranks), in rank order."""
        ...

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of every rank's ``tensor`` (a new tensor)."""
        ...

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (a picklable Python object, tensors included), in rank order; copies."""
        ...

    def barrier(self) -> None:
        ...


class SoloCollectives:
    """World size 1."""

    rank, world, process_group = 0, 1, None

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor.clone()]

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [copy.deepcopy(obj)]

    def barrier(self) -> None:
        pass


# ---- in process: ranks as threads that take turns --------------------------------------------


class _TurnTable:
    """Shared state of the rank threads: whose turn it is, the collectives in flight."""

    def __init__(self, world: int, timeout_s: float) -> None:
        self.world = world
        self.timeout_s = timeout_s
        self.cond = threading.Condition()
        self.turn = 0
        self.done: set[int] = set()
        self.calls = [0] * world  # collectives entered so far, per rank
        self.pending: dict[int, dict[int, torch.Tensor]] = {}  # call index -> rank -> tensor
        self.results: dict[int, Any] = {}
        self.labels: dict[int, str] = {}
        self.abort: str | None = None

    def pass_turn(self, rank: int) -> None:
        """Give the turn to the next rank that has not returned (caller holds ``cond``)."""
        for step in range(1, self.world + 1):
            nxt = (rank + step) % self.world
            if nxt not in self.done:
                self.turn = nxt
                break
        self.cond.notify_all()

    def wait(self, predicate: Callable[[], bool], what: str) -> None:
        if not self.cond.wait_for(lambda: self.abort is not None or predicate(), timeout=self.timeout_s):
            self.abort = self.abort or f"{what}: no progress within {self.timeout_s:g} s"
            self.cond.notify_all()
        if self.abort is not None:
            raise CollectiveError(self.abort)


class _ThreadCollectives:
    def __init__(self, table: _TurnTable, rank: int) -> None:
        self._table = table
        self.rank = rank
        self.world = table.world
        self.process_group = None

    def _collective(self, label: str, value: Any, combine: Callable[[list[Any]], Any]) -> Any:
        t = self._table
        with t.cond:
            index = t.calls[self.rank]
            t.calls[self.rank] += 1
            slot = t.pending.setdefault(index, {})
            if t.labels.setdefault(index, label) != label:
                t.abort = (f"collective #{index}: rank {self.rank} called {label} while another rank "
                           f"called {t.labels[index]}")
                t.cond.notify_all()
                raise CollectiveError(t.abort)
            slot[self.rank] = value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            if len(slot) == t.world:
                t.results[index] = combine([slot[r] for r in range(t.world)])
            t.pass_turn(self.rank)
            t.wait(lambda: index in t.results and t.turn == self.rank, f"rank {self.rank} in {label} #{index}")
            return t.results[index]

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [x.clone() for x in self._collective("all_gather", tensor, lambda xs: xs)]

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._collective("all_reduce", tensor, lambda xs: torch.stack(xs).sum(0).to(xs[0].dtype)).clone()

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [copy.deepcopy(x) for x in self._collective("all_gather_object", obj, lambda xs: xs)]

    def barrier(self) -> None:
        self._collective("barrier", None, lambda xs: None)


def run_ranks_in_process(fn: Callable[[Collectives], T], world: int, *, timeout_s: float = 300.0) -> list[T]:
    """Run ``fn(collectives)`` for ranks ``0..world-1`` in this process, taking turns; results in rank order.

    The first exception of any rank is re-raised here (the others are aborted
    at their next collective). ``timeout_s`` bounds each wait for the turn.
    """
    if world == 1:
        return [fn(SoloCollectives())]
    table = _TurnTable(world, timeout_s)
    results: list[Any] = [None] * world
    errors: list[BaseException | None] = [None] * world

    def body(rank: int) -> None:
        with table.cond:
            try:
                table.wait(lambda: table.turn == rank, f"rank {rank} waiting to start")
            except CollectiveError as exc:
                errors[rank] = exc
                table.done.add(rank)
                return
        try:
            results[rank] = fn(_ThreadCollectives(table, rank))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors[rank] = exc
            with table.cond:
                if table.abort is None:
                    table.abort = f"rank {rank} failed: {type(exc).__name__}: {exc}"
        finally:
            with table.cond:
                table.done.add(rank)
                waiting = [i for i, slot in table.pending.items() if i not in table.results and rank not in slot]
                if waiting and table.abort is None:
                    table.abort = (f"rank {rank} returned while other ranks wait in collective #{waiting[0]} "
                                   f"({table.labels[waiting[0]]})")
                table.pass_turn(rank)

    threads = [threading.Thread(target=body, args=(r,), name=f"mla-dcp-rank{r}", daemon=True) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    first = _first_error(errors)
    if first is not None:
        raise first
    return results


def _first_error(errors: Sequence[BaseException | None]) -> BaseException | None:
    """The root cause: a rank's own exception before the aborts it caused in the others."""
    own = [e for e in errors if e is not None and not isinstance(e, CollectiveError)]
    if own:
        return own[0]
    return next((e for e in errors if e is not None), None)


# ---- real processes ---------------------------------------------------------------------------


class TorchCollectives:
    """``torch.distributed`` collectives over ``group`` (the default group when None).

    gloo lacks kernels for some dtypes, so low-precision tensors travel as fp32
    (exact for bf16/fp16) and come back in their own dtype.
    """

    def __init__(self, group: Any = None, device: torch.device | None = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.process_group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self._device = device

    def _wire(self, tensor: torch.Tensor) -> torch.Tensor:
        x = tensor.detach().contiguous()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.to(self._device) if self._device is not None else x

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        x = self._wire(tensor)
        parts = [torch.empty_like(x) for _ in range(self.world)]
        self._dist.all_gather(parts, x, group=self.process_group)
        return [p.to(tensor.device, tensor.dtype) for p in parts]

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        x = self._wire(tensor).clone()
        self._dist.all_reduce(x, group=self.process_group)
        return x.to(tensor.device, tensor.dtype)

    def all_gather_object(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world
        self._dist.all_gather_object(gathered, obj, group=self.process_group)
        return gathered

    def barrier(self) -> None:
        self._dist.barrier(group=self.process_group)
