"""The reproducers `pytest-mla repro` writes for SGLang's findings, run as a user runs them.

A small slice of matrix/sglang.toml runs first in .venv-sglang (SGLang's triton backend, DCP 4,
decode and EAGLE chain verify, an FP8 and a bf16 MLA checkpoint and a GQA model: every kind of
finding the matrix has, and one verified cell). For each finding the generated script then runs in
the engine's venv with pytest and pytest_mla unimportable (a poisoned path: importing either raises):
it must exit 1 naming SGLang's exception; on the fault-free path of the same configuration (DCP 1)
it must exit 0, and a fault planted in SGLang (through the script's MLA_REPRO_PATCH hook) must make
it exit 1 with the mismatch. Skipped without .venv-sglang.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from pytest_mla.cli import main
from pytest_mla.report.results import read_results

from ._venv import ROOT, run_matrix, venv_python

MATRIX = ROOT / "matrix" / "sglang.toml"
DECODE_V3 = "deepseek-v3/triton/dcp4/none/sm90/kv-auto"
DECODE_LITE = "deepseek-v2-lite/triton/dcp4/none/sm90/kv-auto"
VERIFY_V3 = "deepseek-v3/triton/dcp4/eagle-1x3/sm90/kv-auto"  # FP8 checkpoint: its layers carry k_scale
VERIFY_LITE = "deepseek-v2-lite/triton/dcp4/eagle-1x3/sm90/kv-auto"  # bf16 checkpoint: none
VERIFY_GQA = "llama-3.1-8b/triton/dcp4/eagle-1x3/sm90/kv-auto"
FINDINGS = {
    DECODE_V3: ("AssertionError", "sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.set_kv_buffer"),
    VERIFY_V3: ("AssertionError", "sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.set_kv_buffer"),
    VERIFY_LITE: ("TypeError", "sglang.srt.layers.attention.triton_backend:TritonAttnBackend._set_kv_buffer"),
    VERIFY_GQA: ("NotImplementedError",
                 "sglang.srt.layers.attention.triton_backend:TritonAttnBackend._forward_extend_dcp"),
}
POISON = 'raise ImportError("POISON: a reproducer must not import pytest or pytest_mla")\n'
#: An MLA_REPRO_PATCH planting a fault in SGLang: its attention layers built with a 5% larger softmax scale.
SCALE_FAULT = ("from sglang.srt.layers.radix_attention import RadixAttention\n"
               "_init = RadixAttention.__init__\n"
               "def __init__(self, num_heads, head_dim, scaling, *args, **kwargs):\n"
               "    _init(self, num_heads, head_dim, scaling * 1.05, *args, **kwargs)\n"
               "RadixAttention.__init__ = __init__\n")


@pytest.fixture(scope="module")
def sglang_python():
    return venv_python(".venv-sglang")


@pytest.fixture(scope="module")
def result(sglang_python, tmp_path_factory):
    """A fresh result file of the slice, written by this checkout's plugin in SGLang's venv."""
    out = tmp_path_factory.mktemp("slice")
    run = run_matrix(sglang_python, MATRIX, out, "--mla-kernel=auto", "--mla-report-name=slice", "-p", "no:xdist",
                     "--mla-select", "backend=triton", "--mla-select", "dcp=4", "--mla-select", "arch=sm90",
                     "--mla-select", "kv_dtype=auto", "--mla-select", "spec=none,eagle-1x3",
                     "--mla-select", "model=deepseek-v3,deepseek-v2-lite,llama-3.1-8b", timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    path = out / "slice.json"
    cells = {c["id"]: c for c in read_results(path)["cells"]}
    assert len(cells) == 6
    return path


@pytest.fixture(scope="module")
def poison(tmp_path_factory):
    folder = tmp_path_factory.mktemp("poison")
    (folder / "pytest_mla").mkdir()
    (folder / "_pytest").mkdir()
    for path in (folder / "pytest_mla" / "__init__.py", folder / "pytest.py", folder / "_pytest" / "__init__.py"):
        path.write_text(POISON)
    return folder


def generate(result: Path, cell: str, out: Path, *extra: str) -> Path:
    assert main(["repro", str(result), cell, "-o", str(out), *extra]) == 0
    return out


def run_script(python: Path, script: Path, poison: Path, **env: str) -> tuple[int, str, dict]:
    """The script as a user runs it in the engine's venv, with pytest and pytest_mla unimportable."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST", "MLA_"))}
    clean.update(PYTHONPATH=os.fspath(poison), **env)
    proc = subprocess.run([os.fspath(python), os.fspath(script)], cwd=script.parent, env=clean, capture_output=True,
                          text=True, timeout=600)
    assert "POISON" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    last = [line for line in proc.stdout.splitlines() if line.startswith("PYTEST_MLA_REPRO ")]
    assert last, (proc.stdout + proc.stderr)[-3000:]
    return proc.returncode, proc.stdout + proc.stderr, json.loads(last[-1].split(" ", 1)[1])


def with_dcp(script: Path, dcp: int) -> Path:
    """The same configuration on one DCP rank: the path the matrix verifies (the fault-free path)."""
    text = script.read_text()
    assert "\nDCP = 4\n" in text and "\nTP = 4\n" in text
    out = script.with_name(script.stem + f"_dcp{dcp}.py")
    out.write_text(text.replace("\nDCP = 4\n", f"\nDCP = {dcp}\n").replace("\nTP = 4\n", f"\nTP = {dcp}\n"))
    return out


def test_the_poison_works(sglang_python, poison):
    for module in ("pytest_mla", "pytest"):
        proc = subprocess.run([os.fspath(sglang_python), "-c", f"import {module}"], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.fspath(poison)}, cwd=poison, timeout=60)
        assert proc.returncode != 0 and "POISON" in proc.stderr


@pytest.mark.parametrize("cell", list(FINDINGS))
def test_each_finding_reproduces_with_the_engines_own_exception(cell, result, sglang_python, poison, tmp_path):
    record = next(c for c in read_results(result)["cells"] if c["id"] == cell)
    error, function = FINDINGS[cell]
    assert (record["kernel"]["raised"], record["kernel"]["function"]) == (error, function)  # the matrix run saw it
    script = generate(result, cell, tmp_path / "repro.py")
    code, output, outcome = run_script(sglang_python, script, poison)
    assert code == 1, output[-3000:]
    assert f"REPRODUCED: SGLang 0.5.23 raised {error} in {function} (line " in output
    assert outcome["status"] == "reproduced" and outcome["same"] is True
    assert (outcome["error"], outcome["version"]) == (error, "0.5.23")
    assert outcome["message"] == record["kernel"]["raised_text"]
    assert outcome["frames"][-1].startswith(function + " (line ")
    assert f"Traceback (most recent call last)" in output and f"\n{error}: " in output


@pytest.mark.parametrize("cell", [DECODE_LITE, VERIFY_GQA])
def test_on_the_fault_free_path_the_script_computes_and_matches_the_reference(cell, result, sglang_python, poison,
                                                                              tmp_path):
    """DCP 1 of the same configuration is what the matrix verifies: SGLang computes it, the script compares
    it with its float64 reference and exits 0 (what it does once the bug is fixed)."""
    script = with_dcp(generate(result, cell, tmp_path / "repro.py"), 1)
    code, output, outcome = run_script(sglang_python, script, poison)
    assert code == 0, output[-3000:]
    assert outcome["status"] == "fixed" and "FIXED: SGLang 0.5.23 computed this cell's attention within " \
                                            "tolerance of the float64 reference" in output
    assert re.search(r"0 of \d+ elements out of tolerance", outcome["message"]), outcome


def test_a_fault_planted_in_sglang_is_a_mismatch(result, sglang_python, poison, tmp_path):
    """The script's numbers can fail: SGLang's attention layer built with a 5% larger softmax scale."""
    patch = tmp_path / "scale_fault.py"
    patch.write_text(SCALE_FAULT)
    script = with_dcp(generate(result, DECODE_LITE, tmp_path / "repro.py"), 1)
    code, output, outcome = run_script(sglang_python, script, poison, MLA_REPRO_PATCH=os.fspath(patch))
    assert code == 1, output[-3000:]
    assert outcome["status"] == "reproduced" and outcome["error"] == "mismatch"
    assert "computed attention out of tolerance of the float64 reference" in output
    assert not re.search(r" 0 of \d+ elements out of tolerance", outcome["message"]), outcome


def test_a_cell_of_the_slice_that_passed_is_not_a_finding(result, capsys):
    assert main(["repro", str(result), "llama-3.1-8b-triton-dcp4-none-sm90-kv-auto"]) == 1
    assert "is not a finding: it passed: the engine accepted it and its kernel was verified" in \
        capsys.readouterr().err


def test_engines_runs_it_in_each_release_and_the_report_says_where_it_reproduces(result, tmp_path):
    venvs = [ROOT / ".venv-sglang", ROOT / ".venv-sglang-0.5.22"]
    for venv in venvs:
        venv_python(venv.name)
    report = tmp_path / "bug.md"
    generate(result, DECODE_V3, tmp_path / "repro.py", "--report", str(report),
             "--engines", *map(os.fspath, venvs))
    md = report.read_text()
    assert md.startswith("# [Bug] --attention-backend triton + --dcp-size 4 on MLA models (DeepSeek-V3, "
                         "DeepSeek-V2-Lite): decode raises AssertionError in MLATokenToKVPool.set_kv_buffer\n")
    rows = [line for line in md.splitlines() if line.startswith("| 0.5.2")]
    assert rows[0] == "| 0.5.23 | yes | the matrix run that found it (2 cells) |"
    assert rows[1].startswith(f"| 0.5.23 | yes (AssertionError) | the reproducer in `{venvs[0]}`, exit 1, ")
    assert rows[2].startswith(f"| 0.5.22 | yes (AssertionError) | the reproducer in `{venvs[1]}`, exit 1, ")
    assert "line numbers of the reproducer's run on SGLang 0.5.23" in md
    assert "`sglang.srt.layers.attention.triton_backend:TritonAttnBackend.forward_decode (line " in md
    assert "## Related upstream reports\n\n- <https://github.com/sgl-project/sglang/pull/30444>" in md


def test_the_reports_serve_flags_are_flags_sglang_parses_into_the_cells_configuration(result, sglang_python,
                                                                                      tmp_path):
    """`sglang serve` takes the report's flags (placeholders aside) and resolves them to the cell's setting."""
    for cell, expect in ((DECODE_V3, {"attention_backend": "triton", "dcp_size": 4, "tp_size": 4}),
                         (VERIFY_GQA, {"attention_backend": "triton", "dcp_size": 4, "speculative_eagle_topk": 1,
                                       "speculative_num_steps": 3, "speculative_num_draft_tokens": 4})):
        report = tmp_path / "bug.md"
        generate(result, cell, tmp_path / "repro.py", "--report", str(report))
        command = report.read_text().split("```sh\n", 1)[1].split("\n```", 1)[0]
        argv = __import__("shlex").split(command)
        assert argv[:2] == ["sglang", "serve"]
        model = ROOT / "pytest_mla" / "engines" / "model_configs" / record_model(result, cell)
        argv = [os.fspath(model) if a.startswith(("deepseek-ai/", "meta-llama/", "<")) else a for a in argv[2:]]
        code = ("import sys, json\n"
                "sys.path.insert(0, %r)\n"
                "from pytest_mla.engines.common.import_stubs import install_stubs\n"
                "install_stubs(['torchvision', 'setproctitle'], {'torchvision': {'__version__': '0.28.0'}})\n"
                "from sglang.srt.server_args import prepare_server_args\n"
                "args = prepare_server_args(%r + ['--device', 'cpu'])\n"
                "args.resolve_once()\n"
                "print(json.dumps({k: getattr(args, k) for k in %r}))\n") % (os.fspath(ROOT), argv, list(expect))
        proc = subprocess.run([os.fspath(sglang_python), "-c", code], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TRITON_INTERPRET": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1]) == expect


def record_model(result: Path, cell: str) -> str:
    return next(c for c in read_results(result)["cells"] if c["id"] == cell)["coords"]["model"]


# ---- findings at level "emulated": CUDA backends' own code around the inlined float64 emulations --------

COMMITTED = ROOT / "reports" / "sglang-0.5.23.json"
#: One finding of each kind the committed report found at level emulated (and torch_native's, which runs
#: as it is): SGLang's own exception, an emulation's contract check SGLang's call breaks, a numeric mismatch.
#: (flashinfer's llama DCP 4 finding is torch_native's: the same IndexError in the same write, before any kernel.)
EMULATED_FINDINGS = {
    "deepseek-v3/flashinfer/dcp4/eagle-1x3/sm80/kv-auto":
        ("ValueError", "sglang.srt.layers.attention.flashinfer_mla_backend:FlashInferMLAAttnBackend.forward_extend"),
    "deepseek-v3/fa3/dcp4/none/sm90/kv-auto":
        ("OutOfRangeRead", "sglang.kernels.ops.attention.flash_attention_v3:_call_fa3_kernel"),
    "deepseek-v3/flashmla/dcp1/none/sm80/kv-fp8_e5m2":
        ("RuntimeError", "sglang.kernels.ops.attention.flash_mla_interface:flash_mla_with_kvcache"),
    "deepseek-v3/flashmla/dcp4/none/sm80/kv-auto":
        ("AssertionError", "sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.set_kv_buffer"),
    "deepseek-v3/trtllm_mla/dcp1/none/sm100/kv-fp8_e4m3":
        ("mismatch", "sglang.srt.layers.attention.trtllm_mla_backend:TRTLLMMLABackend.forward_decode"),
    "llama-3.1-8b/flashmla/dcp1/none/sm80/kv-auto":
        ("AttributeError",
         "sglang.srt.layers.attention.flashinfer_mla_backend:FlashInferMLAIndicesUpdaterPrefill.__init__"),
    "llama-3.1-8b/torch_native/dcp4/none/sm80/kv-auto": ("IndexError", "sglang.srt.mem_cache.memory_pool:_set_kv_buffer_impl"),
}


@pytest.mark.parametrize("cell", list(EMULATED_FINDINGS))
def test_each_emulated_finding_reproduces_standalone(cell, sglang_python, poison, tmp_path):
    record = next(c for c in read_results(COMMITTED)["cells"] if c["id"] == cell)
    error, function = EMULATED_FINDINGS[cell]
    kernel = record["kernel"]
    assert kernel.get("raised", "mismatch") == error and kernel["function"] == function  # what the matrix saw
    script = generate(COMMITTED, cell, tmp_path / "repro.py")
    code, output, outcome = run_script(sglang_python, script, poison)
    assert code == 1, output[-3000:]
    assert outcome["status"] == "reproduced" and outcome["error"] == error and outcome["same"] is True, outcome
    if error == "mismatch":
        # an fp8 cache with k_scale != 1: the script writes the cached rows both ways SGLang's write paths do
        assert output.count("OUT OF tolerance") == 2 and "within tolerance" not in output, output[-3000:]
    else:
        assert outcome["frames"][-1].startswith(function + " (line ")
        assert re.search(rf"\n([\w.]+\.)?{error}: ", output), output[-3000:]  # the traceback's last line


def test_on_the_fault_free_path_an_emulated_script_matches_the_reference(sglang_python, poison, tmp_path):
    """flashmla on one DCP rank is verified at level emulated: the script computes it through the inlined
    emulations and exits 0 (what it does once the DCP write is fixed); SGLang's layer built with a 5% larger
    softmax scale makes the same script exit 1 with the mismatch."""
    script = with_dcp(generate(COMMITTED, "deepseek-v3/flashmla/dcp4/none/sm80/kv-auto", tmp_path / "repro.py"), 1)
    code, output, outcome = run_script(sglang_python, script, poison)
    assert code == 0, output[-3000:]
    assert outcome["status"] == "fixed" and re.search(r" 0 of \d+ elements out of tolerance", outcome["message"])
    assert "emulated: flash_mla:get_mla_decoding_metadata" in outcome["message"]  # the emulations ran
    patch = tmp_path / "scale_fault.py"
    patch.write_text(SCALE_FAULT)
    code, output, outcome = run_script(sglang_python, script, poison, MLA_REPRO_PATCH=os.fspath(patch))
    assert code == 1 and outcome["error"] == "mismatch", output[-3000:]


def test_a_failure_of_the_script_itself_is_exit_2_never_a_reproduction(sglang_python, poison, tmp_path):
    """Anything raised outside SGLang's build and step (here: the test hook itself) is 'cannot-build'."""
    patch = tmp_path / "broken.py"
    patch.write_text("raise RuntimeError('the script broke, not SGLang')\n")
    script = generate(COMMITTED, "deepseek-v3/flashmla/dcp4/none/sm80/kv-auto", tmp_path / "repro.py")
    code, output, outcome = run_script(sglang_python, script, poison, MLA_REPRO_PATCH=os.fspath(patch))
    assert code == 2, output[-3000:]
    assert outcome["status"] == "cannot-build" and "RuntimeError: the script broke, not SGLang" in outcome["message"]
