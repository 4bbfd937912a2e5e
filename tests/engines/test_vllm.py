"""The real vLLM adapter, run inside each release's venv (skipped when a venv is absent).

``.venv-vllm`` holds vllm 0.34.0, ``.venv-vllm-0.33.0`` vllm 0.33.0; every
expected text here was read in that release's source. The adapter-error tests
use a fake ``vllm`` package in a pytester run and need no venv.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap

import pytest

from pytest_mla.report.results import read_results

from ._venv import ROOT, committed_slice, run_matrix, venv_python

pytest_plugins = ["pytester"]

MATRIX = ROOT / "matrix" / "vllm.toml"
CUDA = "--mla-select=arch=sm80,sm90,sm100"
NARROW = ("--mla-select=model=deepseek-v3,mla-64", "--mla-select=backend=TOKENSPEED_MLA,FLASHMLA",
          "--mla-select=dcp=1", "--mla-select=spec=none", "--mla-select=page_size=64", CUDA)
VENVS = [pytest.param(".venv-vllm", "0.34.0", id="vllm-0.34.0"),
         pytest.param(".venv-vllm-0.33.0", "0.33.0", id="vllm-0.33.0")]


def _report(report_dir):
    return read_results(next(report_dir.glob("vllm-*[0-9].json")))


def _cells(report_dir):
    return {c["id"]: c for c in _report(report_dir)["cells"]}


@pytest.mark.parametrize("venv, version", VENVS)
def test_narrow_matrix_passes_against_each_release(tmp_path, venv, version):
    python = venv_python(venv)
    result = run_matrix(python, MATRIX, tmp_path, *NARROW)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "24 passed" in result.stdout  # 2 models x 2 backends x 3 archs x 2 KV dtypes
    assert _report(tmp_path)["run"]["engine"]["version"] == version


def test_compiled_extension_reasons_never_reach_a_verdict(tmp_path):
    """FLASHMLA on SM90 is accepted on this CPU machine: the _flashmla_C check is isolated."""
    python = venv_python(".venv-vllm")
    result = run_matrix(python, MATRIX, tmp_path, *NARROW, "--mla-select=arch=sm90", "-rA")
    assert result.returncode == 0, result.stdout
    assert "is not available" not in result.stdout


def test_one_changed_reason_fails_exactly_the_affected_cells(tmp_path):
    python = venv_python(".venv-vllm")
    old = 'text = "FlashMLA Dense is only supported on Hopper devices." }'
    text = MATRIX.read_text()
    assert text.count(old) == 1
    changed = tmp_path / "vllm.toml"
    changed.write_text(text.replace(old, old.replace("Hopper devices", "Hopper GPUs")))
    result = run_matrix(python, changed, tmp_path / "reports", *NARROW)
    out = result.stdout
    assert result.returncode == 1, out
    failed = sorted(set(re.findall(r"^FAILED \S*::(\S+)", out, re.M)))
    # That reason is in FLASHMLA's list off Hopper for every dense MLA model (SM80 lists the capability too).
    assert failed == [f"{m}-FLASHMLA-dcp1-none-{arch}-{kv}-page64"
                      for m in ("deepseek-v3", "mla-64") for arch in ("sm100", "sm80") for kv in ("kv-auto", "kv-fp8")], out
    assert "8 failed, 16 passed" in out, out
    assert "expected: Selected backend" in out and "raised:   Selected backend" in out
    assert "'compute capability not supported', 'FlashMLA Dense is only supported on Hopper GPUs.'" in out


def test_config_layer_and_priority_walk(tmp_path):
    """GQA + DCP is refused by vLLM's config layer; `auto` walks the priority list and can find nothing."""
    python = venv_python(".venv-vllm")
    result = run_matrix(python, MATRIX, tmp_path, "--mla-select=model=qwen2.5-7b,mqa-96,deepseek-v3",
                        "--mla-select=backend=auto", "--mla-select=dcp=2", "--mla-select=spec=none",
                        "--mla-select=arch=sm80", "--mla-select=kv_dtype=fp8", "--mla-select=page_size=64")
    assert result.returncode == 0, result.stdout + result.stderr
    outcomes = {cid: c["outcome"] for cid, c in _cells(tmp_path).items()}
    gqa = outcomes["qwen2.5-7b/auto/dcp2/none/sm80/kv-fp8/page64"]
    assert gqa["message"].startswith("Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` (2) "
                                     "to be greater than the model's total number of KV heads (4).")
    walk = outcomes["mqa-96/auto/dcp2/none/sm80/kv-fp8/page64"]
    assert walk["message"].startswith("No valid attention backend found for cuda with AttentionSelectorConfig(")
    assert "TRITON_ATTN: [DCP not supported]" in walk["message"]
    # TRITON_MLA is the only MLA backend valid on SM80; its impl refuses FP8 KV there (SM89+).
    mla = outcomes["deepseek-v3/auto/dcp2/none/sm80/kv-fp8/page64"]
    assert mla["kind"] == "rejected"
    assert mla["message"].startswith("FP8 KV cache is not supported by the Triton MLA backend on ")


@pytest.mark.parametrize("venv, version", VENVS)
def test_layer_constructors_refuse_after_a_valid_selection(tmp_path, venv, version):
    """The impl's constructor and the MLA prefill selection run as the layer builds them.

    TRITON_MLA's selector takes every arch and FP8 KV; ``TritonMLAImpl.__init__``
    refuses FP8 below SM89. mla-64's 64/64/64 dims pass TRITON_MLA's selector,
    but no MLA prefill backend takes them (``get_mla_prefill_backend``).
    """
    python = venv_python(venv)
    result = run_matrix(python, MATRIX, tmp_path, "--mla-select=model=deepseek-v3,mla-64",
                        "--mla-select=backend=TRITON_MLA", "--mla-select=dcp=1", "--mla-select=spec=none",
                        "--mla-select=page_size=64", CUDA)
    assert result.returncode == 0, result.stdout + result.stderr
    cells = _cells(tmp_path)
    assert len(cells) == 12
    fp8_sm80 = cells["deepseek-v3/TRITON_MLA/dcp1/none/sm80/kv-fp8/page64"]["outcome"]
    assert fp8_sm80["kind"] == "rejected" and fp8_sm80["error"] == "ValueError"
    assert "(compute capability 8.0); native FP8 (fp8e4nv) requires SM89+." in fp8_sm80["message"]
    assert cells["deepseek-v3/TRITON_MLA/dcp1/none/sm90/kv-fp8/page64"]["outcome"]["kind"] == "accepted"
    prefill = cells["mla-64/TRITON_MLA/dcp1/none/sm90/kv-auto/page64"]["outcome"]
    assert prefill["message"].startswith("No valid MLA prefill backend found with MLAPrefillSelectorConfig(")
    # The impl's FP8 refusal comes first: the layer builds the impl before selecting the prefill backend.
    assert cells["mla-64/TRITON_MLA/dcp1/none/sm80/kv-fp8/page64"]["outcome"]["message"].startswith("FP8 KV cache")


def test_each_platform_selects_with_its_own_class_in_its_own_process():
    """ROCm validates the forced backend (a class that does not import is "ImportError"), the CPU
    platform ignores it for AMX_MLA, XPU refuses all but its own; aiter's first use is a skip. Read in
    the committed report (each platform's cells ran in that platform's own process), which CI recomputes."""
    report, cells = committed_slice(
        "vllm-0.34.0", "--mla-select=model=deepseek-v3",
        "--mla-select=backend=ROCM_AITER_MLA,FLASHINFER_MLA,AMX_MLA,FLASH_ATTN_MLA",
        "--mla-select=dcp=1", "--mla-select=spec=none", "--mla-select=arch=gfx942,cpu_amx,xpu",
        "--mla-select=kv_dtype=auto", "--mla-select=page_size=64")
    verdicts = [c["verdict"] for c in cells.values()]
    assert (verdicts.count("pass"), verdicts.count("skip"), len(verdicts)) == (11, 1, 12), verdicts

    def cell(backend, arch):
        return cells[f"deepseek-v3/{backend}/dcp1/none/{arch}/kv-auto/page64"]

    aiter = cell("ROCM_AITER_MLA", "gfx942")
    assert aiter["verdict"] == "skip" and aiter["outcome"]["error"] == "UnreachableError"
    assert "aiter" in aiter["reason"] and "AMD's AI Tensor Engine for ROCm" in aiter["reason"]
    assert cell("FLASHINFER_MLA", "gfx942")["outcome"]["message"].endswith("Reason: ['ImportError']")
    assert cell("FLASH_ATTN_MLA", "gfx942")["outcome"]["message"].endswith(
        "Reason: ['FlashAttention MLA not supported on this device']")
    for backend in ("ROCM_AITER_MLA", "FLASHINFER_MLA", "AMX_MLA", "FLASH_ATTN_MLA"):
        assert cell(backend, "cpu_amx")["outcome"]["backends"]["decode"] == "AMXMLABackend"
    assert cell("FLASH_ATTN_MLA", "xpu")["outcome"]["backends"]["decode"] == "XPUFlashAttnMLABackend"
    assert cell("AMX_MLA", "xpu")["outcome"]["message"] == "Invalid attention backend for xpu, with use_mla: True"
    assert report["run"]["engine"]["coverage"]["uncovered_mla"] == []


def test_an_arch_vllm_has_no_platform_for_is_a_matrix_error(tmp_path):
    """gfx908 (MI100) is a GFX target vLLM 0.34.0's ROCm platform does not name: collection stops."""
    python = venv_python(".venv-vllm")
    matrix = tmp_path / "m.toml"
    matrix.write_text(SPEC_MATRIX.split("# config/vllm.py")[0].replace('arch      = ["sm90"]', 'arch      = ["sm90", "gfx908"]'))
    result = run_matrix(python, matrix, tmp_path / "reports")
    assert result.returncode != 0
    line = next(i for i, text in enumerate(matrix.read_text().splitlines(), 1) if text.startswith("arch"))
    assert (f"m.toml:{line}: axes.arch: vllm 0.34.0 has no platform for arch 'gfx908' (known: smNN, gfx90a, "
            "gfx942, gfx950, gfx1100, gfx1151, gfx1200, gfx1201, gfx1250, cpu, cpu_amx, xpu)") in result.stdout + result.stderr


SPEC_MATRIX = """
[engine]
name = "vllm"
version = "*"

[axes]
model     = ["deepseek-v3", "llama-3.1-8b"]
backend   = ["auto"]
dcp       = [1]
spec      = ["none", "eagle-1x3", "eagle-1x2047", "eagle-1x2048", "mtp-4096"]
arch      = ["sm90"]
kv_dtype  = ["auto"]
page_size = [64]

# config/vllm.py VllmConfig._set_max_num_scheduled_tokens: the scheduler's token budget
# (SchedulerConfig's default max_num_batched_tokens, 2048) must exceed the lookahead slots
# (EAGLE / MTP: num_speculative_tokens).
[[rule]]
when = { spec = "eagle-1x2048" }
reject = { error = "ValueError", message = "VllmConfig does not have enough slots to schedule a token and support the speculative decoding settings. Got max_num_batched_tokens=2048 and num_lookahead_tokens=2048." }

[[rule]]
when = { spec = "mtp-4096" }
reject = { error = "ValueError", message = "VllmConfig does not have enough slots to schedule a token and support the speculative decoding settings. Got max_num_batched_tokens=2048 and num_lookahead_tokens=4096." }
"""


@pytest.mark.parametrize("venv, version", VENVS)
def test_a_speculative_setting_refused_at_start_up(tmp_path, venv, version):
    """vLLM's own spec check refuses a draft longer than the scheduler's budget; one token less passes."""
    python = venv_python(venv)
    matrix = tmp_path / "spec.toml"
    matrix.write_text(SPEC_MATRIX)
    result = run_matrix(python, matrix, tmp_path / "reports")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "10 passed" in result.stdout
    cells = _cells(tmp_path / "reports")
    assert cells["deepseek-v3/auto/dcp1/eagle-1x2047/sm90/kv-auto/page64"]["outcome"]["kind"] == "accepted"


@pytest.mark.parametrize("venv, version", VENVS)
def test_spec_reaches_the_cuda_graph_resolution_with_the_verify_length(tmp_path, venv, version):
    """CUTLASS_MLA's FULL decode graphs take one query token: a verify step of 4 lowers the mode (a note).

    ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` sees the decode query
    length 1 + num_speculative_tokens; the spec-less cell keeps the default mode.
    """
    python = venv_python(venv)
    result = run_matrix(python, MATRIX, tmp_path, "--mla-select=model=deepseek-v3", "--mla-select=backend=CUTLASS_MLA",
                        "--mla-select=dcp=1", "--mla-select=arch=sm100", "--mla-select=kv_dtype=auto",
                        "--mla-select=page_size=128")
    assert result.returncode == 0, result.stdout + result.stderr
    cells = _cells(tmp_path)
    spec = cells["deepseek-v3/CUTLASS_MLA/dcp1/eagle-1x3/sm100/kv-auto/page128"]
    none = cells["deepseek-v3/CUTLASS_MLA/dcp1/none/sm100/kv-auto/page128"]
    assert spec["outcome"]["kind"] == none["outcome"]["kind"] == "accepted"
    assert spec.get("notes") == ["cudagraph_mode FULL_AND_PIECEWISE lowered to PIECEWISE: CutlassMLABackend "
                                 "supports UNIFORM_SINGLE_TOKEN_DECODE (decode query length 4)"]
    assert not none.get("notes")


def test_a_draft_tree_is_an_adapter_error_not_a_refusal(tmp_path):
    """vLLM's SpeculativeConfig has no topk: an ``eagle-4x3`` cell cannot be configured (verdict error)."""
    python = venv_python(".venv-vllm")
    matrix = tmp_path / "tree.toml"
    matrix.write_text(SPEC_MATRIX.replace('"eagle-1x3", "eagle-1x2047", "eagle-1x2048", "mtp-4096"', '"eagle-4x3"')
                      .split("# config/vllm.py")[0])
    result = run_matrix(python, matrix, tmp_path / "reports")
    assert result.returncode == 1, result.stdout
    cells = _cells(tmp_path / "reports")
    tree = cells["deepseek-v3/auto/dcp1/eagle-4x3/sm90/kv-auto/page64"]
    assert tree["verdict"] == "error"
    assert tree["reason"] == ("adapter error: adapter step 'spec' failed on vllm 0.34.0: 'eagle-4x3': vLLM's "
                              "SpeculativeConfig has no draft tree (topk); only chains (eagle-1xK, mtp-K) "
                              "can be configured")
    assert cells["deepseek-v3/auto/dcp1/none/sm90/kv-auto/page64"]["verdict"] == "pass"


MISSING_FIELD_PLUGIN = '''
from pytest_mla.engines.vllm import startup as vllm


def pytest_configure(config):
    vllm.MODEL_INFO.clear()  # the adapter's registry answer loses is_hybrid, which vLLM reads
'''


def test_a_field_the_stand_ins_lack_is_an_adapter_error(tmp_path, monkeypatch):
    """vLLM reading something the adapter does not carry is ``error`` naming the step, never a refusal."""
    python = venv_python(".venv-vllm")
    (tmp_path / "lose_is_hybrid.py").write_text(MISSING_FIELD_PLUGIN)
    monkeypatch.setenv("PYTHONPATH", os.fspath(tmp_path))
    result = run_matrix(python, MATRIX, tmp_path / "reports", "-p", "lose_is_hybrid", *NARROW,
                        "--mla-select=arch=sm90")
    assert result.returncode == 1, result.stdout + result.stderr
    cells = _cells(tmp_path / "reports")
    accepted = cells["deepseek-v3/FLASHMLA/dcp1/none/sm90/kv-auto/page64"]
    assert accepted["verdict"] == "error"
    assert accepted["reason"] == ("adapter error: adapter step 'block size' failed on vllm 0.34.0: "
                                  "vLLM read _ModelInfo.is_hybrid, which the adapter does not carry")
    # A refusal raised before that step is still the engine's.
    refused = cells["deepseek-v3/TOKENSPEED_MLA/dcp1/none/sm90/kv-fp8/page64"]
    assert refused["verdict"] == "pass" and refused["outcome"]["kind"] == "rejected"


@pytest.mark.parametrize("venv, version", VENVS)
def test_registered_backends_cover_the_whole_enum(venv, version):
    """Every AttentionBackendEnum member, MLA-capable as its class's is_mla() (or its source) says."""
    python = venv_python(venv)
    script = textwrap.dedent("""
        import json
        from pytest_mla.engines.vllm import VLLMEngine
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        engine = VLLMEngine()
        print(json.dumps({"members": [m.name for m in AttentionBackendEnum],
                          "backends": engine.registered_backends()}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([os.fspath(python), "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    backends = answer["backends"]
    assert sorted(backends) == sorted(answer["members"])
    for name in ("TRITON_MLA", "FLASHMLA", "FLASH_ATTN_MLA", "FLASHINFER_MLA", "CUTLASS_MLA", "TOKENSPEED_MLA",
                 "FLASHMLA_SPARSE", "ROCM_AITER_MLA", "CPU_MLA"):
        assert backends[name] is True, name
    for name in ("TRITON_ATTN", "FLASH_ATTN", "FLASHINFER", "FLEX_ATTENTION", "TURBOQUANT", "TORCH_SDPA", "CUSTOM",
                 "NO_ATTENTION"):
        assert backends[name] is False, name
    assert backends["ROCM_FLASHMLA_SPARSE_DSV4"] is True


# -- backend facts: what vLLM declares on each backend class, read at run time ------------------

#: One child in .venv-vllm: ``metadata()["backend_facts"]`` as vLLM 0.34.0 declares them, then again after each
#: fault planted in vLLM's own classes (the facts must follow the classes, never a table of the adapter's).
FACTS_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pytest_mla.engines.vllm import VLLMEngine
    engine = VLLMEngine()  # first: vLLM is imported on its faked platform
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.mla.cutlass_mla import CutlassMLABackend
    from vllm.v1.attention.backends.mla.flashmla import FlashMLABackend
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend
    engine.registered_backends()  # as a run does, at load
    out = {}
    start = time.perf_counter()
    out["clean"] = engine.metadata()
    out["seconds"] = time.perf_counter() - start
    out["again"] = engine.metadata()
    TritonMLABackend.supported_kv_cache_dtypes = ["auto", "fp8_e5m2"]
    FlashMLABackend.get_supported_kernel_block_sizes = staticmethod(lambda kv_cache_spec=None: [MultipleOf(32), 256])
    def refuse(cls, capability):
        raise RuntimeError("planted\\nsecond line")
    CutlassMLABackend.supports_compute_capability = classmethod(refuse)
    out["faulted"] = engine.metadata()["backend_facts"]
    sys.modules["vllm.v1.attention.backends.mla.flashmla"] = None  # its module cannot be imported any more
    out["unimportable"] = engine.metadata()["backend_facts"]
    # faults in what the CUDA platform decides: its priority function, a prefill class, its prefill order
    import vllm.platforms.cuda as cuda_platform
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as B
    from vllm.v1.attention.backends.mla.prefill.base import MLADimensions
    from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum as P
    from vllm.v1.attention.backends.mla.prefill.trtllm_ragged import TrtllmRaggedPrefillBackend
    cuda_platform._get_backend_priorities = lambda use_mla, capability, **kw: (
        [B.TRITON_MLA] if use_mla else [B.FLEX_ATTENTION])
    TrtllmRaggedPrefillBackend.supported_mla_dimensions = [
        MLADimensions(qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=128)]
    def prefill_order(cls, config):
        for member in (P.TOKENSPEED_MLA, P.FLASH_ATTN):
            if not member.get_class().validate_configuration(None, config):
                return member.get_class()
        raise ValueError("none")
    Platform.get_mla_prefill_backend_cls = classmethod(prefill_order)
    out["decisions_faulted"] = engine.metadata()
    out["prefill_class_after"] = P.FLASH_ATTN.get_class().__name__
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def facts_run():
    python = venv_python(".venv-vllm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([os.fspath(python), "-c", FACTS_SCRIPT], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_backend_facts_are_what_vllm_declares(facts_run):
    """Literals read in vLLM 0.34.0's source: mla/triton_mla.py (TritonMLABackend, TritonMLAImpl.supports_dcp,
    TritonMLAMetadataBuilder._cudagraph_support), mla/flashmla.py, mla/cutlass_mla.py, mla/flashmla_sparse.py,
    MLACommonBackend.get_supported_head_sizes (mla_attention.py), and registry.py (NO_ATTENTION's module is not
    in the wheel; CUSTOM is a placeholder)."""
    metadata = facts_run["clean"]
    facts = metadata["backend_facts"]
    assert metadata["backend_facts_arch"] == "sm90"
    assert list(facts) == sorted(facts)
    assert {"TRITON_MLA", "FLASHMLA", "CUTLASS_MLA", "FLASHMLA_SPARSE", "ROCM_AITER_MLA", "CPU_MLA",
            "CUSTOM"} <= set(facts)
    assert facts["TRITON_MLA"] == {
        "attention_types": ["Decoder"], "block_sizes": ["%16"],
        "class": "vllm.v1.attention.backends.mla.triton_mla:TritonMLABackend",
        "compute_capabilities": ["7.0", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0",
                                 "12.1"],
        "compute_capability": "Any", "cudagraph": "UNIFORM_BATCH", "cudagraph_by_config": False, "dcp": True,
        "dtypes": ["fp16", "bf16"], "head_sizes": "any",
        "kv_cache_dtypes": ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3"], "mla": True, "mm_prefix": False,
        "name": "TRITON_MLA", "sink": False, "sparse": False}
    flashmla = facts["FLASHMLA"]
    assert flashmla["class"] == "vllm.v1.attention.backends.mla.flashmla:FlashMLABackend"
    assert flashmla["dtypes"] == ["fp16", "bf16"]
    assert flashmla["kv_cache_dtypes"] == ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3"]
    assert flashmla["block_sizes"] == [64]
    assert flashmla["head_sizes"] == [320, 512, 576]
    assert flashmla["compute_capability"] == "9.x-10.x"
    assert flashmla["compute_capabilities"] == ["9.0", "10.0", "10.3"]
    assert (flashmla["mla"], flashmla["sparse"], flashmla["dcp"]) == (True, False, True)
    cutlass = facts["CUTLASS_MLA"]
    assert (cutlass["block_sizes"], cutlass["compute_capability"]) == ([128], "10.x")
    assert cutlass["cudagraph"] == "UNIFORM_SINGLE_TOKEN_DECODE"
    sparse = facts["FLASHMLA_SPARSE"]
    assert sparse["sparse"] is True and sparse["block_sizes"] == ["%64"]
    assert sparse["kv_cache_dtypes"] == ["auto", "bfloat16", "fp8_ds_mla", "fp8", "nvfp4_ds_mla"]
    assert facts["NO_ATTENTION"] == {"error": "ModuleNotFoundError: No module named "
                                              "'vllm.v1.attention.backends.no_attention'"}
    assert set(facts["CUSTOM"]) == {"error"} and facts["CUSTOM"]["error"].startswith("ValueError: Backend CUSTOM must")
    # deterministic, plain, and cheap; asking again gives the same answer
    assert facts_run["again"] == metadata
    assert json.loads(json.dumps(facts)) == facts
    assert facts_run["seconds"] < 5


def test_backend_facts_follow_faults_planted_in_vllm_classes(facts_run):
    clean, faulted = facts_run["clean"]["backend_facts"], facts_run["faulted"]
    assert faulted["TRITON_MLA"]["kv_cache_dtypes"] == ["auto", "fp8_e5m2"]
    assert faulted["FLASHMLA"]["block_sizes"] == ["%32", 256]
    # a method that raises is that fact's error, on one line; the backend's other facts stand
    cutlass = faulted["CUTLASS_MLA"]
    assert cutlass["compute_capability"] == {"error": "RuntimeError: planted second line"}
    assert cutlass["compute_capabilities"] == {"error": "RuntimeError: planted second line"}
    assert {k: v for k, v in cutlass.items() if not k.startswith("compute_capabilit")} == \
        {k: v for k, v in clean["CUTLASS_MLA"].items() if not k.startswith("compute_capabilit")}
    untouched = set(clean) - {"TRITON_MLA", "FLASHMLA", "CUTLASS_MLA"}
    assert {name: faulted[name] for name in untouched} == {name: clean[name] for name in untouched}


def test_a_backend_class_that_does_not_import_is_an_error_entry(facts_run):
    clean, facts = facts_run["clean"]["backend_facts"], facts_run["unimportable"]
    assert facts["FLASHMLA"] == {"error": "ModuleNotFoundError: import of vllm.v1.attention.backends.mla.flashmla "
                                          "halted; None in sys.modules"}
    assert facts["TRITON_MLA"]["class"] == clean["TRITON_MLA"]["class"]  # the others are still read
    assert facts["FLASHMLA_SPARSE"] == facts_run["faulted"]["FLASHMLA_SPARSE"]


def test_what_vllms_cuda_platform_decides_is_read_from_its_code(facts_run):
    """Literals read in vLLM 0.34.0's source: platforms/cuda.py ``_get_backend_priorities``, platforms/interface.py
    ``get_mla_prefill_backend_cls``, mla/prefill/{flash_attn,trtllm_ragged,flashinfer}.py, fa_utils.py
    (``flash_attn_supports_kv_cache_dtype``: fp8 KV only with FA3 on sm90 or FA4 on sm100)."""
    metadata = facts_run["clean"]
    orders = metadata["backend_priorities"]
    assert list(orders) == ["sm80", "sm90", "sm100", "sm120"]
    dense_tail = ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"]
    assert orders["sm90"]["mla"] == {
        "order": dense_tail + ["FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM90"],
        "when": [{"args": {"head_size": 512},
                  "order": dense_tail + ["FLASHINFER_MLA_SPARSE_SM90", "FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"]}]}
    blackwell = ["FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"]
    assert orders["sm100"]["mla"] == {
        "order": blackwell + ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"],
        "when": [{"args": {"kv_cache_dtype": "fp8"}, "order": blackwell + ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]},
                 {"args": {"num_heads": 16},
                  "order": blackwell + ["FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]}]}
    assert orders["sm120"]["mla"] == {"order": ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"], "when": []}
    assert orders["sm100"]["standard"]["order"] == ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION",
                                                    "TURBOQUANT"]
    prefill = metadata["prefill_facts"]
    assert prefill["TRTLLM_RAGGED"]["mla_dimensions"] == ["128/64/128", "192/64/256"]
    assert prefill["TRTLLM_RAGGED"]["compute_capability"] == "10.x"
    # FLASH_ATTN overrides supports_mla_dimensions (its ClassVar lists none): the method is what is asked
    assert prefill["FLASH_ATTN"]["mla_dimensions"] == ["64/64/128", "128/64/128", "192/64/256"]
    assert prefill["CPU"]["mla_dimensions"] == "any"
    assert "error" in prefill["CUSTOM"]
    every = ["64/32/64", "64/64/128", "128/64/128", "192/64/256", "other"]
    assert metadata["prefill_priorities"]["sm90"] == [{"dims": every, "order": ["FLASH_ATTN"]}]
    assert metadata["prefill_priorities"]["sm100"] == [
        {"dims": ["64/32/64", "64/64/128", "128/64/128", "other"],
         "order": ["FLASH_ATTN", "TRTLLM_RAGGED", "FLASHINFER", "TOKENSPEED_MLA"]},
        {"dims": ["192/64/256"], "order": ["TRTLLM_RAGGED", "FLASH_ATTN", "FLASHINFER", "TOKENSPEED_MLA"]}]
    by_arch = metadata["backend_facts_by_arch"]
    assert "sm90" not in by_arch  # the arch backend_facts answer for
    assert by_arch["sm80"]["FLASH_ATTN"] == {"kv_cache_dtypes": ["auto", "float16", "bfloat16"], "mm_prefix": False,
                                             "sink": False}  # FlashAttention 2
    assert "FLASH_ATTN" not in by_arch["sm100"]  # FlashAttention 4: fp8 KV as FA3 on sm90
    assert "TRITON_MLA" not in by_arch["sm80"]


def test_what_the_platform_decides_follows_faults_planted_in_vllm(facts_run):
    faulted = facts_run["decisions_faulted"]
    for arch in ("sm80", "sm90", "sm100", "sm120"):
        assert faulted["backend_priorities"][arch] == {"mla": {"order": ["TRITON_MLA"], "when": []},
                                                       "standard": {"order": ["FLEX_ATTENTION"], "when": []}}
        groups = faulted["prefill_priorities"][arch]
        assert [g["order"] for g in groups] == [["TOKENSPEED_MLA", "FLASH_ATTN"]]
    assert faulted["prefill_facts"]["TRTLLM_RAGGED"]["mla_dimensions"] == ["64/64/128"]
    # the probe that reads the prefill order leaves vLLM's enum as it was
    assert facts_run["prefill_class_after"] == "FlashAttnPrefillBackend"


# -- the adapter's own failures, with a fake engine -------------------------------------------

FAKE_METADATA = "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n"
FAKE_MODULES = {
    # A vLLM whose CUDA platform class moved: the adapter cannot fake the arch.
    "no-cuda-platform": {
        "vllm/__init__.py": "",
        "vllm/platforms/__init__.py": "current_platform = None\n",
        "vllm/platforms/cuda.py": "class SomethingElse:\n    pass\n",
        "vllm/platforms/interface.py": "class DeviceCapability:\n    def __init__(self, major, minor):\n"
                                       "        self.major, self.minor = major, minor\n",
    },
    # The platform is there, the config classes are not.
    "no-config": {
        "vllm/__init__.py": "",
        "vllm/platforms/__init__.py": "current_platform = None\n",
        "vllm/platforms/cuda.py": textwrap.dedent("""
            class NonNvmlCudaPlatform:
                @classmethod
                def get_device_capability(cls, device_id=0):
                    raise ValueError("a real vLLM would ask the GPU")

                @classmethod
                def get_attn_backend_cls(cls, *args, **kwargs):
                    raise ValueError("Selected backend is not valid for this configuration")

                @classmethod
                def device_count(cls):
                    return 1
        """),
        "vllm/platforms/interface.py": "class DeviceCapability:\n    def __init__(self, major, minor):\n"
                                       "        self.major, self.minor = major, minor\n",
        "vllm/v1/__init__.py": "",
        "vllm/v1/attention/__init__.py": "",
        "vllm/v1/attention/backends/__init__.py": "",
        "vllm/v1/attention/backends/mla/__init__.py": "",
        "vllm/v1/attention/backends/mla/cutlass_mla.py": "",
        "vllm/_custom_ops.py": "",
    },
}
FAKE_STEPS = {
    "no-cuda-platform": ("platform", "vLLM's CUDA platform class not found; tried vllm.platforms.cuda:NonNvmlCudaPlatform "
                                     "(no attribute 'NonNvmlCudaPlatform'); vllm.platforms.cuda:CudaPlatform "
                                     "(no attribute 'CudaPlatform')"),
    "no-config": ("import", "vllm.config.ModelConfig not found; tried vllm.config "
                            "(ModuleNotFoundError: No module named 'vllm.config')"),
}
FAKE_MATRIX = """
[engine]
name = "vllm"
version = "*"

[axes]
model   = ["deepseek-v3"]
backend = ["TRITON_MLA", "TRITON_ATTN"]
dcp     = [1]
spec    = ["none"]
arch    = ["sm90"]

# What a real vLLM says; an adapter that cannot drive the engine must not pass or fail these.
[[rule]]
when = { backend = "TRITON_ATTN" }
reject = { error = "ValueError", match = "^Selected backend" }
"""


@pytest.mark.parametrize("fake", sorted(FAKE_MODULES))
def test_an_engine_the_adapter_cannot_drive_is_error_naming_step_and_version(pytester, monkeypatch, fake):
    """Every cell is ``error`` with the adapter's step and the engine version, never an engine verdict."""
    root = pytester.path / "fakevllm"
    for name, text in FAKE_MODULES[fake].items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    dist = root / "vllm-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(FAKE_METADATA)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.fspath(root), os.environ.get("PYTHONPATH", "")]))
    pytester.makefile(".toml", m=FAKE_MATRIX)
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "--mla-kernel=off", "-p", "no:xdist",
                                           "--mla-report-dir=reports", "--mla-report-name=m")
    result.assert_outcomes(failed=2)  # verdict error fails its test item
    result.stdout.fnmatch_lines(["*: error", "*adapter error: adapter step*"])
    doc = read_results(pytester.path / "reports" / "m.json")
    step, message = FAKE_STEPS[fake]
    expected = f"adapter error: adapter step '{step}' failed on vllm 9.9.9: {message}"
    for cell in doc["cells"]:
        assert cell["verdict"] == "error", cell
        assert cell["outcome"]["kind"] == "crashed" and cell["outcome"]["error"] == "AdapterError"
        assert cell["reason"] == expected


def test_glm_is_served_with_mla_and_minicpm3_is_not():
    """Read in vLLM 0.34.0's source: config/model.py's is_deepseek_mla lists glm4_moe_lite and not minicpm3
    (minicpm3.py builds standard Attention layers); TOKENSPEED_MLA needs qk_nope_head_dim 128
    (tokenspeed_mla.py supports_combination), FLASHINFER_MLA_SPARSE 128 or 192 and an index_topk
    (flashinfer_mla_sparse.py); GLM-4.7-Flash's geometry is 512 + 64 latent, 192/64/256, 20 heads. Its sm100
    verify prefill (TRTLLM_RAGGED) calls FlashInfer's trtllm_ragged_attention_deepseek, which this host lacks."""
    _, cells = committed_slice(
        "vllm-0.34.0", "--mla-select=model=minicpm3-4b,glm-4.7-flash", "--mla-select=dcp=1,2",
        "--mla-select=backend=TRITON_MLA,TOKENSPEED_MLA,FLASHINFER_MLA_SPARSE,FLASHMLA",
        "--mla-select=arch=sm90,sm100", "--mla-select=kv_dtype=auto,fp8", "--mla-select=page_size=64")

    def cell(model, backend, arch, dcp=1, spec="none", kv="auto"):
        return cells[f"{model}/{backend}/dcp{dcp}/{spec}/{arch}/kv-{kv}/page64"]

    minicpm3 = [c for c in cells.values() if c["coords"]["model"] == "minicpm3-4b"]
    assert minicpm3 and all(c["verdict"] == "skip" and c["outcome"]["error"] == "NotServedError" for c in minicpm3)
    assert "use_mla is False" in minicpm3[0]["reason"] and "standard attention" in minicpm3[0]["reason"]
    triton = cell("glm-4.7-flash", "TRITON_MLA", "sm90")["kernel"]
    assert triton["status"] == "verified" and triton["level"] == "backend", triton
    assert (triton["case"]["d_qk"], triton["case"]["d_v"], triton["case"]["h_q"]) == (576, 512, 20)
    # the schedule case split its long request; the first run replayed 3 requests on vLLM's 4-request FULL graph
    assert triton["schedule"] == {"graph_padded_to": [4], "num_kv_splits": [1, 2]}
    assert cell("glm-4.7-flash", "FLASHMLA", "sm90")["kernel"]["status"] == "verified"
    tokenspeed = cell("glm-4.7-flash", "TOKENSPEED_MLA", "sm100", kv="fp8")["outcome"]
    assert tokenspeed["kind"] == "rejected" and "got (192, 64, 256)" in tokenspeed["message"], tokenspeed
    sparse = cell("glm-4.7-flash", "FLASHINFER_MLA_SPARSE", "sm100")["outcome"]
    assert "FlashInfer MLA Sparse requires model with index_topk config" in sparse["message"], sparse
    verify = cell("glm-4.7-flash", "TRITON_MLA", "sm100", dcp=2, spec="eagle-1x3")["kernel"]
    assert verify["status"] == "not-run", verify
    assert "flashinfer.prefill.trtllm_ragged_attention_deepseek is an import stub" in verify["reason"], verify


def test_the_cpu_platform_hands_a_320_wide_latent_to_cpu_mla_whose_op_refuses_it():
    """CPU_MLA lists [576] (cpu_mla.py:61-64) but vLLM's CPU platform returns it for every MLA model without
    asking; its op mla_decode_kvcache is compiled for (576, 512, 16) only: TORCH_CHECK "Unsupported block size"
    at the first decode, whatever backend was forced. DeepSeek's 576 verifies on the same path."""
    _, cells = committed_slice(
        "vllm-0.34.0", "--mla-select=model=mistral-small-4,deepseek-v3", "--mla-select=dcp=1", "--mla-select=spec=none",
        "--mla-select=backend=CPU_MLA,FLASHMLA,auto", "--mla-select=arch=cpu", "--mla-select=kv_dtype=auto",
        "--mla-select=page_size=16")
    for backend in ("CPU_MLA", "FLASHMLA", "auto"):
        mistral = cells[f"mistral-small-4/{backend}/dcp1/none/cpu/kv-auto/page16"]
        assert mistral["outcome"]["kind"] == "accepted" and mistral["verdict"] == "xfail", mistral
        assert (mistral["kernel"]["raised"], mistral["kernel"]["raised_text"]) == ("RuntimeError", "Unsupported block size")
        assert mistral["kernel"]["function"] == "vllm._cpu_ops:mla_decode_kvcache_cpu", mistral["kernel"]
        deepseek = cells[f"deepseek-v3/{backend}/dcp1/none/cpu/kv-auto/page16"]["kernel"]
        assert deepseek["status"] == "verified", deepseek


def test_a_320_wide_latent_is_refused_where_vllm_lists_head_sizes_and_breaks_cutlass_mla():
    """Mistral Small 4 (256 + 64 latent, head size 320; read in vLLM 0.34.0's source): AMX_MLA and CPU_MLA
    list [576] (get_supported_head_sizes), FLASHMLA_SPARSE [576, 512]; CUTLASS_MLA lists none and accepts it,
    then _sm100_cutlass_mla_decode asserts D_latent == 512 (cutlass_mla.py:190-192). GLM-5 (sparse, 64 heads)
    gathers 64 heads under DCP 2, which FA4 sparse takes (DeepSeek-V3.2's 128 it refuses)."""
    _, cells = committed_slice(
        "vllm-0.34.0", "--mla-select=model=mistral-small-4,glm-5,deepseek-v3.2", "--mla-select=dcp=1,2",
        "--mla-select=spec=none", "--mla-select=backend=AMX_MLA,FLASHMLA_SPARSE,CUTLASS_MLA,TRITON_MLA,"
        "FLASH_ATTN_MLA_SPARSE_FA4,FLASHMLA", "--mla-select=arch=sm90,sm100", "--mla-select=kv_dtype=auto",
        "--mla-select=page_size=128")

    def cell(model, backend, arch, dcp=1):
        return cells[f"{model}/{backend}/dcp{dcp}/none/{arch}/kv-auto/page128"]

    for backend in ("AMX_MLA", "FLASHMLA_SPARSE"):
        refused = cell("mistral-small-4", backend, "sm90")["outcome"]
        assert refused["kind"] == "rejected" and "'head_size not supported'" in refused["message"], refused
    cutlass = cell("mistral-small-4", "CUTLASS_MLA", "sm100")
    assert cutlass["outcome"]["kind"] == "accepted" and cutlass["verdict"] == "xfail", cutlass
    assert cutlass["kernel"]["raised"] == "AssertionError", cutlass["kernel"]
    assert cutlass["kernel"]["function"].endswith("CutlassMLAImpl._sm100_cutlass_mla_decode")
    triton = cell("mistral-small-4", "TRITON_MLA", "sm90")["kernel"]
    assert triton["status"] == "verified" and (triton["case"]["d_qk"], triton["case"]["d_v"]) == (320, 256), triton
    # FLASHMLA lists no head size either: accepted on SM90, then FlashMLA's own TORCH_CHECK refuses 320
    # (kept by the emulation; it used to be "out of contract" and the cell not-run)
    flashmla = cell("mistral-small-4", "FLASHMLA", "sm90")
    assert flashmla["outcome"]["kind"] == "accepted" and flashmla["verdict"] == "xfail", flashmla
    assert flashmla["kernel"]["raised"] == "RuntimeError", flashmla["kernel"]
    assert flashmla["kernel"]["raised_text"] == "Only head_size_k == 576 or 512 is supported", flashmla["kernel"]
    fa4 = cell("glm-5", "FLASH_ATTN_MLA_SPARSE_FA4", "sm100", dcp=2)["outcome"]
    assert "gathered query heads" not in (fa4.get("message") or ""), fa4
    assert "gathered query heads" in cell("deepseek-v3.2", "FLASH_ATTN_MLA_SPARSE_FA4", "sm100", dcp=2)["outcome"]["message"]
