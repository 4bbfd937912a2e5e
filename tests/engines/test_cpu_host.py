"""The host facilities a CPU host answers for emulated checks: placement and ordering, never computation."""

import torch

from pytest_mla.engines.common.cpu_host import cpu_host


def test_cuda_placement_pinning_and_streams_are_answered_by_the_host_and_restored():
    with cpu_host() as host:
        a = torch.zeros(3, device="cuda", pin_memory=True)
        b = torch.arange(4, device=torch.device("cuda")).to("cuda").cuda().pin_memory()
        c = a.to("cuda", torch.float64)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
    assert a.device.type == b.device.type == c.device.type == "cpu" and c.dtype == torch.float64
    assert b.tolist() == [0, 1, 2, 3]
    assert sorted(host.answered) == sorted(['tensors placed on "cuda" by name live in host memory',
                             "pin_memory=True allocations made in plain host memory",
                             "Tensor.pin_memory() left the tensor in plain host memory",
                             "CUDA streams and events answered by no-ops (a CPU host runs everything in order)"])
    try:
        torch.zeros(1, device="cuda")
        restored = torch.cuda.is_available()
    except (RuntimeError, AssertionError):
        restored = True
    assert restored  # outside the block "cuda" means the real device again


def test_device_generic_streams_events_and_set_stream_are_answered_and_restored():
    """vLLM's sparse-MLA index group orders its conversion with ``torch.Stream`` / ``torch.Event`` and
    ``current_stream`` sets a stream it made through ``torch.cuda.set_stream``."""
    real_stream, real_event, real_set = torch.Stream, torch.Event, torch.cuda._set_stream_by_id
    with cpu_host():
        side, ready = torch.Stream(device="cpu"), torch.Event()
        side.wait_event(ready)
        with side:
            ready.record(side)
        torch.cuda.set_stream(torch.cuda.Stream())
    assert (torch.Stream, torch.Event, torch.cuda._set_stream_by_id) == (real_stream, real_event, real_set)
