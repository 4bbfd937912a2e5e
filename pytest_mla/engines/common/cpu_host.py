"""Host facilities a GPU server has and a CPU host lacks, answered for a kernel check's duration.

An engine's backend code, run on a CPU with emulated kernels, asks the host for
things that change where data lives and how it moves, not what is computed:
tensors placed on ``"cuda"`` by name, pinned host memory (``pin_memory=True``,
``Tensor.pin_memory()``), CUDA streams and events to order copies and kernels.
On a CPU host there is one memory and every copy is synchronous and in order,
so ``cpu_host()`` places "cuda" tensors in host memory, drops the pinning and
answers the stream and event calls with objects that do nothing — never
anything that computes. What it answered is
collected (``HostLog.answered``) and goes into the cell's notes.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch

__all__ = ["HostLog", "cpu_host"]

_FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange", "empty_like", "zeros_like", "ones_like",
              "full_like", "empty_strided", "randn", "rand", "randint", "as_tensor", "linspace")


class HostLog:
    def __init__(self) -> None:
        self.answered: list[str] = []

    def note(self, what: str) -> None:
        if what not in self.answered:
            self.answered.append(what)


class _Stream:
    """A CUDA stream on a host whose work is all synchronous and in order."""

    # what ``torch.cuda.set_stream`` reads of a stream (vLLM's ``current_stream`` sets one it made)
    stream_id, device_index, device_type = 0, 0, 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event or _Event()

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _Event(_Stream):
    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


@contextlib.contextmanager
def cpu_host() -> Iterator[HostLog]:
    """Pinned memory, streams and events answered as a CPU host would, for the block."""
    log = HostLog()
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def on_host(device: Any) -> Any:
        if device is not None and torch.device(device).type == "cuda":
            log.note('tensors placed on "cuda" by name live in host memory')
            return "cpu"
        return device

    def unpinned(factory: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(factory)
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs.pop("pin_memory", False):
                log.note("pin_memory=True allocations made in plain host memory")
            if "device" in kwargs:
                kwargs["device"] = on_host(kwargs["device"])
            return factory(*args, **kwargs)
        return call

    real_to = torch.Tensor.to

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args and isinstance(args[0], (str, torch.device)) and not isinstance(args[0], torch.dtype):
            args = (on_host(args[0]), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = on_host(kwargs["device"])
        return real_to(self, *args, **kwargs)

    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        log.note('tensors placed on "cuda" by name live in host memory')
        return self

    def pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        log.note("Tensor.pin_memory() left the tensor in plain host memory")
        return self

    def stream(*args: Any, **kwargs: Any) -> _Stream:
        log.note("CUDA streams and events answered by no-ops (a CPU host runs everything in order)")
        return _Stream()

    def event(*args: Any, **kwargs: Any) -> _Event:
        log.note("CUDA streams and events answered by no-ops (a CPU host runs everything in order)")
        return _Event()

    try:
        for name in _FACTORIES:
            patch(torch, name, unpinned(getattr(torch, name)))
        patch(torch.Tensor, "pin_memory", pin_memory)
        patch(torch.Tensor, "to", to)
        patch(torch.Tensor, "cuda", cuda)
        for name, value in (("Stream", stream), ("current_stream", stream), ("default_stream", stream),
                            ("Event", event), ("stream", lambda s=None: contextlib.nullcontext()),
                            ("synchronize", lambda *a, **k: None),
                            ("_set_stream_by_id", lambda *a, **k: None)):  # set_stream's call into the driver
            patch(torch.cuda, name, value)
        # the device-generic classes too (vLLM's sparse-MLA index group makes a side stream and events with them;
        # a CPU torch.Stream refuses events); classes, since torch (dynamo) tests isinstance against them
        class Stream(_Stream):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                log.note("CUDA streams and events answered by no-ops (a CPU host runs everything in order)")

        class Event(_Event):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                log.note("CUDA streams and events answered by no-ops (a CPU host runs everything in order)")

        patch(torch, "Stream", Stream)
        patch(torch, "Event", Event)
        yield log
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
