"""Checks of an engine's *own* attention path (``KernelSpec.protocol == "engine"``).

For a real engine the only thing of ours in the comparison is the float64
reference: the engine's backend (or its kernel entry point, called as its
backend calls it) computes, the engine shards its cache for DCP and the
engine's merge function combines the ranks. The harness generates the
inputs, runs one *engine runner* per DCP rank, and compares what the ranks
hold afterwards with ``ref_mla_decode`` on the unsharded cache.

An engine runner is a module-level callable named by ``KernelSpec.target``::

    def run(inputs: DecodeInputs, ctx: RankContext, options: Mapping[str, Any]) -> RankResult

* ``inputs``: the whole DCP group's problem, unsharded: every request's
  paged cache (shuffled block table, NaN past each length), ``q`` with all
  ``case.h_q`` query heads the group computes, the tree mask of a
  speculative tree. The runner lays them out as the engine does (its pools,
  its per-rank shard, its metadata) and slices the heads its rank owns.
* ``ctx``: the rank, the world size, the collectives that connect the ranks
  (in process or real ``torch.distributed``), the device, the case.
* ``options``: ``KernelSpec.options`` (what the adapter resolved).

It returns the rank's result *after the engine's merge*: ``out`` ``[b, s_q,
h, d_v]`` for the heads ``heads = (start, stop)`` it holds (``None``: all of
them), the ``lse`` ``[b, h, s_q]`` when the engine's path returns one, and the
engine functions that ran. An exception raised inside the engine's package
(``KernelSpec.package``) is a finding, ``BackendRaised``, naming the engine
function where it was raised; an ``AdapterError`` is the adapter's own
failure.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch

from ..core.errors import AdapterError, StubCalled
from ..core.kernelspec import KernelSpec
from .collectives import Collectives, run_ranks_in_process
from .engine_runner import BackendRaised, EngineCannotRun, EngineRunner, RankContext, RankResult, engine_function_of
from .inputs import free_slot_value, free_slots

#: Recorded on interpreted bf16 checks (see ``interpreter.interpreter_fixes`` and docs/troubleshooting.md).
BF16_NOTE = "bf16 tl.dot operands widened to fp32 inside Triton's interpreter (bf16_dot_fix)"

#: What a cell whose kernels were emulated did not check (its notes say so).
EMULATED_NOTE = ("kernels emulated in float64 from the libraries' contracts: the engine's own code around them "
                 "ran (metadata, page tables, layouts, scales, DCP gather and merge); not checked: the kernels' "
                 "numerics, CUDA-graph capture and replay, split-KV schedules, fused kernels gated off on this host")

#: A check whose output turned NaN or Inf on caches whose free slots are NaN, and that matched with those
#: slots zero-filled (``free_slot_only``): the state the engines' own caches start in.
FREE_SLOT_NOTE = ("free slots: the output turned non-finite with the caches' free slots NaN-poisoned, and matched "
                  "the float64 reference with them zero-filled, as SGLang and vLLM allocate their caches "
                  "(torch.zeros): only a NaN or Inf in a free slot reaches the output (hardening: a missing mask, "
                  "not a wrong output on the engine's own cache)")

__all__ = ["BF16_NOTE", "EMULATED_NOTE", "FREE_SLOT_NOTE", "BackendRaised", "EngineCannotRun", "EngineRunner", "RankContext", "RankResult", "engine_function_of", "run_engine_check"]


def run_engine_check(case: Any, spec: KernelSpec, *, dcp_mode: str = "in-process", where: str = "interpreter",
                     timeout_s: float = 300.0) -> dict[str, Any]:
    """Run ``spec``'s engine runner on ``case`` over ``case.dcp`` ranks and compare with the reference.

    Returns the kernel record (plain values). Raises ``BackendRaised`` when
    the engine's code raised; other exceptions (the adapter's, the harness's)
    propagate.
    """
    from ._mode import ensure_triton_mode
    from .compare import tolerance_for
    from .harness import gen_checked_inputs, kv_scale_variants, merge_variants, schedule_case

    ensure_triton_mode()
    tol = tolerance_for(case.dtype, case.kv_dtype, fp8_dots=spec.fp8_dots)
    records = []
    split_from = spec.option_map.get("split_from")  # the backend splits from this many cached tokens per rank
    if split_from:  # the lengths that take the backend's split schedule first: a failure there leads the record
        long = schedule_case(case, int(split_from))
        kv_scale = kv_scale_variants(long)[0]
        inputs, power = gen_checked_inputs(long, tol.out, kv_scale=kv_scale)
        record = _run_once(long, spec, inputs, power, tol, dcp_mode=dcp_mode, where=where, timeout_s=timeout_s)
        record["schedule_case"] = True
        records.append(record)
    for i, kv_scale in enumerate(kv_scale_variants(case)):
        inputs, power = gen_checked_inputs(case, tol.out, kv_scale=kv_scale)
        conventions = spec.option_map.get("kv_conventions") if kv_scale not in (None, 1.0) else None
        if not conventions:
            # The first run of the case as a FULL CUDA graph replays it, where the engine pads batches
            # (``graph_padding``): dummy requests after the real ones. The other runs take the batch as is.
            run_spec = _with_option(spec, "graph_padded", True) if i == 0 and spec.option_map.get("graph_padding") \
                else spec
            records.append(_run_once(case, run_spec, inputs, power, tol, dcp_mode=dcp_mode, where=where,
                                     timeout_s=timeout_s))
            continue
        records.append(_run_conventions(case, spec, inputs, power, tol, conventions, dcp_mode=dcp_mode, where=where,
                                        timeout_s=timeout_s))
    return merge_variants(records)


def _with_option(spec: KernelSpec, name: str, value: Any) -> KernelSpec:
    return dataclasses.replace(spec, options=spec.options + ((name, value),))


def _run_conventions(case: Any, spec: KernelSpec, inputs: Any, power: dict, tol: Any,
                     conventions: Any, **run: Any) -> dict[str, Any]:
    """A scaled FP8 cache whose cached tokens an engine may have written in more than one way.

    ``conventions`` (``KernelSpec`` option ``kv_conventions``: name → what the
    cached rows hold) are the ways the engine's own write paths store a token
    under ``k_scale != 1`` (SGLang: its triton and trtllm_mla paths store
    ``K / k_scale``, flashinfer's and the pool's plain doors store ``K``).
    The cache is filled each way in turn (the runner's ``kv_convention``
    option); the backend passes if its decode reads one of them back right,
    and the record says which. Failing every one is a finding reported with
    the first convention's numbers.
    """
    tried = []
    for name, meaning in dict(conventions).items():
        variant = _with_option(spec, "kv_convention", name)
        reference = inputs.stored_unscaled() if name == "raw" else None
        record = _run_once(case, variant, inputs, power, tol, reference=reference, **run)
        record["kv_convention"] = name
        tried.append((name, meaning, record))
        if record["status"] == "verified":
            record.setdefault("notes", []).append(
                f"fp8 cache with k_scale {inputs.kv_scale:g}: cached tokens as {meaning} ({name}); "
                + ("the first convention tried" if len(tried) == 1 else
                   "read wrong as " + ", ".join(f"{m} ({n})" for n, m, _ in tried[:-1])))
            return record
    first = tried[0][2]
    first.setdefault("notes", []).append(
        f"fp8 cache with k_scale {inputs.kv_scale:g}: read wrong whichever way the cached tokens were written: "
        + "; ".join(f"as {m} ({n}): {r['message']}" for n, m, r in tried))
    return first


def _run_once(case: Any, spec: KernelSpec, inputs: Any, power: dict, tol: Any, *, dcp_mode: str, where: str,
              timeout_s: float, reference: Any = None) -> dict[str, Any]:
    """One run of the engine on ``inputs``, compared with the float64 reference of ``reference``
    (default: the same inputs; a write convention may store the cache otherwise)."""
    from .compare import check_close, tolerance_record
    from .harness import union_schedules
    from .emulated.glue import OutOfContractError, OutOfRangeRead
    from .interpreter import interpreter_fixes
    from .scratch import poisoned_scratch
    from .power import output_magnitude
    from .reference import ref_mla_decode
    from ..core.targets import import_target

    from ._mode import is_interpreter

    gpu = torch.cuda.is_available() and not is_interpreter()  # where Triton runs decides, not the caller's label
    device = torch.device("cuda") if gpu else torch.device("cpu")
    if not gpu:
        where = "interpreter" if is_interpreter() else where
    inputs = inputs.to(device)
    options = spec.option_map
    start = time.perf_counter()
    if dcp_mode == "distributed" and case.dcp > 1:
        from .distributed import run_distributed_engine

        results = run_distributed_engine(spec.target, inputs, case, options, package=spec.package,
                                         timeout_s=timeout_s)
    else:
        runner: EngineRunner = import_target(spec.target)

        def one_rank(collectives: Collectives) -> RankResult:
            ctx = RankContext(collectives.rank, collectives.world, case.dcp_interleave, collectives, device, case)
            try:
                return runner(inputs, ctx, options)
            except OutOfRangeRead as exc:  # an index the engine handed the kernel: the engine's finding
                raise BackendRaised.from_exception(exc, spec.package, collectives.rank) from exc
            except OutOfContractError as exc:  # an emulation asked for what it does not model: not-run, never a pass
                raise EngineCannotRun(f"emulated kernel out of contract: {exc}") from exc
            except StubCalled as exc:  # a library this host lacks, nothing in its place: not-run, never a finding
                raise EngineCannotRun(str(exc)) from exc
            except BaseException as exc:
                own = isinstance(exc, (AdapterError, EngineCannotRun))
                if not own and engine_function_of(exc, spec.package) is not None:
                    raise BackendRaised.from_exception(exc, spec.package, collectives.rank) from exc
                raise

        with interpreter_fixes(where), poisoned_scratch():
            results = run_ranks_in_process(one_rank, case.dcp, timeout_s=timeout_s * max(case.dcp, 1))
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start

    truth = (inputs if reference is None else reference).to("cpu")
    ref_out, ref_lse = ref_mla_decode(**truth.ref_args())
    magnitude = output_magnitude(truth)
    out, lse, ref_out_parts, ref_lse_parts = _gather_heads(results, ref_out, ref_lse)
    magnitude = _gather_heads(results, magnitude, ref_lse)[2]
    out_check = check_close("out", out, ref_out_parts, tol.out, magnitude, exchange=case.dcp > 1)
    lse_check = check_close("lse", lse, ref_lse_parts, tol.lse) if lse is not None else None
    checks = [c for c in (out_check, lse_check) if c is not None]
    ok = all(c.ok for c in checks)
    functions = sorted({f for r in results for f in r.functions} | ({spec.function} if spec.function else set()))
    notes = sorted({n for r in results for n in r.notes})
    record = {
        "status": "verified" if ok else "failed",
        "where": where,
        "level": spec.level,
        "function": spec.function or (functions[0] if functions else None),
        "functions": functions,
        "seed": case.seed,
        "case": case.as_dict(),
        "kv_scale": inputs.kv_scale,
        "errors": {"out": out_check.as_dict(), "lse": lse_check.as_dict() if lse_check else None},
        "tolerance": tolerance_record(tol, True, case.dcp > 1),
        "power": power,
        "time_s": round(elapsed, 4),
        "message": None if ok else "; ".join(c.message for c in checks if c.message),
    }
    schedule = union_schedules(r.schedule for r in results)
    if schedule:
        record["schedule"] = schedule
    emulated = sorted({e for r in results for e in r.emulated})
    if (spec.level == "emulated") != bool(emulated):  # a level is a promise: say exactly what ran
        raise RuntimeError(f"engine runner {spec.target}: level {spec.level!r} but emulated callables "
                           f"{emulated or 'none'} ran")
    if emulated:
        record["emulated"] = emulated
        notes.append(EMULATED_NOTE)
    if lse is None:
        notes.append("the engine's path returns no LSE: only the output was compared")
    if where == "interpreter" and case.dtype == "bf16":
        notes.append(BF16_NOTE)
    if notes:
        record["notes"] = notes
    if not ok and _non_finite(out_check) and math.isnan(free_slot_value()) and _matches_with_zeroed_free_slots(
            case, spec, inputs, power, tol, dcp_mode=dcp_mode, where=where, timeout_s=timeout_s, reference=truth):
        record["free_slot_only"] = True
        record.setdefault("notes", []).append(FREE_SLOT_NOTE)
    return record


def _non_finite(check: Any) -> bool:
    """Whether a comparison failed on NaN or Inf positions (the trace of a poisoned slot that was read)."""
    return bool(check.nan_mismatch or check.posinf_mismatch or check.neginf_mismatch)


def _matches_with_zeroed_free_slots(case: Any, spec: KernelSpec, inputs: Any, power: dict, tol: Any, *,
                                    dcp_mode: str, where: str, timeout_s: float, reference: Any) -> bool:
    """Whether the same check matches with every free cache slot zero-filled (the engines' own caches
    start so). A rerun that fails otherwise (raises, or is still out of tolerance) is a plain failure."""
    try:
        with free_slots(0.0):
            again = _run_once(case, spec, inputs.with_free_slots(0.0), power, tol, dcp_mode=dcp_mode, where=where,
                              timeout_s=timeout_s, reference=reference)
    except Exception:  # noqa: BLE001 - it failed otherwise too: the first run's record stands as it is
        return False
    return again["status"] == "verified"


def _gather_heads(results: list[RankResult], ref_out: torch.Tensor, ref_lse: torch.Tensor):
    """Every rank's heads side by side, with the reference's matching heads (along the head dim).

    Ranks that hold all heads are each compared in full; ranks holding slices
    must tile the heads exactly once.
    """
    h_q = ref_out.shape[2]
    spans = [r.heads or (0, h_q) for r in results]
    if all(r.heads is not None for r in results):
        covered = sorted(spans)
        tiles = [s for s in covered]
        if tiles[0][0] != 0 or tiles[-1][1] != h_q or any(a[1] != b[0] for a, b in zip(tiles, tiles[1:])):
            raise ValueError(f"engine runner: the ranks' heads {spans} do not tile the {h_q} query heads")
    for r, (h0, h1) in zip(results, spans):
        if tuple(r.out.shape[:2]) != tuple(ref_out.shape[:2]) or r.out.shape[2] != h1 - h0:
            raise ValueError(f"engine runner: rank output {list(r.out.shape)} does not match heads "
                             f"[{h0}, {h1}) of the reference {list(ref_out.shape)}")
    out = torch.cat([r.out.to("cpu") for r in results], dim=2)
    ref_out_parts = torch.cat([ref_out[:, :, h0:h1] for h0, h1 in spans], dim=2)
    ref_lse_parts = torch.cat([ref_lse[:, h0:h1] for h0, h1 in spans], dim=1)
    if any(r.lse is None for r in results):
        return out, None, ref_out_parts, ref_lse_parts
    lse = torch.cat([r.lse.to("cpu") for r in results], dim=1)
    return out, lse, ref_out_parts, ref_lse_parts

