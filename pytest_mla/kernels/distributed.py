"""``--mla-dcp-mode=distributed``: DCP over real processes, the exchange an engine performs.

The parent shards the cache (``dcp.gen_dcp_shards``), writes one file per rank
and starts ``N`` children (``python -m pytest_mla.kernels.distributed``). Each
child joins a ``torch.distributed`` group on loopback (gloo on CPU, nccl when
every rank has its own GPU), runs the kernel on its shard with every query
head, all-gathers ``(out, lse)`` and merges by LSE; rank 0 writes the merged
result for the parent.

The kernel travels as an import string ``"module:attr"``; children get the
parent's ``sys.path`` and environment (``TRITON_INTERPRET`` included, decided
in the parent before any start). Children run in their own session and are
always cleaned up: SIGTERM to the group, then SIGKILL, on success, error and
timeout. A rank that hangs becomes ``DcpTimeoutError`` after ``timeout_s``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import torch

from .dcp import DcpShard, gen_dcp_shards, run_shard
from .inputs import DecodeInputs

__all__ = ["DcpRankError", "DcpTimeoutError", "run_distributed"]

_POLL_S = 0.05
_TERM_GRACE_S = 2.0


class DcpTimeoutError(TimeoutError):
    """A DCP rank did not finish in time; every rank process has been killed."""


class DcpRankError(RuntimeError):
    """A DCP rank process failed; the message holds the tail of its stderr."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each child's process group, wait a moment, SIGKILL what is left, reap all."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)  # start_new_session=True: the group id is the child's pid
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _TERM_GRACE_S
        for p in alive:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    for p in procs:
        if p.poll() is None:
            p.wait()


def _tail(path: str, limit: int = 3000) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-limit:]
    except OSError:
        return ""


def _kernel_returned(workdir: str, rank: int) -> bool:
    """Whether ``rank`` got past its kernel call (it leaves a marker file)."""
    return os.path.exists(os.path.join(workdir, f"rank{rank}.kernel-done"))


def _kernel_string(kernel) -> str:
    if isinstance(kernel, str):
        return kernel
    return f"{kernel.__module__}:{kernel.__qualname__}"


def run_distributed(
    kernel,
    inputs: DecodeInputs,
    world: int,
    interleave: int = 1,
    *,
    timeout_s: float = 300.0,
    pass_positions: bool = True,
    merge: str | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run DCP over ``world`` processes; return the merged ``(out, lse)`` like ``dcp.run_dcp``.

    ``kernel``: ``"module:attr"`` (or a module-level callable, turned into that
    string). ``merge``: ``"module:attr"`` of the merge function; default the
    Triton ``merge_attention_states``. Raises ``DcpTimeoutError`` when the ranks
    have not all finished within ``timeout_s`` (start-up included) and
    ``DcpRankError`` when one fails.
    """
    from ._mode import ensure_triton_mode

    ensure_triton_mode()  # decide TRITON_INTERPRET here so every child inherits the same answer
    device = inputs.q.device
    shards = gen_dcp_shards(inputs.to("cpu"), world, interleave, seed=seed)
    workdir = tempfile.mkdtemp(prefix="mla-dcp-")
    procs: list[subprocess.Popen] = []
    try:
        for shard in shards:
            torch.save(shard, os.path.join(workdir, f"shard{shard.rank}.pt"))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        port = _free_port()
        for rank in range(world):
            cmd = [sys.executable, "-m", "pytest_mla.kernels.distributed", "--rank", str(rank),
                   "--world", str(world), "--port", str(port), "--dir", workdir,
                   "--kernel", _kernel_string(kernel), "--timeout", str(timeout_s)]
            if merge:
                cmd += ["--merge", merge]
            if not pass_positions:
                cmd += ["--local-positions"]
            with open(os.path.join(workdir, f"rank{rank}.log"), "wb") as log:
                procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                time.sleep(0.5)  # let the other ranks notice and exit, then report every failure
                codes = [p.poll() for p in procs]
                failed = sorted((r for r, c in enumerate(codes) if c not in (None, 0)),
                                key=lambda r: _kernel_returned(workdir, r))  # ranks failing in the kernel first
                raise DcpRankError(f"DCP rank(s) {failed} of {world} failed:\n" + "\n".join(
                    f"--- rank {r} (exit {codes[r]}) ---\n" + _tail(os.path.join(workdir, f"rank{r}.log"))
                    for r in failed))
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                hung = [r for r, c in enumerate(codes) if c is None]
                in_kernel = [r for r in hung if not _kernel_returned(workdir, r)]
                raise DcpTimeoutError(f"DCP rank(s) {hung} of {world} did not finish within {timeout_s:g} s "
                                      f"(still in the kernel: {in_kernel}); killed")
            time.sleep(_POLL_S)
        result = torch.load(os.path.join(workdir, "result.pt"), weights_only=False)
        return result["out"].to(device), result["lse"].to(device)
    finally:
        _kill_all(procs)
        shutil.rmtree(workdir, ignore_errors=True)


# ---- child side -------------------------------------------------------------------------------


def _import_string(text: str):
    import importlib

    module, _, attr = text.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _shard_to(shard: DcpShard, device: torch.device) -> DcpShard:
    shard.inputs = shard.inputs.to(device)
    shard.global_seqlens = shard.global_seqlens.to(device)
    return shard


def _child_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest_mla.kernels.distributed")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--merge", default=None)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--local-positions", action="store_true")
    args = parser.parse_args(argv)

    import torch.distributed as dist

    from ._mode import ensure_triton_mode

    ensure_triton_mode()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
    kernel = _import_string(args.kernel)
    if args.merge:
        merge = _import_string(args.merge)
    else:
        from .triton_mla import merge_attention_states as merge

    use_cuda = torch.cuda.is_available()
    nccl = use_cuda and torch.cuda.device_count() >= args.world
    device = torch.device(f"cuda:{args.rank % torch.cuda.device_count()}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if nccl else "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=args.timeout),
    )
    try:
        shard = _shard_to(torch.load(os.path.join(args.dir, f"shard{args.rank}.pt"), weights_only=False), device)
        out, lse = run_shard(kernel, shard, pass_positions=not args.local_positions)
        open(os.path.join(args.dir, f"rank{args.rank}.kernel-done"), "wb").close()
        # Exchange in fp32 (exact for bf16/fp16); gloo has no kernels for every dtype.
        comm = device if nccl else torch.device("cpu")
        out32, lse32 = out.float().contiguous().to(comm), lse.float().contiguous().to(comm)
        outs = [torch.empty_like(out32) for _ in range(args.world)]
        lses = [torch.empty_like(lse32) for _ in range(args.world)]
        dist.all_gather(outs, out32)
        dist.all_gather(lses, lse32)
        merged_out, merged_lse = merge([o.to(device, out.dtype) for o in outs], [x.to(device) for x in lses])
        if args.rank == 0:
            tmp = os.path.join(args.dir, "result.tmp")
            torch.save({"out": merged_out.cpu(), "lse": merged_lse.cpu()}, tmp)
            os.replace(tmp, os.path.join(args.dir, "result.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = _child_main()
    except Exception:
        traceback.print_exc()
        code = 1
    sys.exit(code)
