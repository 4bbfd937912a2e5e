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
from typing import Any, Mapping

import torch

from .dcp import DcpShard, describe_partial_nans, gen_dcp_shards, partial_nans, run_shard
from .inputs import DecodeInputs

__all__ = ["DcpRankError", "DcpTimeoutError", "run_distributed", "run_distributed_engine"]

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
    findings: list[str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run DCP over ``world`` processes; return the merged ``(out, lse)`` like ``dcp.run_dcp``
    (``findings``: as ``dcp.run_shards``).

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
    try:
        for shard in shards:
            torch.save(shard, os.path.join(workdir, f"shard{shard.rank}.pt"))
        extra = ["--mode", "shard", "--kernel", _kernel_string(kernel)]
        if merge:
            extra += ["--merge", merge]
        if not pass_positions:
            extra += ["--local-positions"]
        _spawn_and_wait(world, workdir, extra, timeout_s)
        result = torch.load(os.path.join(workdir, "result.pt"), weights_only=False)
        if findings is not None and result.get("partial_nans") is not None:
            problem = describe_partial_nans(result["partial_nans"], shards)
            if problem:
                findings.append(problem)
        return result["out"].to(device), result["lse"].to(device)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_distributed_engine(runner: str, inputs: DecodeInputs, case: Any, options: Mapping[str, Any], *,
                           package: str | None = None, timeout_s: float = 300.0) -> list[Any]:
    """Run an engine runner (``engine_check``) once per rank over real processes; the ranks' ``RankResult``s.

    Every rank gets the whole problem (the engine shards it itself) and a
    ``TorchCollectives`` over the default group. A rank whose engine code
    raises reports the exception and the engine function it came from
    (``BackendRaised``).
    """
    from ._mode import ensure_triton_mode

    ensure_triton_mode()
    world = case.dcp
    workdir = tempfile.mkdtemp(prefix="mla-dcp-engine-")
    try:
        torch.save({"inputs": inputs.to("cpu"), "case": case, "options": dict(options)},
                   os.path.join(workdir, "problem.pt"))
        extra = ["--mode", "engine", "--kernel", runner] + (["--package", package] if package else [])
        try:
            _spawn_and_wait(world, workdir, extra, timeout_s)
        except DcpRankError:
            raised = _rank_raised(workdir, world)
            if raised is not None:
                raise raised from None
            raise
        results = []
        for rank in range(world):
            result = torch.load(os.path.join(workdir, f"rank{rank}.result.pt"), weights_only=False)
            results.append(result)
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _rank_raised(workdir: str, world: int) -> Exception | None:
    """The ``BackendRaised`` (or ``EngineCannotRun``) a failed engine rank recorded, if one did."""
    import json

    from .engine_runner import BackendRaised, EngineCannotRun

    for rank in range(world):
        path = os.path.join(workdir, f"rank{rank}.raised.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
            if info.get("error") == "EngineCannotRun":
                return EngineCannotRun(info["text"])
            if info.get("function"):
                return BackendRaised(info["error"], info["text"], info["function"], rank,
                                     tuple(info.get("frames") or ()), info.get("step"))
    return None


def _spawn_and_wait(world: int, workdir: str, extra: list[str], timeout_s: float) -> None:
    """Start ``world`` children (``--rank r`` + ``extra``), wait for all; kill and reap them in every case."""
    procs: list[subprocess.Popen] = []
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        port = _free_port()
        for rank in range(world):
            cmd = [sys.executable, "-m", "pytest_mla.kernels.distributed", "--rank", str(rank),
                   "--world", str(world), "--port", str(port), "--dir", workdir, "--timeout", str(timeout_s), *extra]
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
                return
            if time.monotonic() > deadline:
                hung = [r for r, c in enumerate(codes) if c is None]
                in_kernel = [r for r in hung if not _kernel_returned(workdir, r)]
                raise DcpTimeoutError(f"DCP rank(s) {hung} of {world} did not finish within {timeout_s:g} s "
                                      f"(still in the kernel: {in_kernel}); killed")
            time.sleep(_POLL_S)
    finally:
        _kill_all(procs)


# ---- child side -------------------------------------------------------------------------------


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
    parser.add_argument("--mode", choices=("shard", "engine"), default="shard")
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--merge", default=None)
    parser.add_argument("--package", default=None)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--local-positions", action="store_true")
    args = parser.parse_args(argv)

    import torch.distributed as dist

    from ..core.targets import import_target
    from ._mode import ensure_triton_mode

    ensure_triton_mode()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
    kernel = import_target(args.kernel)

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
        if args.mode == "engine":
            _engine_rank(args, kernel, device, nccl)
        else:
            _shard_rank(args, kernel, device, nccl)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _shard_rank(args: argparse.Namespace, kernel: Any, device: torch.device, nccl: bool) -> None:
    """Our protocol: run the kernel on this rank's shard, all-gather, merge by LSE; rank 0 writes."""
    import torch.distributed as dist

    from ..core.targets import import_target

    if args.merge:
        merge = import_target(args.merge)
    else:
        from .triton_mla import merge_attention_states as merge
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
        torch.save({"out": merged_out.cpu(), "lse": merged_lse.cpu(), "partial_nans": partial_nans(outs, lses)}, tmp)
        os.replace(tmp, os.path.join(args.dir, "result.pt"))


def _engine_rank(args: argparse.Namespace, runner: Any, device: torch.device, nccl: bool) -> None:
    """An engine runner on the whole problem with real collectives; every rank writes its ``RankResult``."""
    import json

    from .collectives import TorchCollectives
    from .engine_runner import RankContext, engine_frames_of, engine_function_of, step_of_exception
    from .interpreter import interpreter_fixes
    from .scratch import poisoned_scratch

    problem = torch.load(os.path.join(args.dir, "problem.pt"), weights_only=False)
    inputs, case = problem["inputs"].to(device), problem["case"]
    collectives = TorchCollectives(device=device if nccl else torch.device("cpu"))
    ctx = RankContext(args.rank, args.world, case.dcp_interleave, collectives, device, case)
    try:
        where = "interpreter" if device.type == "cpu" else str(device)
        with interpreter_fixes(where), poisoned_scratch():
            result = runner(inputs, ctx, problem["options"])
    except BaseException as exc:
        from ..core.errors import StubCalled
        from .emulated.glue import OutOfContractError

        info = {"error": type(exc).__name__, "text": str(exc), "function": engine_function_of(exc, args.package),
                "frames": list(engine_frames_of(exc, args.package)), "step": step_of_exception(exc)}
        if isinstance(exc, OutOfContractError):  # as engine_check does (an OutOfRangeRead is the engine's finding)
            info = {"error": "EngineCannotRun", "text": f"emulated kernel out of contract: {exc}", "function": None}
        if isinstance(exc, StubCalled):  # a library this host lacks, nothing in its place (as engine_check)
            info = {"error": "EngineCannotRun", "text": str(exc), "function": None}
        with open(os.path.join(args.dir, f"rank{args.rank}.raised.json"), "w", encoding="utf-8") as f:
            json.dump(info, f)
        raise
    open(os.path.join(args.dir, f"rank{args.rank}.kernel-done"), "wb").close()
    result.out, result.lse = result.out.cpu(), result.lse.cpu() if result.lse is not None else None
    tmp = os.path.join(args.dir, f"rank{args.rank}.result.tmp")
    torch.save(result, tmp)
    os.replace(tmp, os.path.join(args.dir, f"rank{args.rank}.result.pt"))


if __name__ == "__main__":
    try:
        code = _child_main()
    except Exception:
        traceback.print_exc()
        code = 1
    sys.exit(code)
