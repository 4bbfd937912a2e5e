"""The reproducer of an SGLang finding at level ``backend``: SGLang's own objects, one step, no pytest.

The script (``sglang_backend.py.tmpl``) rebuilds what ``engines/sglang``'s
kernel check builds for the cell (server arguments through SGLang's parser and
resolution, its pools, allocator and index translator, the backend from its
attention registry, a ``ForwardBatch``, the model's attention path, DCP ranks
as turn-taking threads) and compares with a float64 reference of its own when
SGLang raises nothing. Only the decode backends that run without a GPU are
taken (Triton's, under the interpreter); the numbers below mirror the check's
(``NUM_KV_SPLITS``, the tolerance table for SGLang's Triton kernels, which
round q and P to an fp8 cache's dtype), and a test holds them to
``engines/sglang/checks.py`` and ``kernels/compare.py``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ... import __version__
from ...core.spec import parse_spec
from ..findings import finding_facts
from ..serving import serve_command
from .templates import Context, Template, doc_safe, script_text

__all__ = ["SGLangBackendTemplate", "DECODE_BACKENDS", "EMULATED_BACKENDS", "NUM_KV_SPLITS", "TOLERANCES",
           "inlined_emulations"]

#: Backend classes SGLang resolves that this template can run here → their name in ATTENTION_BACKENDS:
#: Triton's (under the interpreter without a GPU) and torch_native's run as they are.
DECODE_BACKENDS = {"TritonAttnBackend": "triton", "TorchNativeAttnBackend": "torch_native"}
#: CUDA backends whose cells ran at level "emulated": the script inlines the same float64 emulations of
#: their kernel libraries (pytest_mla/kernels/emulated) and states the cell's GPU to SGLang.
EMULATED_BACKENDS = {"FlashInferMLAAttnBackend": "flashinfer", "FlashInferAttnBackend": "flashinfer",
                     "FlashAttentionBackend": "fa3", "FlashMLABackend": "flashmla", "TRTLLMMLABackend": "trtllm_mla",
                     "CuteDslMLABackend": "cutedsl_mla", "TRTLLMHAAttnBackend": "trtllm_mha"}
#: The package the inlined emulations load as inside a script (never pytest_mla: it must not be importable).
INLINED_PACKAGE = "mla_emulations"
#: --triton-attention-num-kv-splits of the kernel check (engines/sglang/checks.py NUM_KV_SPLITS).
NUM_KV_SPLITS = 2
#: The check's tolerance for SGLang's Triton kernels (kernels/compare.py: TOLERANCES["bf16"] and, for an
#: fp8 cache, FP8_DOT_TOLERANCES: the kernels round q and P to the cache's dtype).
TOLERANCES = {
    "auto": {"abs": 1e-3, "rel": 2.01 / 128, "cos": 1e-5},
    "fp8_e4m3": {"abs": 3e-2, "rel": 2.0 ** -3, "cos": 1e-4},
    "fp8_e5m2": {"abs": 6e-2, "rel": 2.0 ** -2, "cos": 1e-4},
}
_ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "nextn": "NEXTN"}
_CASE_FIELDS = ("seqlens", "h_q", "d_qk", "d_v", "mla", "seed", "page_size", "kv_dtype")


class SGLangBackendTemplate(Template):
    name = "sglang backend"
    describes = ("resolves the cell's serve arguments with SGLang's own parser, builds one step's objects per DCP "
                 "rank as a server's model runner does (ReqToTokenPool, the MLA or MHA KV pool, the paged "
                 "allocator, KVIndexTranslator, the attention backend from SGLang's registry, a ForwardBatch, the "
                 "model's attention layer), runs the model's attention path with the DCP ranks as turn-taking "
                 "threads, and compares with a float64 reference when SGLang raises nothing")

    def applies(self, ctx: Context) -> str | None:
        if ctx.engine != "sglang":
            return f"not an SGLang finding (engine {ctx.engine or 'unknown'})"
        level = ctx.kernel.get("level")
        if level not in ("backend", "emulated"):
            return f"the check ran at level {level!r}, not 'backend' or 'emulated'"
        decode = _decode_class(ctx)
        runnable = DECODE_BACKENDS if level == "backend" else EMULATED_BACKENDS
        if decode not in runnable:
            return (f"the decode backend {decode} at level {level!r} has no reproducer (this template runs "
                    f"{', '.join(DECODE_BACKENDS)} as they are and {', '.join(EMULATED_BACKENDS)} around emulated "
                    "kernels)")
        case = ctx.kernel.get("case") or {}
        missing = [f for f in _CASE_FIELDS if f not in case]
        if missing:
            return f"the record's kernel.case lacks {', '.join(missing)}"
        if ctx.config_json is None:
            return f"no weightless config.json ships for model {ctx.model.name!r} (pytest_mla/engines/model_configs)"
        return None

    def constants(self, ctx: Context) -> dict[str, tuple[Any, str]]:
        case = ctx.kernel["case"]
        coords = ctx.coords
        spec = parse_spec(str(coords.get("spec", "none")))
        dcp = max(int(coords.get("dcp", 1)), 1)
        decode = _decode_class(ctx)
        emulated = ctx.kernel.get("level") == "emulated"
        facts = finding_facts(ctx.record, ctx.engine)
        kv = str(case["kv_dtype"])
        # Triton's kernels round q and P to an fp8 cache's dtype (its looser table); the others do not
        default = TOLERANCES.get(kv, TOLERANCES["auto"]) if decode == "TritonAttnBackend" else TOLERANCES["auto"]
        tolerance = (ctx.kernel.get("tolerance") or {}).get("out") or default
        kv_scale = _kv_scale(ctx)
        conventions = ["scaled", "raw"] if kv_scale is not None and case.get("mla") else ["scaled"]
        speculative = None
        if spec.enabled:
            speculative = {"algorithm": _ALGORITHMS.get(spec.algorithm or "", "EAGLE"), "topk": spec.topk,
                           "steps": spec.steps, "draft_tokens": spec.num_draft_tokens}
        return {
            "CELL": (str(ctx.record.get("id")), "the pytest-mla cell"),
            "MODEL_CONFIG": (dict(ctx.config_json or {}), f"{ctx.model.name}'s config.json, without weights"),
            "ATTENTION_BACKEND": (_backend_name(ctx), f"SGLang resolved {coords.get('backend')} to {decode}"),
            "TP": (int(coords["tp"]) if coords.get("tp") is not None else dcp, "--tp-size"),
            "DCP": (dcp, "--dcp-size: decode context parallel ranks"),
            "PAGE_SIZE": (int(case["page_size"]), "--page-size as SGLang resolved it"),
            "KV_CACHE_DTYPE": (kv, "--kv-cache-dtype as SGLang resolved it"),
            "KV_SCALE": (kv_scale, "the checkpoint's calibrated k_scale = v_scale of the fp8 cache (None: 1.0, none)"),
            "KV_CONVENTIONS": (conventions, "how the cached fp8 rows hold their tokens, each tried (see "
                                            "CONVENTION_MEANING)"),
            "EMULATE": (_emulate(ctx) if emulated else None,
                        "level emulated: the GPU stated to SGLang and the kernel libraries emulated (None: none)"),
            "NUM_KV_SPLITS": (NUM_KV_SPLITS, "--triton-attention-num-kv-splits of the check"),
            "SPECULATIVE": (speculative, "EAGLE verify (None: plain decode)"),
            "SEQ_LENS": ([int(n) for n in case["seqlens"]], "tokens per request, the new ones included"),
            "H_Q": (int(case["h_q"]), "query heads of the DCP group (each rank holds H_Q // DCP)"),
            "H_KV": (int(case.get("h_kv", 1)), "KV heads (MLA: one latent head)"),
            "D_QK": (int(case["d_qk"]), "q / k row: kv_lora_rank + qk_rope_head_dim for MLA"),
            "D_V": (int(case["d_v"]), "output row: kv_lora_rank for MLA"),
            "MLA": (bool(case["mla"]), ""),
            "SOFTMAX_SCALE": (float(ctx.model.softmax_scale), "the checkpoint's (YaRN mscale² included)"),
            "SEED": (int(case["seed"]), ""),
            "TOLERANCE": ({k: tolerance[k] for k in ("abs", "rel", "cos")}, "the check's, for this KV dtype"),
            "EXPECTED": ({"error": facts.error if facts else "?", "function": facts.function if facts else None},
                         "what the matrix run saw"),
        }

    def render(self, ctx: Context, script_name: str = "repro.py") -> str:
        emulated = ctx.kernel.get("level") == "emulated"
        text = script_text("sglang_backend.py.tmpl", self.docstring(ctx, script_name), self.constants(ctx))
        return text.replace("@INLINED@", inlined_emulations() if emulated else
                            f"INLINED_PACKAGE, INLINED_MODULES = {INLINED_PACKAGE!r}, {{}}  # nothing emulated")

    def docstring(self, ctx: Context, script_name: str) -> str:
        facts = ctx.finding.facts
        coords = ctx.coords
        phase = facts.phase
        decode = _decode_class(ctx)
        resolved = "" if _backend_name(ctx) == coords.get("backend") else (
            f" (SGLang serves {coords.get('backend')} with {decode} in this configuration)")
        entry = ("DeepseekMLAForwardMixin.forward_absorb_core (the model's absorbed-MLA attention)"
                 if ctx.kernel.get("case", {}).get("mla") else "RadixAttention.forward (the model's attention layer)")
        shared = len(ctx.finding.records)
        lines = [
            f"Reproducer: SGLang {ctx.version}: {facts.title}",
            "",
            "A server started as",
            f"    {serve_command('sglang', coords, ctx.model)}",
            f"meets it {phase.text}.{resolved}",
            "",
            f"Found by pytest-mla in cell {ctx.record.get('id')} of {ctx.run.get('matrix_file') or 'its matrix'}"
            f" ({shared} cell{'s' if shared != 1 else ''} fail the same way; result file {ctx.result_file}).",
        ]
        if ctx.finding.xfail:
            lines += [f"The matrix's note: {ctx.finding.xfail}"]
        lines += [
            f"The matrix run saw: {facts.statement}",
            "",
            f"What this script does, with SGLang's own code: {self.describes}. The step it runs is one "
            f"{'decode' if facts.step == 'decode' else 'target-verify'} step through {entry}; what it needs "
            "that a server has and this script does not (weights, a model runner, a process group) is a "
            "stand-in, marked 'Stand-in' below. Without a GPU, Triton runs under its interpreter.",
            "",
        ]
        kv_scale = _kv_scale(ctx)
        if kv_scale is not None:
            lines += [
                f"It needs a checkpoint whose quantization config carries calibrated KV scales: the script sets "
                f"k_scale = v_scale = {float(kv_scale):g} on the attention layers as SGLang's loader would, and "
                "writes the cached fp8 rows both ways SGLang's write paths store them (K / k_scale and K); the bug "
                "reproduces if the backend reads neither back right.",
                "",
            ]
        if ctx.kernel.get("level") == "emulated":
            lines += [
                f"The matrix found it at level 'emulated': SGLang's {decode} ran on a CPU stated to it as a CUDA "
                f"{coords.get('arch')} GPU, around float64 emulations of its kernel libraries (flashinfer, "
                "flash_mla, sgl_kernel, SGLang's JIT kernels). This script does the same: the emulations are "
                "inlined at its end, verbatim, and each states the library contract it follows. What the "
                "kernels themselves compute on the GPU is not checked here; confirm there.",
                "",
            ]
        lines += [
            "Run it where SGLang is installed (it needs torch and sglang only: no pytest, no pytest-mla):",
            f"    python {script_name}",
            "Exit status: 1 the bug reproduces (SGLang raises, or its output is out of tolerance of the float64",
            "reference); 0 SGLang computes the cell within tolerance (fixed); 2 this script could not build",
            "SGLang's objects here. The last line of its output is the outcome as JSON.",
            "",
            f"Generated by pytest-mla {__version__} with:",
            f"    pytest-mla repro {ctx.result_file} {ctx.record.get('id')} -o {os.path.basename(script_name)}",
        ]
        return "\n".join(lines)


#: The class SGLang's registry builds for a backend name (MLA model, GQA model): for a record whose start-up
#: validation could not build the backend on a CPU host and so does not name its class.
_CLASSES = {"triton": ("TritonAttnBackend",) * 2, "torch_native": ("TorchNativeAttnBackend",) * 2,
            "flashinfer": ("FlashInferMLAAttnBackend", "FlashInferAttnBackend"),
            "fa3": ("FlashAttentionBackend",) * 2, "flashmla": ("FlashMLABackend",) * 2,
            "trtllm_mla": ("TRTLLMMLABackend",) * 2, "cutedsl_mla": ("CuteDslMLABackend",) * 2}


def _kv_scale(ctx: Context) -> float | None:
    """The calibrated k_scale of a cell's fp8 cache (None: no fp8 cache, or a checkpoint without KV scales)."""
    kv_scale = ctx.kernel.get("kv_scale")
    kv = str((ctx.kernel.get("case") or {}).get("kv_dtype"))
    return float(kv_scale) if kv_scale not in (None, 1, 1.0) and kv != "auto" else None


def _decode_class(ctx: Context) -> str | None:
    decode = ((ctx.record.get("outcome") or {}).get("backends") or {}).get("decode")
    if decode and str(decode).isidentifier():  # the class SGLang built
        return decode
    classes = _CLASSES.get(str(ctx.coords.get("backend")))
    if classes is None:
        return decode
    return classes[0] if (ctx.kernel.get("case") or {}).get("mla") else classes[1]


def _backend_name(ctx: Context) -> str:
    decode = _decode_class(ctx)
    return DECODE_BACKENDS.get(decode) or EMULATED_BACKENDS[decode]


#: Mirrors of the SGLang adapter's emulation scope (engines/sglang/support.py; the report layer does not import
#: engines: tests/report/test_repro.py holds them equal): the libraries replaced and the CUDA toolkit stated.
EMULATED_LIBRARIES = ("flashinfer", "flash_mla", "sgl_kernel", "sglang")
CUDA_TOOLKIT = "13.0"
#: The module of each emulated backend class (engines/sglang/backends.py: each record's module, by class).
BACKEND_MODULES = {"FlashInferMLAAttnBackend": "sglang.srt.layers.attention.flashinfer_mla_backend",
                   "FlashInferAttnBackend": "sglang.srt.layers.attention.flashinfer_backend",
                   "FlashAttentionBackend": "sglang.srt.layers.attention.flashattention_backend",
                   "FlashMLABackend": "sglang.srt.layers.attention.flashmla_backend",
                   "TRTLLMMLABackend": "sglang.srt.layers.attention.trtllm_mla_backend",
                   "CuteDslMLABackend": "sglang.srt.layers.attention.cutedsl_mla_backend",
                   "TRTLLMHAAttnBackend": "sglang.srt.layers.attention.trtllm_mha_backend"}


def cuda_platform_facts(arch: str) -> dict[str, Any]:
    """SGLang's platform facts of a CUDA arch (``sm90``), as engines/sglang/platforms.platform_facts states them
    (a test holds the two equal on every CUDA arch); the script passes the ones its release knows."""
    match = re.match(r"^sm(\d+)", arch)
    if match is None:
        raise ValueError(f"not a CUDA arch: {arch!r}")
    sm = int(match.group(1))
    major, minor = divmod(sm, 10)
    return {
        "is_cuda": True, "is_hip": False, "is_npu": False, "is_xpu": False, "is_musa": False, "is_mps": False,
        "is_sm90": major == 9, "is_sm100": major == 10, "is_sm100_or_sm110": major in (10, 11), "is_sm110": major == 11,
        "is_sm120": major == 12, "is_blackwell": major in (10, 11, 12), "is_hopper_with_cuda_12_3": major == 9,
        "has_amx": False, "has_flashinfer": True, "device_sm": sm, "device_capability": [major, minor],
    }


def _emulate(ctx: Context) -> dict[str, Any]:
    """What an emulated cell's script states to SGLang and replaces (as ``engines/sglang/emulation`` does)."""
    arch = str(ctx.coords.get("arch"))
    return {"arch": arch, "platform": cuda_platform_facts(arch), "cuda_toolkit": CUDA_TOOLKIT,
            "libraries": list(EMULATED_LIBRARIES), "backend_module": BACKEND_MODULES[str(_decode_class(ctx))]}


#: What an emulated cell's script inlines: the emulation package's modules and the CPU host's answers.
_INLINED_SOURCES = (("kernels/emulated/__init__.py", ""), ("kernels/emulated/glue.py", "glue"),
                    ("kernels/emulated/install.py", "install"), ("engines/common/cpu_host.py", "cpu_host"))


def inlined_emulations() -> str:
    """The script section holding pytest-mla's float64 emulations, verbatim, as modules of ``INLINED_PACKAGE``
    (read as files: the report layer imports neither kernels nor engines)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # pytest_mla/
    library = sorted(name[:-3] for name in os.listdir(os.path.join(root, "kernels", "emulated"))
                     if name.endswith(".py") and name[:-3] not in ("__init__", "glue", "install"))
    sources = list(_INLINED_SOURCES) + [(f"kernels/emulated/{name}.py", name) for name in library]
    lines = [
        "# ---- inlined: pytest-mla's float64 emulations of the kernel libraries ------------------------------",
        f"# Verbatim copies of pytest-mla {__version__}'s pytest_mla/kernels/emulated/*.py (each module's docstring",
        "# states its library's contract: layouts, paging, scales, LSE base, what it refuses, as the library's own",
        "# docs and tests define them) and pytest_mla/engines/common/cpu_host.py (the host calls a GPU answers,",
        "# answered as a CPU host does). They are what the matrix run called; `emulated_gpu` above installs them",
        "# where SGLang looks its kernels up. Nothing of SGLang is replaced.",
        f"INLINED_PACKAGE = {INLINED_PACKAGE!r}",
        "INLINED_MODULES = {}",
    ]
    for path, name in sources:
        with open(os.path.join(root, path), encoding="utf-8") as f:
            text = f.read()
        module = f"{INLINED_PACKAGE}.{name}" if name else INLINED_PACKAGE
        lines += ["", f"# pytest_mla/{path}", f'INLINED_MODULES[{module!r}] = """\\', doc_safe(text) + '"""']
    return "\n".join(lines)
