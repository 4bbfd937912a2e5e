"""What the plugin calls for an accepted kernel cell: derive a check shape, run it, compare.

``case_for`` turns a cell's coordinates and model into a ``KernelCase`` of plain
values: the model's real head dims and heads per rank, short mixed lengths,
the spec setting's query tokens, the DCP size. It ignores the backend and the
arch, so one case (one result, cached per worker) serves every arch.
``run_kernel_check`` runs it and returns a dict of plain values for the report.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
import time
import zlib
from typing import Any, Callable, Iterable, Mapping

from ..core.kernelspec import DCP_MODES
from ..core.models import ModelConfig
from ..core.spec import parse_spec

__all__ = ["DCP_MODES", "CaseTooLarge", "KernelCase", "case_for", "run_kernel_check", "schedule_case"]

DEFAULT_PAGE_SIZE = 16
#: The longest request a check builds: beyond it a check of a huge DCP size or page size would
#: take hours and gigabytes to say nothing more (every rank holds tokens at far smaller sizes).
MAX_CHECK_TOKENS = 65_536
#: The most DCP ranks a check simulates.
MAX_CHECK_RANKS = 256


class CaseTooLarge(ValueError):
    """A cell whose kernel check would be absurdly large (``not-run``, with this text as the reason)."""
_KV_DTYPES = {"auto": "auto", "bf16": "auto", "fp16": "auto", "fp32": "auto", "fp8": "fp8_e4m3",
              "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


@dataclasses.dataclass(frozen=True)
class KernelCase:
    """One numeric kernel check. Hashable: the per-worker result cache key."""

    mla: bool  # latent cache with V = first d_v columns (h_kv = 1); else GQA with a V cache
    batch: int  # requests
    s_q: int  # query tokens per request (1 + draft tokens under spec verify)
    h_q: int  # query heads per rank (the model's heads / tp)
    h_kv: int  # cached KV heads per rank (1 for MLA)
    d_qk: int  # key width: kv_lora_rank + qk_rope_head_dim for MLA
    d_v: int  # value / output width: kv_lora_rank for MLA
    page_size: int  # tokens per cache page
    dtype: str  # "bf16" / "fp16" / "fp32": q, output and (unless fp8) cache
    kv_dtype: str  # "auto" (= dtype), "fp8_e4m3" or "fp8_e5m2"
    #: The fp8 cache's per-tensor scales the check runs with, one run each (``kv_scale_variants``):
    #: 1.0 (a checkpoint without KV scales) and "calibrated" (one that carries calibrated ones: a scale that is
    #: not a power of two, ``inputs.calibrated_scale``); () unless fp8.
    kv_scales: tuple[float | str, ...]
    seqlens: tuple[int, ...]  # global tokens per request, len == batch
    softmax_scale: float  # the model's scale
    spec_topk: int  # > 1: tree mask; 1: causal (chain or plain decode)
    spec_steps: int  # draft depth (0 without spec)
    dcp: int  # ranks the cache is split over
    dcp_interleave: int  # tokens per rank-block (1 = cyclic)
    seed: int  # input seed, derived from the numbers above
    #: Sparse attention: tokens each query token attends (the indexer's top-k; ``inputs.gen_topk_indices``),
    #: 0 = dense. A check uses fewer than its requests hold (``SPARSE_CHECK_TOPK``), so that the selection
    #: is a strict subset; the engine's own index buffer may be wider (padded with -1).
    sparse_topk: int = 0
    #: A schedule case (``schedule_case``): built for a backend that splits a request's KV from this many
    #: cached tokens per rank, so its power includes a split merge that drops the last split; 0: not one.
    split_from: int = 0

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["seqlens"] = list(self.seqlens)
        d["kv_scales"] = list(self.kv_scales)
        if not self.sparse_topk:
            del d["sparse_topk"]
        if not self.split_from:
            del d["split_from"]
        return d


def _stable_seed(base: int, fields: Mapping[str, Any]) -> int:
    """A seed that depends only on ``base`` and the numeric case (not on process, arch or backend)."""
    text = json.dumps({"base": base, **fields}, sort_keys=True)
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


#: The long request of every case holds at least this many tokens: a 5% softmax-scale error moves
#: the output in proportion to the spread of the attended logits, which grows with the log of
#: the request's length (docs/check-power.md); at 6 tokens it stays inside an fp8 tolerance.
MIN_LONG = 64
#: The sparse selection of a check (``KernelCase.sparse_topk``): fewer tokens than the long request
#: holds (``MIN_LONG``), so each of its query tokens attends a strict subset of what it may see, and a
#: kernel that attends an unselected token, drops a selected one or maps a position to the wrong slot
#: moves the output (docs/check-power.md).
SPARSE_CHECK_TOPK = 32


def _check_seqlens(s_q: int, dcp: int, page_size: int, interleave: int) -> tuple[int, ...]:
    """Short mixed lengths for a check.

    ``long`` exceeds ``dcp * max(page_size, interleave)`` so every rank holds tokens
    (over more than one page), and ``MIN_LONG``; the short ones leave ranks empty under DCP.
    Plain decode: 0 and 1 (nothing to attend / a single token). Spec verify:
    exactly ``s_q`` (the first query sees one token; the kernel's contract needs
    ``S >= s_q``).
    """
    long = max(dcp * max(page_size, interleave) + page_size // 2 + 3, s_q + 5, MIN_LONG)
    return (1, long, 0) if s_q == 1 else (s_q, long)


def schedule_case(case: KernelCase, split_from: int) -> KernelCase:
    """``case`` with the lengths that take a kernel's other schedules (issue 40): one request long enough
    that a backend splitting its KV from ``split_from`` cached tokens per DCP rank splits it on every rank
    (ending mid-page), one that ends one token into a fresh page, one that ends exactly on a page
    boundary, and the shortest (one token, or ``s_q`` under speculative verify). Same heads, dims, dtypes
    and DCP layout; its own seed, derived like every case's from the numbers.
    """
    page, first = case.page_size, max(case.s_q, 1)
    # every rank holds at least split_from of it: a rank's share of a cyclic or block-interleaved layout is
    # within one interleave block of long / dcp
    long = max(split_from * case.dcp, MIN_LONG) + case.dcp * max(page, case.dcp_interleave) + 3
    if long > MAX_CHECK_TOKENS:
        raise CaseTooLarge(f"a schedule case splitting from {split_from:,} tokens would need {long:,} tokens "
                           f"(at most {MAX_CHECK_TOKENS:,} here)")
    seqlens = (first, long, max(page + 1, first), max(2 * page, first))
    fields = {**case.as_dict(), "seqlens": list(seqlens), "batch": len(seqlens), "split_from": split_from}
    base = fields.pop("seed")
    return dataclasses.replace(case, seqlens=seqlens, batch=len(seqlens), split_from=split_from,
                               seed=_stable_seed(base, fields))


def _int_coord(coords: Mapping[str, object], key: str, default: int) -> int:
    value = coords.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or int(value) < 1:
        raise ValueError(f"coordinate {key}={value!r} must be a positive integer")
    return int(value)


def case_for(coords: Mapping[str, object], model: ModelConfig, *, seed: int, dtype: str = "bf16",
             overrides: Mapping[str, Any] | None = None) -> KernelCase:
    """The kernel check of a cell: ``coords`` has model, backend, dcp, spec, arch (+ kv_dtype, page_size, tp).

    ``overrides`` are the case fields an engine decided (``KernelSpec.case``):
    the query heads of one DCP group (``h_q``), the page size and KV dtype as
    the engine resolved them. Lengths and the seed follow from the result.
    One more key, ``min_seqlen``, is not a field: the shortest request an
    engine can be handed (SGLang's decode lengths count the token being
    decoded, so it never decodes a request with no cached token).
    """
    spec = parse_spec(str(coords["spec"]))
    tp = _int_coord(coords, "tp", 1)
    dcp = _int_coord(coords, "dcp", 1)
    page_size = _int_coord(coords, "page_size", DEFAULT_PAGE_SIZE)
    interleave = _int_coord(coords, "dcp_interleave", 1)
    kv_dtype = _KV_DTYPES.get(str(coords.get("kv_dtype", "auto")))
    if kv_dtype is None:
        raise ValueError(f"unsupported kv_dtype {coords.get('kv_dtype')!r} (known: {', '.join(_KV_DTYPES)})")
    if model.num_heads % tp:
        raise ValueError(f"{model.name}: {model.num_heads} heads do not split over tp={tp}")
    h_q = model.num_heads // tp
    h_kv = 1 if model.mla else max(1, model.num_kv_heads // tp)
    topk, steps = (spec.topk, spec.steps) if spec.enabled else (1, 0)
    fields = {
        "mla": model.mla, "batch": 0, "s_q": spec.s_q, "h_q": h_q, "h_kv": h_kv, "d_qk": model.d_qk,
        "d_v": model.d_v, "page_size": page_size, "dtype": dtype, "kv_dtype": kv_dtype, "kv_scales": None,
        "seqlens": (), "softmax_scale": model.softmax_scale,
        "spec_topk": topk, "spec_steps": steps, "dcp": dcp, "dcp_interleave": interleave, "sparse_topk": 0,
    }
    overrides = dict(overrides or {})
    min_seqlen = int(overrides.pop("min_seqlen", 0))
    for key, value in overrides.items():
        if key not in fields or key in ("batch", "seqlens"):
            raise ValueError(f"case override {key!r} is not a KernelCase field one may set")
        fields[key] = _KV_DTYPES.get(value, value) if key == "kv_dtype" else value
    if not fields["kv_dtype"].startswith("fp8"):
        fields["kv_scales"] = ()
    elif fields["kv_scales"] is None:
        fields["kv_scales"] = (1.0, "calibrated")
    else:
        fields["kv_scales"] = tuple(fields["kv_scales"])
    if fields["dcp"] > MAX_CHECK_RANKS:
        raise CaseTooLarge(f"a kernel check simulates at most {MAX_CHECK_RANKS} DCP ranks, not {fields['dcp']}")
    fields["seqlens"] = tuple(max(n, min_seqlen) for n in _check_seqlens(
        fields["s_q"], fields["dcp"], fields["page_size"], fields["dcp_interleave"]))
    if max(fields["seqlens"]) > MAX_CHECK_TOKENS:
        raise CaseTooLarge(f"a kernel check for DCP {fields['dcp']} with page size {fields['page_size']} would "
                           f"need {max(fields['seqlens']):,} tokens per request (at most {MAX_CHECK_TOKENS:,} here)")
    fields["batch"] = len(fields["seqlens"])
    plain = {**fields, "seqlens": list(fields["seqlens"]), "kv_scales": list(fields["kv_scales"])}
    if not plain["sparse_topk"]:  # a dense case's seed is what it was before the field existed
        del plain["sparse_topk"]
    return KernelCase(**fields, seed=_stable_seed(seed, plain))


def _import_kernel(text: str) -> Callable:
    from ..core.targets import import_target
    from ._mode import ensure_triton_mode

    ensure_triton_mode()  # before a Triton module is imported
    return import_target(text)


def gen_case_inputs(case: KernelCase, profile: Any = None, kv_scale: float | str | None = None) -> Any:
    """The seeded, NaN-padded inputs of a case (``inputs.DecodeInputs``), on the CPU.

    ``profile``: the ``inputs.LogitProfile`` q is drawn with (default
    ``inputs.DISCRIMINATING``); ``kv_scale``: an fp8 cache's scale (see
    ``kv_scale_variants``).
    """
    from .inputs import DISCRIMINATING, gen_decode_inputs

    return gen_decode_inputs(
        case.seqlens, s_q=case.s_q, h_q=case.h_q, h_kv=case.h_kv, d_qk=case.d_qk, d_v=case.d_v, mla=case.mla,
        page_size=case.page_size, dtype=case.dtype, kv_dtype=case.kv_dtype, softmax_scale=case.softmax_scale,
        spec_topk=case.spec_topk, spec_steps=case.spec_steps, seed=case.seed,
        logits=DISCRIMINATING if profile is None else profile, dcp=(case.dcp, case.dcp_interleave), kv_scale=kv_scale,
        sparse_topk=case.sparse_topk,
    )


def kv_scale_variants(case: KernelCase) -> list[float | str | None]:
    """The KV-cache scales a case runs with (``KernelCase.kv_scales``): an fp8 cache runs with
    ``k_scale = 1`` (a checkpoint without KV scales, e.g. DeepSeek-V3's FP8 release) and, where
    the engine can load them, a calibrated-style scale that is not a power of two
    (``inputs.calibrated_scale``); other caches have none."""
    return list(case.kv_scales) or [None]


def gen_checked_inputs(case: KernelCase, tol_out: Any, *, kv_scale: float | str | None = None) -> tuple[Any, dict]:
    """Inputs whose check can fail: ``(inputs, power)``.

    Measures the case's power (``power.measure_power``) on the default profile
    and, while a planted fault slips through, on ``inputs.FALLBACK_PROFILES``;
    raises ``power.WeakCheck`` if no profile catches them all — such a case is
    never reported verified.
    """
    inputs, power, _ = _checked_inputs(case, tol_out, kv_scale)
    return inputs, power


#: The checked inputs this process generated, by ``(case, tolerance, kv_scale)``: a case's inputs are
#: a pure function of it (every draw is seeded by the case), and generating them — the planted
#: queries and the power measurement — costs about as much as an engine's emulated run, while one
#: case serves every arch and every backend of a model, DCP size, speculative setting and cache
#: dtype. Each caller gets its own copy of the tensors and of the power record.
_INPUTS_CACHE: "collections.OrderedDict[tuple[Any, ...], tuple[Any, dict, Any]]" = collections.OrderedDict()
_INPUTS_CACHE_SIZE = 32


def _checked_inputs(case: KernelCase, tol_out: Any, kv_scale: float | str | None) -> tuple[Any, dict, Any]:
    """``gen_checked_inputs`` and the inputs' ``power.output_magnitude`` (the check's relative bound
    needs it; the power measurement computes it from the scores it has anyway)."""
    import torch

    key = (case, tol_out, kv_scale)
    hit = _INPUTS_CACHE.get(key)
    if hit is None:
        hit = _INPUTS_CACHE[key] = _generate_checked_inputs(case, tol_out, kv_scale)
        while len(_INPUTS_CACHE) > _INPUTS_CACHE_SIZE:
            _INPUTS_CACHE.popitem(last=False)
    else:
        _INPUTS_CACHE.move_to_end(key)
    inputs, power, magnitude = hit
    fresh = {f.name: getattr(inputs, f.name).clone() for f in dataclasses.fields(inputs)
             if isinstance(getattr(inputs, f.name), torch.Tensor)}
    return dataclasses.replace(inputs, **fresh), copy.deepcopy(power), magnitude.clone()


def _generate_checked_inputs(case: KernelCase, tol_out: Any, kv_scale: float | str | None) -> tuple[Any, dict, Any]:
    from .inputs import DISCRIMINATING, FALLBACK_PROFILES
    from .power import WeakCheck, measure_power_and_magnitude

    profiles = (DISCRIMINATING, *FALLBACK_PROFILES)
    for attempt, profile in enumerate(profiles, start=1):
        inputs = gen_case_inputs(case, profile, kv_scale)
        power, magnitude = measure_power_and_magnitude(inputs, tol_out, dcp=(case.dcp, case.dcp_interleave),
                                                       split_from=case.split_from)
        if not power["undetected"]:
            power["profile"] = profile.as_dict()
            power["attempts"] = attempt
            return inputs, power, magnitude
    raise WeakCheck(f"the check cannot detect {', '.join(power['undetected'])} with any of {len(profiles)} "
                    "input profiles: not verified")


def union_schedules(schedules: Iterable[Mapping[str, Iterable[int]]]) -> dict[str, list[int]]:
    """The schedules of several runs or ranks as one (``{"num_kv_splits": [1, 2]}``): per parameter, every
    value any of them recorded, sorted; {} when none recorded any."""
    union: dict[str, set[int]] = {}
    for schedule in schedules:
        for name, values in schedule.items():
            union.setdefault(name, set()).update(values)
    return {name: sorted(union[name]) for name in sorted(union)}


def merge_variants(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One kernel record from the runs of a case's ``kv_scale_variants`` and its ``schedule_case`` (verified
    only if every run is; ``schedule``: every split count the runs handed their kernel; ``power``: the
    record shown's faults, plus those only another run's case has)."""
    if len(records) == 1:
        return records[0]
    failing = [r for r in records if r["status"] != "verified"]
    main = dict(failing[0] if failing else records[-1])
    main["variants"] = [{"kv_scale": r["kv_scale"], "status": r["status"],
                         "out_max_abs": r["errors"]["out"]["max_abs_err"], "out_cos_diff": r["errors"]["out"]["cos_diff"],
                         **({"seqlens": r["case"]["seqlens"]} if r.get("schedule_case") else {}),
                         **({"schedule": r["schedule"]} if r.get("schedule") else {}),
                         **({"message": r["message"]} if r.get("message") else {})} for r in records]
    schedule = union_schedules(r.get("schedule") or {} for r in records)
    if schedule:
        main["schedule"] = schedule
    main["time_s"] = round(sum(r["time_s"] for r in records), 4)
    undetected = sorted({u for r in records for u in r["power"]["undetected"]})
    faults = dict(main["power"]["faults"])
    for r in records:  # a fault only another run's case can show (a schedule case's split_dropped)
        for name, fault in r["power"]["faults"].items():
            faults.setdefault(name, fault)
    main["power"] = {**main["power"], "faults": faults, "undetected": undetected}
    return main


def run_kernel_check(
    case: KernelCase,
    kernel: Callable | str,
    *,
    dcp_mode: str = "in-process",
    where: str = "interpreter",
    merge: Callable | str | None = None,
    timeout_s: float = 300.0,
    num_splits: int | None = None,
    split_from: int | None = None,
) -> dict[str, Any]:
    """Run ``kernel`` (``mla_decode``'s signature, or ``"module:attr"``) on ``case`` and compare.

    Inputs are fresh and seeded (``case.seed``), the output poisoned; DCP
    shards run in this process (``dcp_mode="in-process"``) or as processes
    (``"distributed"``) and are merged by LSE (``merge``: default Triton
    ``merge_attention_states``). The result is compared with the float64
    reference on the unsharded cache, and every rank's partial must be free of NaN
    (an empty rank gives ``out = 0``, ``lse = -inf``: the merge would hide a NaN).
    ``where`` is only recorded. A kernel that raises propagates (a crash is an
    ``error`` verdict, not a tolerance failure). ``num_splits``: a kernel that takes
    its KV split count as an argument (the project's ``mla_decode``; ``KernelSpec``
    options ``num_splits``, ``split_from``) also runs, first, the ``schedule_case``
    for ``split_from`` cached tokens per rank with that many splits, so its split
    merge is verified on a request every split of which holds tokens, wherever its
    own choice (one split under the interpreter) would not split; the run records
    ``schedule = {"num_kv_splits": [n]}``. In-process only: a distributed rank
    imports the kernel by name.
    """
    if dcp_mode not in DCP_MODES:
        raise ValueError(f"unknown dcp_mode {dcp_mode!r} (known: {', '.join(DCP_MODES)})")
    from ._mode import share_cpu_threads
    from .compare import tolerance_for

    share_cpu_threads()
    tol = tolerance_for(case.dtype, case.kv_dtype)
    records = []
    if num_splits and not (dcp_mode == "distributed" and case.dcp > 1):
        long = schedule_case(case, int(split_from)) if split_from else case
        inputs, power, magnitude = _checked_inputs(long, tol.out, kv_scale_variants(long)[0])
        split = functools.partial(_import_kernel(kernel) if isinstance(kernel, str) else kernel,
                                  num_splits=int(num_splits))
        record = _run_once(long, inputs, power, magnitude, tol, split, dcp_mode=dcp_mode, where=where, merge=merge,
                           timeout_s=timeout_s)
        record["schedule"] = {"num_kv_splits": [int(num_splits)]}
        record["schedule_case"] = long is not case
        records.append(record)
    for kv_scale in kv_scale_variants(case):
        inputs, power, magnitude = _checked_inputs(case, tol.out, kv_scale)
        records.append(_run_once(case, inputs, power, magnitude, tol, kernel, dcp_mode=dcp_mode, where=where,
                                 merge=merge, timeout_s=timeout_s))
    return merge_variants(records)


def _run_once(case: KernelCase, inputs: Any, power: dict, magnitude: Any, tol: Any, kernel: Callable | str, *,
              dcp_mode: str, where: str, merge: Callable | str | None, timeout_s: float) -> dict[str, Any]:
    import torch

    from .compare import check_close, tolerance_record
    from .dcp import gen_dcp_shards, run_shards
    from .reference import ref_mla_decode

    from ._mode import ensure_triton_mode

    # Where Triton actually runs decides the device (and what the record says): a caller's label
    # of "interpreter" on a GPU host would hand a compiled kernel CPU tensors.
    where = ensure_triton_mode()
    if where not in ("interpreter", "cpu") and torch.cuda.is_available():
        inputs = inputs.to("cuda")
    findings: list[str] = []  # rules of the rank partials the kernel broke (a merge would hide them)

    if dcp_mode == "distributed" and case.dcp > 1:
        from .distributed import run_distributed

        merge_text = merge if isinstance(merge, str) or merge is None else f"{merge.__module__}:{merge.__qualname__}"
        start = time.perf_counter()
        out, lse = run_distributed(kernel, inputs, case.dcp, case.dcp_interleave, timeout_s=timeout_s,
                                   merge=merge_text, seed=case.seed, findings=findings)
        elapsed = time.perf_counter() - start
    else:
        kernel_fn = _import_kernel(kernel) if isinstance(kernel, str) else kernel
        merge_fn = _import_kernel(merge) if isinstance(merge, str) else merge
        shards = gen_dcp_shards(inputs, case.dcp, case.dcp_interleave, seed=case.seed)
        if inputs.q.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out, lse = run_shards(kernel_fn, shards, merge=merge_fn, findings=findings)
        if inputs.q.is_cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start

    ref_out, ref_lse = ref_mla_decode(**inputs.to("cpu").ref_args())
    out_check = check_close("out", out, ref_out, tol.out, magnitude, exchange=case.dcp > 1)
    lse_check = check_close("lse", lse, ref_lse, tol.lse)
    ok = out_check.ok and lse_check.ok and not findings
    messages = findings + [c.message for c in (out_check, lse_check) if c.message]
    return {
        "status": "verified" if ok else "failed",
        "where": where,
        "seed": case.seed,
        "case": case.as_dict(),
        "kv_scale": inputs.kv_scale,
        "errors": {"out": out_check.as_dict(), "lse": lse_check.as_dict()},
        "tolerance": tolerance_record(tol, True, case.dcp > 1),
        "power": power,
        "time_s": round(elapsed, 4),
        "message": None if ok else "; ".join(messages),
    }
