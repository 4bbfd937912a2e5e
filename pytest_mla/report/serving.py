"""What a cell means for a server: the command that starts one in that configuration, and when
such a server meets a finding of the cell (start-up or its first step).

Pure data about the engines, read in their source (cited in ``ServerPhase.sources``);
no engine is imported. An engine this module does not know gets a generic command and
the phase ``not traced``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any, Mapping

from ..core.models import BUILTIN_MODELS, ModelConfig
from ..core.records import CACHE_WRITE_STEP
from ..core.spec import parse_spec

__all__ = ["CHECKPOINTS", "ServerPhase", "display_name", "serve_argv", "serve_command", "server_phase", "step_of"]

#: How the engines spell their names.
DISPLAY_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


def display_name(engine: str) -> str:
    return DISPLAY_NAMES.get(engine, engine)

#: The public checkpoint of each catalogue model (what ``--model-path`` names).
CHECKPOINTS = {
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "deepseek-r1": "deepseek-ai/DeepSeek-R1",
    "deepseek-v2": "deepseek-ai/DeepSeek-V2",
    "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
    # Issue 39's families: the checkpoints transformers 5.24's configuration classes name
    # (auto_docstring(checkpoint=...)); GLM-4.7-Flash's class names zai-org/GLM-4.5, its defaults are the Flash's.
    "minicpm3-4b": "openbmb/MiniCPM3-4B",
    "mistral-small-4": "mistralai/Mistral-Small-4-119B-2603",
    "mistral-large-4": "mistralai/Mistral-Large-4-1T-A52B",
    "glm-4.7-flash": "zai-org/GLM-4.7-Flash",
    "glm-5": "zai-org/GLM-5",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.2-11b-vision": "meta-llama/Llama-3.2-11B-Vision-Instruct",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
}

#: Matrix spec algorithms as the engines' flags name them.
_SGLANG_ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "nextn": "NEXTN"}


def step_of(coords: Mapping[str, Any]) -> str:
    """``decode`` (one query token) or ``verify`` (speculative decoding: the target verifies the draft)."""
    return "verify" if parse_spec(str(coords.get("spec", "none"))).enabled else "decode"


def checkpoint(model: str) -> str:
    return CHECKPOINTS.get(model, f"<the {model} checkpoint>")


def serve_argv(engine: str, coords: Mapping[str, Any], model: ModelConfig | None = None) -> list[str]:
    """The command line that starts ``engine`` in the cell's configuration (GPU arch aside)."""
    name = str(coords.get("model"))
    model = model or BUILTIN_MODELS.get(name)
    spec = parse_spec(str(coords.get("spec", "none")))
    dcp = int(coords.get("dcp", 1))
    tp = int(coords["tp"]) if coords.get("tp") is not None else max(dcp, 1)
    backend = str(coords.get("backend"))
    kv = coords.get("kv_dtype")
    page = coords.get("page_size")
    draft = f"<an EAGLE draft model for {checkpoint(name)}>"
    needs_draft = model is None or not model.mla or model.mtp_layers == 0  # MLA checkpoints with MTP layers draft themselves
    if engine == "vllm":
        argv = ["vllm", "serve", checkpoint(name), "--tensor-parallel-size", str(tp)]
        if dcp != 1:
            argv += ["--decode-context-parallel-size", str(dcp)]
        if backend not in ("auto", ""):
            argv += ["--attention-backend", backend]
        if kv not in (None, "auto"):
            argv += ["--kv-cache-dtype", str(kv)]
        if page is not None:
            argv += ["--block-size", str(page)]
        if spec.enabled:
            config: dict[str, Any] = {"method": spec.algorithm, "num_speculative_tokens": spec.steps}
            if needs_draft and spec.algorithm in ("eagle", "eagle3"):
                config["model"] = draft
            argv += ["--speculative-config", json.dumps(config)]
        return argv
    prog = [engine, "serve"] if engine == "sglang" else [f"<{engine}>", "serve"]
    argv = prog + ["--model-path", checkpoint(name)]
    prefill, plus, decode = backend.partition("+")
    if plus:
        argv += ["--prefill-attention-backend", prefill, "--decode-attention-backend", decode]
    else:
        argv += ["--attention-backend", backend]
    argv += ["--tp-size", str(tp)]
    if dcp != 1:
        argv += ["--dcp-size", str(dcp)]
    if kv not in (None, "auto"):
        argv += ["--kv-cache-dtype", str(kv)]
    if page is not None:
        argv += ["--page-size", str(page)]
    if spec.enabled:
        argv += ["--speculative-algorithm", _SGLANG_ALGORITHMS.get(spec.algorithm or "", "EAGLE"),
                 "--speculative-num-steps", str(spec.steps), "--speculative-eagle-topk", str(spec.topk),
                 "--speculative-num-draft-tokens", str(spec.num_draft_tokens)]
        if needs_draft:
            argv += ["--speculative-draft-model-path", draft]
    return argv


def serve_command(engine: str, coords: Mapping[str, Any], model: ModelConfig | None = None) -> str:
    """``serve_argv`` as one shell line (placeholders in angle brackets are quoted)."""
    return " ".join(shlex.quote(a) for a in serve_argv(engine, coords, model))


@dataclasses.dataclass(frozen=True)
class ServerPhase:
    """When a server started in a cell's configuration meets a finding of its ``step``."""

    when: str  # "start-up", "first step", "not traced", "cache write", "out of range" or a hardening gap
    short: str  # a clause for a table note: "a server fails at start-up (CUDA-graph capture)"
    text: str  # the whole story, for a bug report and the findings section
    sources: tuple[str, ...] = ()  # where in the engine's source it was read

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Read in SGLang 0.5.23's source (and the same in 0.5.22):
_SGLANG_SOURCES = (
    "sglang/srt/model_executor/cuda_graph_config.py: CudaGraphConfig.decode defaults to Backend.FULL "
    "(captured unless --disable-cuda-graph)",
    "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py: DecodeCudaGraphRunner captures "
    "ForwardMode.DECODE, or ForwardMode.TARGET_VERIFY when spec_algorithm.is_speculative(), its EAGLE "
    "capture batch carrying a custom_mask buffer",
    "sglang/srt/arg_groups/cuda_graph_hook.py: disable_breakable_cudagraph_if_incompatible turns off the "
    "prefill graphs only for \"decode context parallel (dcp_size > 1)\"",
)


def server_phase(engine: str, step: str, kind: str = "raised", function: str | None = None) -> ServerPhase:
    """When a server meets a finding in its ``decode`` or ``verify`` step, from the engine's defaults.

    ``kind`` ``"mismatch"`` (an output out of tolerance) never stops a server: it serves wrong outputs;
    ``"hardening"`` (out of tolerance only with NaN in free cache slots) does not touch a server's outputs.
    ``function``: where it raised; a constructor (``...__init__``) raises while the server builds its
    attention backend, before any graph capture.
    """
    what = "decode" if step == "decode" else "verify"
    if kind == "out-of-range":
        moment = ("when it writes a request's tokens into the KV cache through this path" if step == CACHE_WRITE_STEP
                  else f"in its {what} steps (and in a start-up CUDA-graph capture of them)")
        return ServerPhase("out of range", "on a GPU nothing raises here: the kernel reads or writes outside the cache",
                           f"{moment}, and nothing raises where the check stopped: the check's guard (an emulated "
                           "kernel's index check, or the guard rows around a write) refused an index outside the "
                           "cache, which the real kernel follows without a bounds check, reading or writing other "
                           "requests' KV rows or unmapped memory; a server then computes from foreign rows "
                           "silently, corrupts another request's cache, or dies on an illegal memory access")
    if step == CACHE_WRITE_STEP:
        return ServerPhase("cache write", "a server fails writing a request's tokens into its KV cache",
                           "when it writes a request's tokens into the KV cache through this path (at the latest "
                           "the prefill of the first such request): the check met it writing the cached tokens "
                           "through the engine's own write path, before its decode or verify step ran, so whether "
                           "the decode or verify step fails as well was not reached")
    if kind == "hardening":
        return ServerPhase("only with a non-finite free slot",
                           "hardening: only a NaN or Inf in a free KV slot reaches the output",
                           f"only if a free KV-cache slot holds NaN or Inf: the check poisons the free slots with NaN "
                           f"and the {what} output turned NaN; with them zero-filled, as the engine allocates its "
                           "cache (torch.zeros), the same inputs matched the float64 reference. A server whose cache "
                           "holds zeros or finite stale values there returns the right tokens; the missing mask lets "
                           "a NaN written by any other fault spread to every request that reads the page")
    if kind == "mismatch":
        return ServerPhase("first step", "a server serves wrong outputs, silently",
                           f"silently, from its first {what} step: nothing raises (CUDA-graph capture and start-up "
                           "succeed), and every step computes attention outputs out of tolerance, so the server "
                           "returns wrong tokens without an error")
    if engine == "sglang" and (function or "").endswith(".__init__"):
        return ServerPhase("start-up", "a server fails at start-up (building its attention backend)",
                           "at start-up, while the model runner builds its attention backend, before it captures "
                           "any CUDA graph (--disable-cuda-graph does not avoid it)")
    if engine == "sglang":
        captured = "decode batches" if step == "decode" else "target-verify batches (speculative decoding)"
        first = "its first decode step" if step == "decode" else "its first verify step"
        return ServerPhase(
            "start-up", "a server fails at start-up (CUDA-graph capture)",
            f"at start-up: by default SGLang captures CUDA graphs of {captured} before it serves, and the "
            f"capture runs this path (DCP turns off only the prefill graphs), so the server dies during "
            f"start-up; with --disable-cuda-graph it starts and dies at {first}",
            _SGLANG_SOURCES)
    return ServerPhase("not traced", f"when a {engine} server meets it was not traced",
                       f"not traced for {engine}: at the latest its first {what} step; a start-up CUDA-graph "
                       "capture may meet it earlier")
