"""The one DCP group stand-in for every engine: an engine's group coordinator over the harness's collectives.

An engine's attention code asks its DCP group for its size and rank and to
gather, reduce or exchange across it (vLLM's and SGLang's
``GroupCoordinator``). In a check the exchange is the harness's
(``kernels/collectives.py``): ranks taking turns as threads of this process,
or real gloo processes. This module is that group once, for every engine
package:

* ``DcpGroup``: the coordinator the engine's code holds;
* ``InProcessGroup`` and ``torch_collectives_in_process``: the
  ``device_group`` of in-process ranks, and the ``torch.distributed`` calls
  that name it as ``group=`` (a tensor gather, the object collectives, the
  barrier) routed to the collectives, as NCCL or gloo would route them;
* ``ThreadBound`` and ``PerThread``: a process-wide engine object (the
  current DCP group, a scratch-buffer manager) that each rank thread sees as
  its own.

In-process ranks share one process and take turns only inside a
collective; an engine that keeps per-rank state outside the group (SGLang's
``ParallelContext``) passes ``after``, called by each rank when a collective
returns to it, to state its place again.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from .shared_scope import SharedScope

__all__ = ["DcpGroup", "InProcessGroup", "PerThread", "ThreadBound", "torch_collectives_in_process"]


def _nothing() -> None:
    return None


class DcpGroup:
    """What an engine's DCP attention path asks of a ``GroupCoordinator``, over the harness's collectives.

    ``after``: called when each collective returns to the calling rank (see the module docstring).
    ``name``: the coordinator's ``unique_name``; ``cpu_group``: whether it has a CPU group (the device
    group stands in for it) or None there, as the engine's own coordinator would.
    """

    def __init__(self, collectives: Any, device: Any = None, *, after: Callable[[], None] = _nothing,
                 name: str = "dcp:pytest-mla", cpu_group: bool = True) -> None:
        self._c = collectives
        self._after_collective = after
        self.world_size = collectives.world
        self.rank_in_group = collectives.rank
        self.rank = collectives.rank
        self.local_rank = collectives.rank
        self.ranks = list(range(collectives.world))
        self.first_rank, self.last_rank = 0, collectives.world - 1
        self.is_first_rank = collectives.rank == 0
        self.is_last_rank = collectives.rank == collectives.world - 1
        self.device = device
        group = collectives.process_group
        self.device_group = group if group is not None or collectives.world == 1 else InProcessGroup(collectives, after)
        self.cpu_group = self.device_group if cpu_group else None
        self.unique_name = name

    def _after(self, value: Any) -> Any:
        self._after_collective()
        return value

    def all_gather(self, input_: Any, dim: int = -1, output_tensor_list: Any = None) -> Any:
        import torch

        if self.world_size == 1 and output_tensor_list is None:
            return input_
        parts = self._c.all_gather(input_.contiguous())
        if output_tensor_list is not None:
            for out, part in zip(output_tensor_list, parts):
                out.copy_(part)
            return self._after(None)
        return self._after(torch.cat(parts, dim=dim))

    def all_reduce(self, input_: Any) -> Any:
        return input_ if self.world_size == 1 else self._after(self._c.all_reduce(input_.contiguous()))

    def reduce_scatter(self, input_: Any, dim: int = -1) -> Any:
        if self.world_size == 1:
            return input_
        total = self._c.all_reduce(input_.contiguous())
        return self._after(total.chunk(self.world_size, dim=dim)[self.rank_in_group].contiguous())

    reduce_scatter_along_dim = reduce_scatter  # SGLang's name

    def all_to_all_single(self, output: Any, input_: Any, *args: Any, **kwargs: Any) -> None:
        """``torch.distributed.all_to_all_single`` with equal splits: chunk ``j`` of ``input_`` (along
        dim 0) goes to rank ``j``; chunk ``i`` of ``output`` comes from rank ``i``."""
        import torch

        if args or any(kwargs.get(k) is not None for k in ("output_split_sizes", "input_split_sizes")):
            raise NotImplementedError("pytest-mla's in-process DCP group: all_to_all_single with uneven splits")
        parts = self._c.all_gather(input_.contiguous())
        world, rank = self.world_size, self.rank_in_group
        received = [part.reshape(world, -1)[rank] for part in parts]
        output.copy_(torch.cat(received).reshape(output.shape))
        self._after(None)

    def barrier(self) -> None:
        self._c.barrier()
        self._after(None)


class InProcessGroup:
    """The ``device_group`` of in-process ranks: what an engine hands ``torch.distributed`` as ``group=``.

    vLLM's MLA prefill gathers the DCP ranks' context with
    ``torch.distributed.all_gather_into_tensor(out, local, group=dcp.device_group)``; SGLang maps
    FlashInfer's DCP all-to-all workspace over ``TorchDistributedCommBackend(cp_group.device_group)``
    (``rank()``, ``size()``, ``all_gather_object`` / ``broadcast_object_list`` / ``barrier`` on it).
    ``torch_collectives_in_process`` routes such calls to the harness's collectives.
    """

    def __init__(self, collectives: Any, after: Callable[[], None] = _nothing) -> None:
        self.collectives = collectives
        self.after = after

    def rank(self) -> int:
        return self.collectives.rank

    def size(self) -> int:
        return self.collectives.world


_torch_patch = SharedScope("torch.distributed in process")
#: The ``torch.distributed`` functions routed for an ``InProcessGroup``; any other group reaches the real one.
ROUTED = ("all_gather_into_tensor", "all_gather_object", "broadcast_object_list", "barrier")


@contextlib.contextmanager
def torch_collectives_in_process() -> Iterator[None]:
    """``torch.distributed``'s ``ROUTED`` calls on an ``InProcessGroup`` run on its collectives.

    Shared by the rank threads of a check: the first installs it, the last puts the originals back.
    """
    with _torch_patch.enter(ROUTED, _routed_in_process):
        yield


@contextlib.contextmanager
def _routed_in_process() -> Iterator[None]:
    import torch
    import torch.distributed as dist

    original = {name: getattr(dist, name) for name in ROUTED}

    def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        if not isinstance(group, InProcessGroup):
            return original["all_gather_into_tensor"](output_tensor, input_tensor, group=group, async_op=async_op)
        output_tensor.copy_(torch.cat(group.collectives.all_gather(input_tensor.contiguous()), dim=0))
        return None

    def all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
        if not isinstance(group, InProcessGroup):
            return original["all_gather_object"](object_list, obj, group=group)
        object_list[:] = group.collectives.all_gather_object(obj)
        group.after()

    def broadcast_object_list(object_list: list, src: Any = None, group: Any = None, **kwargs: Any) -> None:
        if not isinstance(group, InProcessGroup):
            return original["broadcast_object_list"](object_list, src, group=group, **kwargs)
        if kwargs.get("group_src") is not None:
            src = kwargs["group_src"]
        object_list[:] = group.collectives.all_gather_object(list(object_list))[int(src or 0)]
        group.after()

    def barrier(group: Any = None, **kwargs: Any) -> None:
        if not isinstance(group, InProcessGroup):
            return original["barrier"](group=group, **kwargs)
        group.collectives.barrier()
        group.after()

    routed = {"all_gather_into_tensor": all_gather_into_tensor, "all_gather_object": all_gather_object,
              "broadcast_object_list": broadcast_object_list, "barrier": barrier}
    for name in ROUTED:
        setattr(dist, name, routed[name])
    try:
        yield
    finally:
        for name, fn in original.items():
            setattr(dist, name, fn)


class ThreadBound:
    """A process-wide object whose value each thread binds for itself (the engine's current DCP group)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def bind(self, target: Any) -> None:
        self._local.target = target

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._local, "target", None)
        if target is None:
            raise AttributeError(name)
        return getattr(target, name)


class PerThread:
    """A process-wide object that is ``make()``'s own instance in each thread, made on first use.

    An engine makes some objects once per worker process (vLLM's workspace
    manager); in-process ranks taking turns would otherwise share their state
    across a collective.
    """

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        instance = getattr(self._local, "instance", None)
        if instance is None:
            instance = self._local.instance = self._make()
        return getattr(instance, name)
