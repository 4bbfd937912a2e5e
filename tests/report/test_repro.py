"""``pytest-mla repro`` without an engine: which cells it takes, what it writes, and bad input.

The generated scripts are run against the real engine in tests/engines/test_repro_sglang.py.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_mla.cli import main
from pytest_mla.report.results import read_results

from .helpers import find

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "reports" / "sglang-0.5.23.json"
DECODE = "deepseek-v3/triton/dcp4/none/sm80/kv-auto"
GQA = "llama-3.1-8b/triton/dcp4/eagle-1x3/sm90/kv-auto"


@pytest.fixture(scope="module")
def document():
    return read_results(COMMITTED)


def repro(capsys, *args):
    code = main(["repro", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_script_imports_neither_pytest_nor_pytest_mla_and_names_the_cell(tmp_path, capsys):
    out = tmp_path / "repro.py"
    code, _, err = repro(capsys, COMMITTED, DECODE, "-o", out)
    assert code == 0, err
    assert f"{DECODE} is finding F1 (decode raises AssertionError in MLATokenToKVPool.set_kv_buffer" in err
    text = out.read_text()
    tree = ast.parse(text)  # valid Python
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"pytest", "_pytest", "pytest_mla"}, imported
    assert imported <= {"contextlib", "dataclasses", "importlib", "inspect", "json", "logging", "math", "os", "sys",
                        "tempfile", "threading", "time", "traceback", "types", "warnings", "linecache", "torch", "numpy",
                        "triton", "sglang", "runpy"}, imported
    assert out.stat().st_mode & 0o100  # executable
    docstring = ast.get_docstring(tree)
    assert docstring.startswith("Reproducer: SGLang 0.5.23: decode raises AssertionError in "
                                "MLATokenToKVPool.set_kv_buffer")
    assert "    sglang serve --model-path deepseek-ai/DeepSeek-V3 --attention-backend triton --tp-size 4 " \
           "--dcp-size 4" in docstring
    assert "meets it at start-up: by default SGLang captures CUDA graphs of decode batches" in docstring
    constants = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id.isupper()
                 and not isinstance(n.value, ast.Tuple)}
    assert constants["CELL"] == DECODE and constants["ATTENTION_BACKEND"] == "triton"
    assert (constants["DCP"], constants["TP"], constants["SPECULATIVE"], constants["MLA"]) == (4, 4, None, True)
    assert constants["MODEL_CONFIG"] == json.loads(
        (ROOT / "pytest_mla/engines/model_configs/deepseek-v3/config.json").read_text())
    assert constants["EXPECTED"] == {"error": "AssertionError",
                                     "function": "sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.set_kv_buffer"}


def test_the_numbers_the_script_mirrors_are_the_checks_own():
    """NUM_KV_SPLITS, the tolerances for SGLang's Triton kernels and the softmax scale are written into the
    script (it cannot import them): they must be the kernel check's."""
    pytest.importorskip("torch")
    from pytest_mla.core.models import BUILTIN_MODELS
    from pytest_mla.engines.sglang import checks
    from pytest_mla.engines.sglang.backends import BACKENDS
    from pytest_mla.kernels.compare import tolerance_for
    from pytest_mla.report.repro import sglang

    assert sglang.NUM_KV_SPLITS == checks.NUM_KV_SPLITS
    assert {BACKENDS[name].cpu_check for name in sglang.DECODE_BACKENDS.values()} <= {"interpreted", "native"}
    assert {BACKENDS[name].cpu_check for name in sglang.EMULATED_BACKENDS.values()} == {"emulated"}
    for kv, tol in sglang.TOLERANCES.items():
        want = tolerance_for("bf16", kv, fp8_dots=True).out  # Triton's kernels round q and P to an fp8 cache
        assert tol == {"abs": want.abs, "rel": want.rel, "cos": want.cos}, kv
        other = tolerance_for("bf16", kv, fp8_dots=False).out  # the other backends: the bf16 table
        assert sglang.TOLERANCES["auto"] == {"abs": other.abs, "rel": other.rel, "cos": other.cos}, kv
    assert BUILTIN_MODELS["deepseek-v3"].softmax_scale == pytest.approx(0.1352337788608801)


def test_what_an_emulated_script_states_is_the_adapters_emulation_scope():
    """The GPU an emulated cell's script states to SGLang and the libraries it replaces are written into the
    script: they must be what engines/sglang/emulation states and replaces."""
    from pytest_mla.engines.sglang import platforms, support
    from pytest_mla.engines.sglang.backends import BACKENDS
    from pytest_mla.report.repro import sglang

    assert sglang.EMULATED_LIBRARIES == support.EMULATED_LIBRARIES
    assert sglang.CUDA_TOOLKIT == support.CUDA_TOOLKIT
    for arch in ("sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121"):
        want = {k: (list(v) if isinstance(v, tuple) else v) for k, v in platforms.platform_facts(arch).items()}
        assert sglang.cuda_platform_facts(arch) == want, arch
    with pytest.raises(ValueError, match="not a CUDA arch: 'gfx942'"):
        sglang.cuda_platform_facts("gfx942")
    for cls, name in sglang.EMULATED_BACKENDS.items():
        assert BACKENDS[name].cpu_check == "emulated"
        module = sglang.BACKEND_MODULES[cls]
        assert module == BACKENDS[name].module or (cls, module) == (
            "FlashInferAttnBackend", "sglang.srt.layers.attention.flashinfer_backend"), cls  # GQA's own module


def test_the_bug_report_names_flags_phase_frames_releases_and_links(tmp_path, capsys):
    report = tmp_path / "bug.md"
    code, out, err = repro(capsys, COMMITTED, GQA.replace("/", "-"), "--report", report)  # the pytest name
    assert code == 0, err
    assert out.startswith("#!/usr/bin/env python3")  # the script on stdout when -o is not given
    md = report.read_text()
    assert md.startswith("# [Bug] --attention-backend triton + --dcp-size 4 + speculative decoding (EAGLE) on GQA "
                         "models (Llama-3.1-8B-Instruct): verify raises NotImplementedError in "
                         "TritonAttnBackend._forward_extend_dcp\n")
    assert ("sglang serve --model-path meta-llama/Llama-3.1-8B-Instruct --attention-backend triton --tp-size 4 "
            "--dcp-size 4 --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4 --speculative-draft-model-path "
            "'<an EAGLE draft model for meta-llama/Llama-3.1-8B-Instruct>'") in md
    assert "## When a server meets it\n\nAt start-up: by default SGLang captures CUDA graphs of target-verify " \
           "batches (speculative decoding)" in md
    assert "with --disable-cuda-graph it starts and dies at its first verify step" in md
    assert "- sglang/srt/arg_groups/cuda_graph_hook.py: disable_breakable_cudagraph_if_incompatible" in md
    assert "```\nNotImplementedError: DCP Triton extend does not support custom masks\n```" in md
    assert "## Expected" in md and "## Releases" in md
    assert "The matrix describes SGLang `<0.5.24,>=0.5.20`." in md
    # the same verify raises on ROCm and the CPU platform too (their checks run since issue 25's platform checks;
    # ROCm's fp8 cells since their pools take the arch's own fp8 type)
    assert "| 0.5.23 | yes | the matrix run that found it (44 cells) |" in md
    assert ("backend triton with arch sm80, sm90, sm100, gfx942, gfx950, cpu, cpu_amx · kv_dtype auto, fp8_e4m3, "
            "fp8_e5m2; backend fa3 with arch sm80, sm90, sm100 · kv_dtype fp8_e5m2") in md
    assert "- **GPU**: any of those the matrix covered: sm80, sm90, sm100, gfx942, gfx950, cpu, cpu_amx" in md
    assert "`repro.py`, standalone (torch and SGLang only; no pytest, no pytest-mla)" in md


def test_links_of_the_matrix_reach_the_report(tmp_path, capsys, document):
    doc = json.loads(json.dumps(document))
    for cell in doc["cells"]:
        if (cell.get("kernel") or {}).get("finding") and cell["coords"]["model"] == "llama-3.1-8b":
            cell["expectation"]["links"] = ["https://github.com/sgl-project/sglang/pull/25090"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    report = tmp_path / "bug.md"
    assert repro(capsys, path, GQA, "-o", tmp_path / "r.py", "--report", report)[0] == 0
    assert "## Related upstream reports\n\n- <https://github.com/sgl-project/sglang/pull/25090>\n" in report.read_text()


def test_a_cell_that_is_not_a_finding_says_so_in_one_line(capsys):
    code, out, err = repro(capsys, COMMITTED, "deepseek-v3/triton/dcp1/none/sm90/kv-auto")
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        "pytest-mla repro: cell deepseek-v3/triton/dcp1/none/sm90/kv-auto is not a finding: it passed: the engine "
        "accepted it and its kernel was verified (pass)"]
    code, _, err = repro(capsys, COMMITTED, "deepseek-v3/trtllm_mla/dcp1/none/sm90/kv-auto")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "not a finding: the engine refused it, as the matrix says (ValueError: TRTLLM MLA backend is only " \
           "supported on Blackwell GPUs" in err
    code, _, err = repro(capsys, COMMITTED, "deepseek-v3/trtllm_mla/dcp4/none/sm100/kv-auto")  # kernel not run
    assert code == 1 and "not a finding: it passed validation but its kernel did not run here" in err


def test_an_unknown_id_names_the_nearest_ids_of_the_result_file(capsys):
    code, _, err = repro(capsys, COMMITTED, "deepseek-v3/triton/dcp4/none/sm95/kv-auto")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"pytest-mla: error: {COMMITTED}: no cell 'deepseek-v3/triton/dcp4/none/sm95/kv-auto' "
                          "in the result file (58320 cells); nearest: deepseek-v3/triton/dcp4/none/sm")
    code, _, err = repro(capsys, COMMITTED, "deepseek-v3-triton-dcp4-none-sm95-kv-auto")
    assert code == 2 and "nearest: deepseek-v3/triton/dcp4/none/sm" in err
    code, _, err = repro(capsys, COMMITTED, "nothing-like-it")
    assert code == 2 and "no cell 'nothing-like-it' in the result file (58320 cells)" in err


def test_bad_files_and_options_are_one_line(tmp_path, capsys):
    code, _, err = repro(capsys, tmp_path / "missing.json", DECODE)
    assert code == 2 and "missing.json" in err and len(err.strip().splitlines()) == 1
    code, _, err = repro(capsys, COMMITTED, DECODE, "-o", tmp_path / "r.py", "--engines", tmp_path / "no-venv")
    assert code == 2 and "--engines" in err and "no-venv: neither a virtual environment folder nor a Python " \
                                                   "executable" in err
    assert not (tmp_path / "r.py").exists()  # nothing written before the options are known to be good
    code, _, err = repro(capsys, COMMITTED, DECODE, "-o", tmp_path / "r.py", "--engines", tmp_path)
    assert code == 2 and "a folder without bin/python" in err


def test_a_finding_no_template_takes_gets_a_report_that_says_the_kernel_did_not_run(tmp_path, capsys, document):
    """An emulated-level finding of a backend no template runs (cutlass_mla: SGLang's checks do not emulate it)."""
    doc = json.loads(json.dumps(document))
    cell = find(doc, "deepseek-v3/flashmla/dcp4/none/sm90/kv-auto")
    cell["verdict"], cell["reason"] = "fail", "engine accepted this configuration, but its backend raised ..."
    cell["kernel"] = {"status": "failed", "where": "interpreter", "level": "emulated", "finding": True,
                      "function": "sglang.srt.layers.attention.flashmla_backend:FlashMLABackend.forward_decode",
                      "raised": "RuntimeError", "raised_text": "page table is not rank-local",
                      "emulated": ["sgl_kernel.flash_mla:flash_mla_with_kvcache"],
                      "case": find(doc, DECODE)["kernel"]["case"],
                      "message": "engine accepted this configuration, but its backend raised RuntimeError: "
                                 "page table is not rank-local in sglang.srt.layers.attention.flashmla_backend:"
                                 "FlashMLABackend.forward_decode"}
    cell["outcome"]["backends"] = {"decode": "CutlassMLABackend"}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    report = tmp_path / "bug.md"
    code, out, err = repro(capsys, path, cell["id"], "--report", report)
    assert code == 0 and out == ""
    assert "wrote the bug report" in err and "without a reproducer" in err
    md = report.read_text()
    assert "- **the kernel itself did not run**: the check ran SGLang's backend code with its kernel library's " \
           "calls replaced by float64 emulations of their contract (`sgl_kernel.flash_mla:flash_mla_with_kvcache`)" \
           in md
    assert "No standalone reproducer yet: sglang backend: the decode backend CutlassMLABackend at level " \
           "'emulated' has no reproducer (this template runs TritonAttnBackend, TorchNativeAttnBackend as they are " \
           "and FlashInferMLAAttnBackend, " in md
    code, _, err = repro(capsys, path, cell["id"], "-o", tmp_path / "r.py")
    assert code == 2 and "no reproducer template takes this finding" in err and not (tmp_path / "r.py").exists()


def test_repro_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["repro", "--help"])
    out = capsys.readouterr().out
    assert "--engines VENV" in out and "--report FILE.md" in out and "exit 1 while the bug exists" in out


def test_the_cli_module_stays_light(tmp_path):
    """repro lives in report/ and imports neither torch nor an engine (the CLI runs anywhere)."""
    # A file of its own: -o /dev/null is refused (not a regular file), and pytest-mla before issue 44
    # replaced /dev/null with a plain file (and made it executable) when run as root.
    script = tmp_path / "repro.py"
    code = ("import sys; from pytest_mla.cli import main; "
            f"assert main(['repro', {str(COMMITTED)!r}, {DECODE!r}, '-o', {str(script)!r}]) == 0; "
            "print(sorted(m for m in ('torch', 'triton', 'sglang', 'pytest_mla.engines', 'pytest_mla.kernels') "
            "if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"
    assert script.read_text(encoding="utf-8").startswith("#!")


def test_engines_runs_scripts_in_each_environment_relative_paths_included(tmp_path, monkeypatch, capsys):
    """runs.py on stand-in environments: a venv folder (bin/python) and an executable, given relative to
    the working folder; the outcome line is parsed, a script that prints none is 'could not run'."""
    from pytest_mla.report.repro.runs import run_all

    venv = tmp_path / "venv-a" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    script = tmp_path / "repro.py"
    script.write_text("import json, os, sys\n"
                      "assert not any('pytest_mla' in p for p in sys.path if p), sys.path\n"
                      "print('PYTEST_MLA_REPRO ' + json.dumps({'status': 'reproduced', 'engine': 'sglang', "
                      "'version': '9.9', 'error': 'AssertionError', 'same': True, 'frames': ['a:b (line 1)']}))\n"
                      "sys.exit(1)\n")
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('no engine here')\n")
    monkeypatch.chdir(tmp_path)
    first, second = run_all(script.name, ["venv-a", "venv-a/bin/python"], timeout_s=60)
    assert (first.status, first.exit_code, first.version, first.error, first.frames) == (
        "reproduced", 1, "9.9", "AssertionError", ("a:b (line 1)",))
    assert first.summary().startswith("SGLang 9.9 (venv-a): reproduced, AssertionError, exit 1, ")
    assert second.environment == "venv-a/bin/python" and second.status == "reproduced"
    (failed,) = run_all(broken.name, ["venv-a"], timeout_s=60)
    assert (failed.status, failed.exit_code, failed.message) == ("could not run", 1, "no engine here")
    err = capsys.readouterr().err
    assert "pytest-mla repro: SGLang 9.9 (venv-a): reproduced" in err and "could not run: no engine here" in err


def test_engines_auto_finds_the_conformance_venvs_of_the_results_engine(tmp_path, monkeypatch, capsys):
    from pytest_mla.report.repro.runs import discover

    for name in (".venv-sglang", ".venv-sglang-0.5.22", ".venv-sglangx", ".venv-vllm", ".venv-sglang-empty"):
        (tmp_path / name).mkdir()
        if name != ".venv-sglang-empty":
            (tmp_path / name / "bin").mkdir()
            (tmp_path / name / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    assert discover("sglang") == [".venv-sglang", ".venv-sglang-0.5.22"]
    assert discover("sglang", tmp_path) == [str(tmp_path / ".venv-sglang"), str(tmp_path / ".venv-sglang-0.5.22")]
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    monkeypatch.chdir(empty)
    code, _, err = repro(capsys, COMMITTED, DECODE, "-o", empty / "r.py", "--engines", "auto")
    assert code == 2 and "--engines auto: no .venv-sglang or .venv-sglang-VERSION folder with bin/python here" in err


def test_an_emulated_finding_inlines_the_emulations_and_imports_no_pytest_mla(tmp_path, capsys):
    """A CUDA backend's finding at level emulated: the script carries the emulations it ran with, verbatim, as
    modules of its own package, states the cell's GPU, and neither it nor an inlined module imports pytest_mla."""
    cell = "deepseek-v3/flashmla/dcp1/none/sm80/kv-fp8_e4m3"
    code, _, err = repro(capsys, COMMITTED, cell, "-o", tmp_path / "r.py")
    assert code == 0, err
    text = (tmp_path / "r.py").read_text()
    namespace: dict = {}
    tree = ast.parse(text)
    for node in tree.body:  # the constants and the inlined sources, without running the script
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in (
                "EMULATE", "KV_SCALE", "KV_CONVENTIONS", "INLINED_PACKAGE", "INLINED_MODULES"):
            exec(compile(ast.Module([node], []), "r.py", "exec"), namespace)
        elif (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
              and getattr(node.targets[0].value, "id", "") == "INLINED_MODULES"):
            exec(compile(ast.Module([node], []), "r.py", "exec"), namespace)
    emulate = namespace["EMULATE"]
    assert emulate["arch"] == "sm80" and emulate["platform"]["device_capability"] == [8, 0]
    assert emulate["backend_module"] == "sglang.srt.layers.attention.flashmla_backend"
    assert namespace["KV_SCALE"] == find(read_results(COMMITTED), cell)["kernel"]["kv_scale"] != 1.0
    assert namespace["KV_CONVENTIONS"] == ["scaled", "raw"]
    modules = namespace["INLINED_MODULES"]
    package = namespace["INLINED_PACKAGE"]
    assert "pytest_mla" not in package
    assert {f"{package}.flashmla", f"{package}.glue", f"{package}.install", f"{package}.cpu_host"} <= set(modules)
    emulated = ROOT / "pytest_mla" / "kernels" / "emulated"
    assert modules[f"{package}.flashmla"] == (emulated / "flashmla.py").read_text()  # verbatim
    for source in [text, *modules.values()]:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not (node.module or "").startswith(("pytest_mla", "pytest", "_pytest")), node.module
            elif isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] in ("pytest_mla", "pytest", "_pytest") for a in node.names)
