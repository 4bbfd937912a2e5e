"""The SGLang adapter.

Two kinds of tests:

* against ``fake_sglang/`` (always run): a tiny fake ``sglang`` with SGLang's
  start-up call shapes and hand-written checks (see its ``__init__``). The
  expectations below are written from the fake's source. They check the
  adapter's mechanics: a draft-side constructor's refusal is the engine's,
  a CUDA-only failure after the checks is a note, an adapter-side problem
  is verdict ``error`` naming the step and version, never a refusal;
* against the real releases, inside their venvs (``.venv-sglang`` is 0.5.23,
  ``.venv-sglang-0.5.22``/``-0.5.21``/``-0.5.20``), skipped when a venv is absent; what a
  release does in a platform's slice is read in its committed report (``committed_slice``),
  which CI recomputes and holds to the committed one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from pytest_mla.report.results import read_results

from ._venv import ROOT, committed_slice, run_matrix, venv_python

pytest_plugins = ["pytester"]

MATRIX = ROOT / "matrix" / "sglang.toml"
FAKE = ROOT / "tests" / "engines" / "fake_sglang"
SEED_0523 = "returns no rank-local LSE for the cross-rank merge. Select cutedsl_mla.\" }"
NARROW = ("--mla-select=model=deepseek-v3", "--mla-select=backend=trtllm_mla", "--mla-select=dcp=1,4",
          "--mla-select=arch=sm100", "--mla-select=kv_dtype=auto")

#: The real releases and the venvs that hold them.
RELEASES = {"0.5.20": ".venv-sglang-0.5.20", "0.5.21": ".venv-sglang-0.5.21",
            "0.5.22": ".venv-sglang-0.5.22", "0.5.23": ".venv-sglang"}
#: Read in each release's sglang/srt/runtime_context.py (_PLATFORM_PROBES): 0.5.22 added these two.
FACTS_SINCE_0522 = {"is_mps", "is_sm110"}

FLASHINFER_MLA_TREES = "Currently Flashinfer MLA only supports topk=1 for speculative decoding"

# Written from fake_sglang's source (attention_registry.py, fake_backend.py, draft_utils.py), in its order.
FAKE_MATRIX = textwrap.dedent("""
    [engine]
    name = "sglang"
    version = "==0.9.0"

    [axes]
    model = ["deepseek-v3", "llama-3.1-8b"]
    backend = ["fake_mla", "cuda_probe"]
    dcp = [1]
    spec = ["none", "eagle-1x3", "eagle-4x3"]
    arch = ["sm80", "sm90"]
    kv_dtype = ["auto", "fp8_e5m2"]

    [[rule]]
    when = { backend = "fake_mla", "model.mla" = false }
    reject = { error = "ValueError", message = "fake_mla backend can only be used with MLA models." }

    [[rule]]
    when = { backend = "fake_mla", arch = "sm80" }
    reject = { error = "AssertionError", message = "fake_mla needs SM90 or newer" }

    [[rule]]
    when = { backend = "fake_mla", kv_dtype = "fp8_e5m2" }
    reject = { error = "ValueError", message = "FakeMLA does not support kv-cache-dtype fp8_e5m2." }

    [[rule]]
    when = { backend = "fake_mla", "spec.topk" = ">1" }
    reject = { error = "ValueError", message = "Currently FakeMLA only supports topk=1 for speculative decoding" }

    [[rule]]
    when = { backend = "cuda_probe", "spec.enabled" = true }
    reject = { error = "ValueError", message = "EAGLE is not supported in decode attention backend cuda_probe" }
""")


# ---- the fake engine ----------------------------------------------------------------------------

@pytest.fixture
def fake(pytester, monkeypatch):
    """A pytester dir whose subprocesses import ``fake_sglang`` as ``sglang`` (ahead of a real one)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAKE), str(ROOT), os.environ.get("PYTHONPATH")])))
    for switch in ("FAKE_SGLANG_EXTRA_FACT", "FAKE_SGLANG_NO_DRAFT_FACTORY"):
        monkeypatch.delenv(switch, raising=False)
    pytester.makefile(".toml", m=FAKE_MATRIX)
    return pytester


def run_fake(pytester):
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "--mla-kernel=off", "-p", "no:cacheprovider",
                                           "--mla-report-dir=reports", "--mla-report-name=m")
    doc = read_results(pytester.path / "reports" / "m.json")
    return result, {c["id"]: c for c in doc["cells"]}, doc


def test_a_draft_side_constructor_refusal_is_the_engines_refusal(fake):
    """FakeMLAMultiStepDraftBackend.__init__ (built by the draft worker) refuses trees: the cell is refused."""
    result, cells, _ = run_fake(fake)
    assert result.ret == 0, result.stdout.str()
    assert len(cells) == 48 and {c["verdict"] for c in cells.values()} == {"pass"}
    tree = cells["deepseek-v3/fake_mla/dcp1/eagle-4x3/sm90/kv-auto"]["outcome"]
    assert (tree["kind"], tree["error"], tree["message"]) == (
        "rejected", "ValueError", "Currently FakeMLA only supports topk=1 for speculative decoding")
    # A chain gets through the draft worker: every constructor ran until its first GPU step.
    chain = cells["deepseek-v3/fake_mla/dcp1/eagle-1x3/sm90/kv-auto"]
    assert chain["outcome"]["kind"] == "accepted"
    assert chain["outcome"]["backends"]["draft_decode"] == "FakeMLAMultiStepDraftBackend"
    assert ("[draft worker] FakeMLAMultiStepDraftBackend.__init__ stopped at torch.zeros(device='cuda') "
            "(fake_backend.py:23) after its checks") in chain["notes"]
    assert ("[target] FakeMLABackend.__init__ stopped at torch.empty(device='cuda') (fake_backend.py:15) "
            "after its checks") in chain["notes"]
    # The check FakeMLABackend.__init__ makes after its allocation is never reached.
    assert "never reached without a GPU" not in json.dumps(list(cells.values()))


def test_a_cuda_only_failure_after_the_checks_is_a_note_not_a_refusal(fake):
    """CudaProbeBackend.__init__ asserts CUDA (AssertionError on this host) after its checks."""
    _, cells, _ = run_fake(fake)
    for arch in ("sm80", "sm90"):
        cell = cells[f"llama-3.1-8b/cuda_probe/dcp1/none/{arch}/kv-auto"]
        assert cell["verdict"] == "pass" and cell["outcome"]["kind"] == "accepted"
        assert any(n.startswith("[target] CudaProbeBackend.__init__ stopped at AssertionError: Torch not compiled "
                                "with CUDA enabled") for n in cell["notes"]), cell["notes"]


def test_a_wrappers_own_check_after_it_copied_a_stopped_backends_fields_still_runs(fake):
    """FakeWrapperBackend copies a field its stopped inner backend never set, then checks the model.

    The copy goes on (an ``UnsetField``); the refusal after it is the engine's, as on a GPU host
    (SGLang's MiniCPMSparseBackend refuses non-MiniCPM models after it copied FlashAttentionBackend's
    pools); where the wrapper uses the copied field, that use is its GPU step, named with the field.
    """
    fake.makefile(".toml", w=textwrap.dedent("""
        [engine]
        name = "sglang"
        version = "==0.9.0"

        [axes]
        model = ["deepseek-v3", "llama-3.1-8b"]
        backend = ["fake_wrapper"]
        dcp = [1]
        spec = ["none"]
        arch = ["sm90"]
        kv_dtype = ["auto"]

        [[rule]]
        when = { backend = "fake_wrapper", "model.mla" = false }
        reject = { error = "ValueError", message = "fake_wrapper serves MLA models only" }
    """))
    result = fake.runpytest_subprocess("--mla-matrix=w.toml", "--mla-kernel=off", "-p", "no:cacheprovider",
                                       "--mla-report-dir=reports", "--mla-report-name=w")
    assert result.ret == 0, result.stdout.str()
    cells = {c["id"]: c for c in read_results(fake.path / "reports" / "w.json")["cells"]}
    refused = cells["llama-3.1-8b/fake_wrapper/dcp1/none/sm90/kv-auto"]["outcome"]
    assert (refused["kind"], refused["error"], refused["message"]) == (
        "rejected", "ValueError", "fake_wrapper serves MLA models only")
    accepted = cells["deepseek-v3/fake_wrapper/dcp1/none/sm90/kv-auto"]
    assert accepted["outcome"]["kind"] == "accepted"
    # torch.zeros checks its argument's type before anything could ask the stand-in: torch's TypeError names it
    assert any(n.startswith("[target] FakeWrapperBackend.__init__ stopped at TypeError: zeros(): argument 'size' ")
               and "not UnsetField (fake_backend.py:" in n for n in accepted["notes"]), accepted["notes"]


def test_the_release_gets_only_the_platform_facts_it_knows(fake):
    """Like 0.5.20/0.5.21 the fake has no is_mps/is_sm110 and raises ValueError for unknown facts."""
    result, cells, doc = run_fake(fake)
    assert result.ret == 0, result.stdout.str()
    assert not any("unknown platform fact" in json.dumps(c) for c in cells.values())
    facts = set(doc["run"]["engine"]["metadata"]["platform_facts"])
    assert "is_sm90" in facts and not facts & FACTS_SINCE_0522


@pytest.mark.parametrize(("switch", "step", "text"), [
    ("FAKE_SGLANG_EXTRA_FACT", "platform",
     "SGLang knows platform fact(s) ['is_sm999'] that the adapter cannot derive from a GPU arch"),
    ("FAKE_SGLANG_NO_DRAFT_FACTORY", "import",
     "cannot find sglang.srt.speculative.draft_utils.DraftBackendFactory (absent)"),
], ids=["unknown-platform-fact", "moved-hook"])
def test_an_adapter_problem_is_an_error_never_a_refusal(fake, monkeypatch, switch, step, text):
    monkeypatch.setenv(switch, "1")
    result, cells, _ = run_fake(fake)
    assert result.ret == 1
    assert {c["verdict"] for c in cells.values()} == {"error"}
    for cell in cells.values():
        assert cell["outcome"]["kind"] == "crashed" and cell["outcome"]["error"] == "AdapterError"
        assert cell["reason"] == f"adapter error: adapter step '{step}' failed on sglang 0.9.0: {text}", cell["reason"]


def test_registered_backends_are_decided_by_the_factories(monkeypatch):
    """mha_only refuses an MLA model on every arch; fake_mla refuses sm80 only; cuda_probe and fake_wrapper
    (which refuses non-MLA models only) never."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE), str(ROOT)])}
    code = "import json; from pytest_mla.engines.sglang import SGLangEngine; print(json.dumps(SGLangEngine().registered_backends()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "cuda_probe": True, "fake_mla": True, "fake_wrapper": True, "mha_only": False, "triton": True}


# ---- the real releases ---------------------------------------------------------------------------

def test_narrow_matrix_passes_against_the_real_engine(tmp_path):
    python = venv_python(".venv-sglang")
    result = run_matrix(python, MATRIX, tmp_path, *NARROW)
    assert result.returncode == 0, result.stdout + result.stderr
    report = read_results(next(tmp_path.glob("sglang-*[0-9].json")))
    cells = {c["id"]: c for c in report["cells"]}
    assert len(cells) == 6  # dcp 1,4 x spec none, eagle-1x3, eagle-4x3
    assert all(c["verdict"] == "pass" for c in cells.values())


def test_one_changed_message_fails_exactly_the_affected_cells(tmp_path):
    """Alter the 0.5.23 DCP + speculative message: only the cells it decides fail, with a readable diff."""
    python = venv_python(".venv-sglang")
    text = MATRIX.read_text()
    assert text.count(SEED_0523) == 1
    changed = tmp_path / "sglang.toml"
    changed.write_text(text.replace(SEED_0523, SEED_0523.replace("Select cutedsl_mla.", "Select flashmla.")))
    shutil.copy(MATRIX, tmp_path / "original.toml")
    result = run_matrix(python, changed, tmp_path / "reports", *NARROW)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    failed = sorted(set(re.findall(r"^FAILED \S*::(\S+)", out, re.M)))
    # Only DCP 4 with EAGLE chains reaches that rule; the draft tree is refused earlier (page size).
    assert failed == ["deepseek-v3-trtllm_mla-dcp4-eagle-1x3-sm100-kv-auto"], out
    assert "5 passed" in out and "1 failed" in out, out
    assert "expected: trtllm_mla cannot serve decode context parallelism" in out, out
    assert "Select flashmla." in out and "raised:   trtllm_mla cannot serve" in out, out
    assert re.search(r"raised:   .*Select cutedsl_mla\.$", out, re.M), out


def test_unknown_backend_and_cross_attention_reach_sglangs_own_checks(tmp_path):
    """`no_such_backend` is outside argparse's choices: built as Engine(**kwargs), refused by the registry lookup.

    The Mllama config is encoder-decoder: the triton factory's cross-attention assert refuses it.
    """
    python = venv_python(".venv-sglang")
    result = run_matrix(python, MATRIX, tmp_path, "--mla-select=model=llama-3.2-11b-vision,deepseek-v3",
                        "--mla-select=backend=triton,no_such_backend", "--mla-select=dcp=1",
                        "--mla-select=spec=none", "--mla-select=arch=sm90", "--mla-select=kv_dtype=auto")
    assert result.returncode == 0, result.stdout + result.stderr
    report = read_results(next(tmp_path.glob("sglang-*[0-9].json")))
    outcomes = {c["id"]: c["outcome"] for c in report["cells"]}
    assert len(outcomes) == 4
    for model in ("llama-3.2-11b-vision", "deepseek-v3"):
        unknown = outcomes[f"{model}/no_such_backend/dcp1/none/sm90/kv-auto"]
        assert (unknown["error"], unknown["message"]) == ("ValueError", "Invalid attention backend: no_such_backend")
    cross = outcomes["llama-3.2-11b-vision/triton/dcp1/none/sm90/kv-auto"]
    assert cross["error"] == "AssertionError"
    assert cross["message"].startswith("Cross attention is not supported in the triton attention backend.")
    assert outcomes["deepseek-v3/triton/dcp1/none/sm90/kv-auto"]["kind"] == "accepted"


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_each_release_knows_its_own_platform_facts(version):
    """The adapter reads the facts from the release: 0.5.20/0.5.21 lack is_mps and is_sm110."""
    python = venv_python(RELEASES[version])
    code = ("import json; from pytest_mla.engines.sglang import SGLangEngine; e = SGLangEngine(); "
            "print(json.dumps({'version': e.version, 'broken': str(e._broken or ''), "
            "'facts': sorted(e.metadata().get('platform_facts', []))}))")
    out = subprocess.run([os.fspath(python), "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["version"], got["broken"]) == (version, "")
    assert {"is_cuda", "is_sm90", "is_sm100", "is_blackwell", "device_capability"} <= set(got["facts"])
    if version >= "0.5.22":
        assert FACTS_SINCE_0522 <= set(got["facts"])
    else:
        assert not FACTS_SINCE_0522 & set(got["facts"])


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_flashinfer_mla_draft_trees_are_refused_by_the_draft_backend(tmp_path, version):
    """Issue 15: the draft worker's FlashInferMLAMultiStepDraftBackend refuses trees, in every release."""
    python = venv_python(RELEASES[version])
    result = run_matrix(python, MATRIX, tmp_path, "--mla-select=model=deepseek-v3", "--mla-select=backend=flashinfer",
                        "--mla-select=dcp=1", "--mla-select=arch=sm90", "--mla-select=kv_dtype=auto")
    assert result.returncode == 0, result.stdout + result.stderr
    cells = {c["id"]: c for c in read_results(next(tmp_path.glob("sglang-*[0-9].json")))["cells"]}
    assert len(cells) == 3 and all(c["verdict"] == "pass" for c in cells.values())
    tree = cells["deepseek-v3/flashinfer/dcp1/eagle-4x3/sm90/kv-auto"]["outcome"]
    assert (tree["kind"], tree["error"], tree["message"]) == ("rejected", "ValueError", FLASHINFER_MLA_TREES)
    chain = cells["deepseek-v3/flashinfer/dcp1/eagle-1x3/sm90/kv-auto"]
    assert chain["outcome"]["kind"] == "accepted"
    assert chain["outcome"]["backends"]["draft_decode"] == "FlashInferMLAMultiStepDraftBackend"
    assert any(n.startswith("[draft worker] FlashInferMLAMultiStepDraftBackend.__init__ stopped at ")
               for n in chain["notes"]), chain["notes"]


# ---- the other platforms: each in a child process that loaded SGLang on it (issue 25) ------------
# The texts are SGLang's own, read in 0.5.22's and 0.5.23's source (file and function named per text).

#: arg_groups/attention_hook.py _check_xpu_dcp
XPU_DCP_NEEDS_INTEL_XPU = "--dcp-size > 1 on Intel XPU needs --attention-backend intel_xpu."
XPU_DCP_NO_MLA = "--dcp-size > 1 is not supported for MLA models on Intel XPU."
XPU_DCP_KV_HEADS = ("--dcp-size 4 at --tp-size 4 needs each rank to hold its DCP group's KV heads, which "
                    "LlamaForCausalLM does not. Use a smaller --dcp-size.")
#: layers/attention/dsa_backend.py DeepseekSparseAttnBackend.__init__
DSA_ONLY = "DSA backend only supports DeepSeek DSA"
#: arg_groups/overrides.py _dsa_kv_cache_dtype_default
DSA_KV = "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype"
#: mem_cache/kv_cache_dtype.py configure_kv_cache_dtype
CPU_E5M2 = "--kv-cache-dtype fp8_e5m2 is not supported on CPU."
PLATFORM_RELEASES = [pytest.param(".venv-sglang", id="sglang-0.5.23"),
                     pytest.param(".venv-sglang-0.5.22", id="sglang-0.5.22")]
#: What each release does in a platform's slice, read in its committed report (``committed_slice``: CI
#: recomputes those reports and fails on any difference); the platform processes themselves run live in
#: the tests that inject faults there (test_sglang_checks.py) and in the order test below.
COMMITTED_RELEASES = ["sglang-0.5.23", "sglang-0.5.22"]


def _platform_cells(python, tmp_path, *select):
    result = run_matrix(python, MATRIX, tmp_path, *select, "-n", "0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = read_results(next(tmp_path.glob("sglang-*[0-9].json")))
    return report, {c["id"]: c for c in report["cells"]}


@pytest.mark.parametrize("release", COMMITTED_RELEASES)
def test_xpu_cells_meet_sglangs_xpu_checks_in_the_xpu_process(release):
    """XPU's DCP check refuses every backend but intel_xpu, then MLA, then Llama's KV-head layout;
    without DCP intel_xpu builds SGLang's XPUAttentionBackend, checked around sgl-kernel-xpu's emulated MLA ops."""
    report, cells = committed_slice(
        release, "--mla-select=model=deepseek-v3,llama-3.1-8b",
        "--mla-select=backend=triton,intel_xpu", "--mla-select=dcp=1,4", "--mla-select=spec=none",
        "--mla-select=arch=xpu", "--mla-select=kv_dtype=auto")
    assert len(cells) == 8

    def outcome(model, backend, dcp):
        return cells[f"{model}/{backend}/dcp{dcp}/none/xpu/kv-auto"]["outcome"]

    for model in ("deepseek-v3", "llama-3.1-8b"):
        assert outcome(model, "triton", 4)["message"] == XPU_DCP_NEEDS_INTEL_XPU
    assert outcome("deepseek-v3", "intel_xpu", 4)["message"] == XPU_DCP_NO_MLA
    assert outcome("llama-3.1-8b", "intel_xpu", 4)["message"] == XPU_DCP_KV_HEADS
    accepted = cells["deepseek-v3/intel_xpu/dcp1/none/xpu/kv-auto"]
    assert accepted["outcome"]["backends"]["decode"] == "XPUAttentionBackend"
    assert accepted["kernel"]["status"] == "verified" and accepted["kernel"]["level"] == "emulated", accepted["kernel"]
    assert "sgl_kernel:flash_mla_decode" in accepted["kernel"]["emulated"], accepted["kernel"]
    triton = cells["deepseek-v3/triton/dcp1/none/xpu/kv-auto"]  # SGLang's TritonAttnBackend, in the XPU process
    assert triton["kernel"]["status"] == "verified" and triton["kernel"]["level"] == "backend", triton["kernel"]
    assert "ran in a process that imported SGLang on its XPU platform, answering for xpu" in triton["kernel"]["notes"]
    assert report["run"]["engine"]["coverage"]["uncovered_mla"] == []


@pytest.mark.parametrize("release", COMMITTED_RELEASES)
def test_cpu_cells_meet_sglangs_cpu_checks_in_the_cpu_process(release):
    """intel_amx is IntelAMXAttnBackend with AMX tiles (checked around its emulated sgl-kernel ops) and
    torch_native without; no fp8_e5m2 cache on
    CPU; a DSA checkpoint crashes SGLang's start-up there (torch.cuda asked), the matrix's known bug."""
    _, cells = committed_slice(
        release, "--mla-select=model=deepseek-v3,deepseek-v3.2",
        "--mla-select=backend=intel_amx", "--mla-select=dcp=1", "--mla-select=spec=none",
        "--mla-select=arch=cpu,cpu_amx", "--mla-select=kv_dtype=auto,fp8_e5m2")
    assert len(cells) == 8
    amx = cells["deepseek-v3/intel_amx/dcp1/none/cpu_amx/kv-auto"]
    assert amx["outcome"]["backends"]["decode"] == "IntelAMXAttnBackend"
    # SGLang's own backend around sgl-kernel's CPU attention ops, emulated (this host lacks the CPU build)
    assert amx["kernel"]["status"] == "verified" and amx["kernel"]["level"] == "emulated", amx["kernel"]
    assert amx["kernel"]["emulated"] == ["torch.ops.sgl_kernel:decode_attention_cpu"], amx["kernel"]
    no_amx = cells["deepseek-v3/intel_amx/dcp1/none/cpu/kv-auto"]["outcome"]
    assert no_amx["backends"]["decode"] == "TorchNativeAttnBackend"
    for arch in ("cpu", "cpu_amx"):
        e5m2 = cells[f"deepseek-v3/intel_amx/dcp1/none/{arch}/kv-fp8_e5m2"]["outcome"]
        assert (e5m2["error"], e5m2["message"]) == ("ValueError", CPU_E5M2)
        sparse = cells[f"deepseek-v3.2/intel_amx/dcp1/none/{arch}/kv-auto"]
        assert sparse["verdict"] == "xfail" and sparse["outcome"]["kind"] == "crashed"
        assert "model_hook.py" in sparse["outcome"]["message"], sparse["outcome"]


@pytest.mark.parametrize("venv", PLATFORM_RELEASES)
def test_a_cpu_amx_cell_first_in_the_cpu_process_answers_as_in_a_full_run(tmp_path, venv):
    """SGLang 0.5.22 binds torch.ops.sgl_kernel.apply_rotary_pos_emb_cpu when rotary_embedding loads
    on an AMX CPU (an op this host lacks), and the EAGLE path loads it lazily: a run whose first cell
    was cpu_amx crashed these cells, which a full run (a cpu cell first) accepts. The CPU child loads
    it as on a plain CPU before any cell (``platforms.PLAIN_LOADS``)."""
    _, cells = _platform_cells(
        venv_python(venv), tmp_path, "--mla-select=model=deepseek-v3", "--mla-select=backend=triton",
        "--mla-select=dcp=1", "--mla-select=spec=eagle-1x3", "--mla-select=arch=cpu_amx",
        "--mla-select=kv_dtype=auto,fp8_e4m3")
    assert sorted(cells) == [f"deepseek-v3/triton/dcp1/eagle-1x3/cpu_amx/kv-{kv}" for kv in ("auto", "fp8_e4m3")]
    for cell in cells.values():
        assert cell["verdict"] == "pass" and cell["outcome"]["kind"] == "accepted", cell["outcome"]


@pytest.mark.parametrize("release", COMMITTED_RELEASES)
def test_rocm_cells_meet_sglangs_checks_and_aiter_wave_are_unreachable(release):
    """On gfx942/gfx950: dsa refuses a dense model and an fp8_e5m2 DSA cache and builds its backend for
    DeepSeek-V3.2; aiter and wave stop where their modules need AMD's libraries: skips naming them."""
    _, cells = committed_slice(
        release, "--mla-select=model=deepseek-v3,deepseek-v3.2",
        "--mla-select=backend=dsa,aiter,wave", "--mla-select=dcp=1", "--mla-select=spec=none",
        "--mla-select=arch=gfx942,gfx950", "--mla-select=kv_dtype=auto,fp8_e5m2")
    assert len(cells) == 24
    for arch in ("gfx942", "gfx950"):
        dense = cells[f"deepseek-v3/dsa/dcp1/none/{arch}/kv-auto"]["outcome"]
        assert (dense["error"], dense["message"]) == ("AssertionError", DSA_ONLY)
        e5m2 = cells[f"deepseek-v3.2/dsa/dcp1/none/{arch}/kv-fp8_e5m2"]["outcome"]
        assert (e5m2["error"], e5m2["message"]) == ("AssertionError", DSA_KV)
        sparse = cells[f"deepseek-v3.2/dsa/dcp1/none/{arch}/kv-auto"]["outcome"]
        assert sparse["backends"]["decode"] == "DeepseekSparseAttnBackend"
        wave = cells[f"deepseek-v3/wave/dcp1/none/{arch}/kv-auto"]
        assert wave["verdict"] == "skip" and wave["outcome"]["error"] == "UnreachableError"
        assert "'wave_lang'" in wave["reason"]
        aiter = cells[f"deepseek-v3/aiter/dcp1/none/{arch}/kv-auto"]
        assert aiter["verdict"] == "skip" and aiter["outcome"]["error"] == "UnreachableError"


@pytest.mark.parametrize("release", COMMITTED_RELEASES)
def test_npu_cells_stop_at_torch_npu_and_other_platforms_backends_are_out_of_scope(release):
    """Loading SGLang for the NPU platform imports torch_npu: a skip naming it, never a refusal. A platform's
    own backend on another platform is outside the matrix (skipped without reaching SGLang)."""
    _, cells = committed_slice(
        release, "--mla-select=model=deepseek-v3", "--mla-select=backend=ascend,intel_amx",
        "--mla-select=dcp=1", "--mla-select=spec=none", "--mla-select=arch=npu,cpu_amx",
        "--mla-select=kv_dtype=auto")
    assert len(cells) == 4
    ascend = cells["deepseek-v3/ascend/dcp1/none/npu/kv-auto"]
    assert ascend["verdict"] == "skip" and ascend["outcome"]["error"] == "UnreachableError"
    assert "'torch_npu'" in ascend["reason"]
    for cell_id in ("deepseek-v3/intel_amx/dcp1/none/npu/kv-auto", "deepseek-v3/ascend/dcp1/none/cpu_amx/kv-auto"):
        assert cells[cell_id]["verdict"] == "skip" and cells[cell_id]["outcome"] is None
        assert cells[cell_id]["reason"].startswith("outside this matrix: ")


@pytest.mark.parametrize("release", COMMITTED_RELEASES)
def test_minicpm3_and_glm_cells_meet_sglangs_code_at_their_geometry(release):
    """Read in SGLang's source (configs/model_config.py: the MiniCPM3ForCausalLM branch sets kv_lora_rank and
    qk_rope_head_dim, never qk_nope_head_dim; flashinfer_mla_backend.py's prefill updater and
    trtllm_mla_backend.py's constructor read it) and the checkpoints' geometry (MiniCPM3: 256 + 32 = 288-wide
    latent, 40 heads; GLM-4.7-Flash: 512 + 64, 20 heads): backends that never read the attribute check at
    MiniCPM3's latent; those that do fail building the backend, declared; GLM is served like DeepSeek."""
    _, cells = committed_slice(
        release, "--mla-select=model=minicpm3-4b,glm-4.7-flash",
        "--mla-select=backend=triton,fa3,flashinfer,flashmla,trtllm_mla", "--mla-select=dcp=1",
        "--mla-select=spec=none", "--mla-select=arch=sm90,sm100", "--mla-select=kv_dtype=auto")

    def cell(model, backend, arch):
        return cells[f"{model}/{backend}/dcp1/none/{arch}/kv-auto"]

    for backend, level in (("triton", "backend"), ("fa3", "emulated")):
        kernel = cell("minicpm3-4b", backend, "sm90")["kernel"]
        assert kernel["status"] == "verified" and kernel["level"] == level, kernel
        assert (kernel["case"]["d_qk"], kernel["case"]["d_v"], kernel["case"]["h_q"]) == (288, 256, 40), kernel["case"]
        glm = cell("glm-4.7-flash", backend, "sm90")["kernel"]
        assert glm["status"] == "verified" and (glm["case"]["d_qk"], glm["case"]["h_q"]) == (576, 20), glm["case"]
    for backend in ("flashinfer", "flashmla"):
        broken = cell("minicpm3-4b", backend, "sm90")
        assert broken["verdict"] == "xfail" and broken["kernel"]["raised"] == "AttributeError", broken["kernel"]
        assert "qk_nope_head_dim" in broken["kernel"]["raised_text"]
        assert broken["kernel"]["function"].endswith("FlashInferMLAIndicesUpdaterPrefill.__init__")
    trtllm = cell("minicpm3-4b", "trtllm_mla", "sm100")  # its constructor runs at start-up: a crash, declared
    assert trtllm["verdict"] == "xfail" and trtllm["outcome"]["kind"] == "crashed", trtllm["outcome"]
    assert "qk_nope_head_dim" in trtllm["outcome"]["message"]
    assert cell("minicpm3-4b", "trtllm_mla", "sm90")["outcome"]["kind"] == "rejected"  # Blackwell only, as for DeepSeek
    assert cell("glm-4.7-flash", "trtllm_mla", "sm100")["outcome"]["kind"] == "accepted"


@pytest.mark.parametrize("release", COMMITTED_RELEASES)
def test_mistral_small_4_and_glm_5_meet_sglangs_code_at_their_geometry(release):
    """Read in SGLang's source: Mistral Small 4 (MistralLarge3ForCausalLM from its params.json: a 256 + 64 = 320-wide
    latent, 32 heads) starts on every MLA backend; triton's grouped decode splits the key only at 576 and 288
    (decode_attention.py: _decode_grouped_att_m_fwd) and fails to build at 320, FlashMLA's TORCH_CHECK refuses 320
    (kept by the emulation), fa3 verifies there. GLM-5 (GlmMoeDsaForCausalLM with index_topk: DSA) is scoped like
    DeepSeek-V3.2: its dense CUDA cells are outside the matrix, flex_attention checks at its 576-wide latent."""
    _, cells = committed_slice(
        release, "--mla-select=model=mistral-small-4,glm-5", "--mla-select=backend=triton,fa3,flashmla,flex_attention",
        "--mla-select=dcp=1", "--mla-select=spec=none", "--mla-select=arch=sm90", "--mla-select=kv_dtype=auto")

    def cell(model, backend):
        return cells[f"{model}/{backend}/dcp1/none/sm90/kv-auto"]

    triton = cell("mistral-small-4", "triton")
    assert triton["verdict"] == "xfail" and triton["outcome"]["kind"] == "accepted", triton
    kernel = triton["kernel"]
    assert (kernel["status"], kernel["level"], kernel["raised"]) == ("failed", "backend", "InterpreterError"), kernel
    assert "incompatible dimensions at index 1: 256 and 512" in kernel["raised_text"]
    assert kernel["function"] == "sglang.kernels.ops.attention.decode_attention:_decode_grouped_att_m_fwd"
    assert (kernel["case"]["d_qk"], kernel["case"]["d_v"], kernel["case"]["h_q"]) == (320, 256, 32), kernel["case"]
    flashmla = cell("mistral-small-4", "flashmla")
    assert flashmla["verdict"] == "xfail" and flashmla["kernel"]["raised"] == "RuntimeError", flashmla["kernel"]
    assert flashmla["kernel"]["raised_text"] == "Only head_size_k == 576 or 512 is supported"
    fa3 = cell("mistral-small-4", "fa3")["kernel"]
    assert fa3["status"] == "verified" and (fa3["case"]["d_qk"], fa3["case"]["d_v"]) == (320, 256), fa3
    assert cell("glm-5", "triton")["verdict"] == "skip"
    flex = cell("glm-5", "flex_attention")["kernel"]
    assert flex["status"] == "verified" and (flex["case"]["d_qk"], flex["case"]["h_q"]) == (576, 64), flex["case"]
