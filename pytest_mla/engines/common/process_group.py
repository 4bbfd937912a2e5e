"""The one DCP group stand-in for every engine: an engine's group coordinator over the harness's collectives.

An engine's attention code asks its DCP group for its size and rank and to
gather or reduce across it (vLLM's and SGLang's ``GroupCoordinator``). In a
check the exchange is the harness's (``kernels/collectives.py``): ranks
taking turns as threads of this process, or real gloo processes. This module
is that group once, for every engine package (SGLang's own in-process group
moves onto it later):

* ``DcpGroup``: the coordinator the engine's code holds;
* ``InProcessGroup`` and ``torch_collectives_in_process``: the
  ``device_group`` of in-process ranks, and ``torch.distributed`` calls that
  name it as ``group=`` routed to the collectives, as NCCL would route them;
* ``ThreadBound`` and ``PerThread``: a process-wide engine object (the
  current DCP group, a scratch-buffer manager) that each rank thread sees as
  its own.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from .shared_scope import SharedScope

__all__ = ["DcpGroup", "InProcessGroup", "PerThread", "ThreadBound", "torch_collectives_in_process"]


class DcpGroup:
    """What an engine's DCP attention path asks of a ``GroupCoordinator``, over the harness's collectives."""

    def __init__(self, collectives: Any, device: Any) -> None:
        self._c = collectives
        self.world_size = collectives.world
        self.rank_in_group = collectives.rank
        self.rank = collectives.rank
        self.ranks = list(range(collectives.world))
        self.device = device
        group = collectives.process_group
        self.device_group = group if group is not None or collectives.world == 1 else InProcessGroup(collectives)
        self.cpu_group = self.device_group
        self.unique_name = "dcp:pytest-mla"

    def all_gather(self, input_: Any, dim: int = -1) -> Any:
        import torch

        if self.world_size == 1:
            return input_
        return torch.cat(self._c.all_gather(input_.contiguous()), dim=dim)

    def reduce_scatter(self, input_: Any, dim: int = -1) -> Any:
        if self.world_size == 1:
            return input_
        total = self._c.all_reduce(input_.contiguous())
        return total.chunk(self.world_size, dim=dim)[self.rank_in_group].contiguous()

    def all_reduce(self, input_: Any) -> Any:
        return input_ if self.world_size == 1 else self._c.all_reduce(input_.contiguous())


class InProcessGroup:
    """The ``device_group`` of in-process ranks: what ``torch.distributed`` calls name as ``group=``.

    vLLM's MLA prefill gathers the DCP ranks' context with
    ``torch.distributed.all_gather_into_tensor(out, local, group=dcp.device_group)``;
    ``torch_collectives_in_process`` routes such a call to the harness's
    collectives, as NCCL would route it to the ranks.
    """

    def __init__(self, collectives: Any) -> None:
        self.collectives = collectives


_torch_patch = SharedScope("torch.distributed in process")


@contextlib.contextmanager
def torch_collectives_in_process() -> Iterator[None]:
    """``torch.distributed.all_gather_into_tensor`` on an ``InProcessGroup`` runs on its collectives.

    Shared by the rank threads of a check: the first installs it, the last puts the original back.
    """
    with _torch_patch.enter("all_gather_into_tensor", _all_gather_into_tensor_in_process):
        yield


@contextlib.contextmanager
def _all_gather_into_tensor_in_process() -> Iterator[None]:
    import torch
    import torch.distributed as dist

    original = dist.all_gather_into_tensor

    def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        if not isinstance(group, InProcessGroup):
            return original(output_tensor, input_tensor, group=group, async_op=async_op)
        output_tensor.copy_(torch.cat(group.collectives.all_gather(input_tensor.contiguous()), dim=0))
        return None

    dist.all_gather_into_tensor = all_gather_into_tensor
    try:
        yield
    finally:
        dist.all_gather_into_tensor = original


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
