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
from typing import Any

from ... import __version__
from ...core.spec import parse_spec
from ..findings import finding_facts
from ..serving import serve_command, server_phase
from .templates import Context, Template, script_text

__all__ = ["SGLangBackendTemplate", "DECODE_BACKENDS", "NUM_KV_SPLITS", "TOLERANCES"]

#: Backend classes SGLang resolves that this template can run here → their name in ATTENTION_BACKENDS.
DECODE_BACKENDS = {"TritonAttnBackend": "triton"}
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
        if level != "backend":
            extra = (": its kernels ran as float64 emulations, which no template inlines yet"
                     if level == "emulated" else "")
            return f"the check ran at level {level!r}, not 'backend'{extra}"
        decode = ((ctx.record.get("outcome") or {}).get("backends") or {}).get("decode")
        if decode not in DECODE_BACKENDS:
            return (f"the decode backend {decode} needs a GPU (templates run "
                    f"{', '.join(DECODE_BACKENDS)} so far)")
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
        decode = ctx.record["outcome"]["backends"]["decode"]
        facts = finding_facts(ctx.record, ctx.engine)
        kv = str(case["kv_dtype"])
        tolerance = (ctx.kernel.get("tolerance") or {}).get("out") or TOLERANCES.get(kv, TOLERANCES["auto"])
        speculative = None
        if spec.enabled:
            speculative = {"algorithm": _ALGORITHMS.get(spec.algorithm or "", "EAGLE"), "topk": spec.topk,
                           "steps": spec.steps, "draft_tokens": spec.num_draft_tokens}
        return {
            "CELL": (str(ctx.record.get("id")), "the pytest-mla cell"),
            "MODEL_CONFIG": (dict(ctx.config_json or {}), f"{ctx.model.name}'s config.json, without weights"),
            "ATTENTION_BACKEND": (DECODE_BACKENDS[decode], f"SGLang resolved {coords.get('backend')} to {decode}"),
            "TP": (int(coords["tp"]) if coords.get("tp") is not None else dcp, "--tp-size"),
            "DCP": (dcp, "--dcp-size: decode context parallel ranks"),
            "PAGE_SIZE": (int(case["page_size"]), "--page-size as SGLang resolved it"),
            "KV_CACHE_DTYPE": (kv, "--kv-cache-dtype as SGLang resolved it"),
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
        return script_text("sglang_backend.py.tmpl", self.docstring(ctx, script_name), self.constants(ctx))

    def docstring(self, ctx: Context, script_name: str) -> str:
        facts = ctx.finding.facts
        coords = ctx.coords
        phase = server_phase("sglang", facts.step)
        decode = ctx.record["outcome"]["backends"]["decode"]
        resolved = "" if DECODE_BACKENDS[decode] == coords.get("backend") else (
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
