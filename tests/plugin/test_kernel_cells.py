"""Accepted cells of the built-in triton backend run the Triton kernel (interpreter here)."""

import types

import pytest

from pytest_mla.runner import KERNEL_CACHE_INPUT, MatrixRun
from pytest_mla.options import Settings
from pytest_mla.report.results import read_results

from .helpers import matrix, read_report, run_facts

pytest_plugins = ["pytester"]

TINY = """
[models.tiny-mla]
mla = true
num_heads = 4
kv_lora_rank = 64
qk_rope_head_dim = 16
qk_nope_head_dim = 32
v_head_dim = 32
"""


def _tiny_matrix(engine="reference", **kw):
    text = matrix(["triton", "flashmla"], engine=engine, extra=TINY, **kw)
    return text.replace('model = ["deepseek-v3"]', 'model = ["tiny-mla"]').replace(
        "dcp = [1]", "dcp = [1, 2]").replace('spec = ["none"]', 'spec = ["none", "eagle-2x2"]')


def test_accepted_triton_cells_are_verified_once_per_numeric_config(pytester):
    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90", "sm100"), rules="""
        [[rule]]
        when = { backend = "flashmla", "spec.topk" = ">1" }
        reject = { error = "ValueError", message = "Currently FlashMLA only supports topk=1 for speculative decoding" }
    """))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    result.assert_outcomes(passed=16)
    result.stdout.fnmatch_lines(["kernels: 8 verified on a kernel (4 reused), 0 with emulated kernels, 0 failed, "
                                 "4 not run",
                                 "  worst of the verified: out max abs *e-*, outside abs-or-rel 0%, cos diff *e-*; "
                                 "lse max abs *e-*; kernel time * s"])
    cells = {c["id"]: c for c in read_report(pytester)["cells"]}
    first = cells["tiny-mla/triton/dcp2/eagle-2x2/sm90"]["kernel"]
    again = cells["tiny-mla/triton/dcp2/eagle-2x2/sm100"]["kernel"]
    assert first["status"] == "verified" and first["where"] == "interpreter"
    assert again["errors"] == first["errors"] and again["seed"] == first["seed"]
    facts = run_facts(pytester)  # which cell computed and which reused is a fact of this run only
    assert facts["tiny-mla/triton/dcp2/eagle-2x2/sm90"]["kernel"]["reused"] is False
    assert facts["tiny-mla/triton/dcp2/eagle-2x2/sm100"]["kernel"]["reused"] is True
    assert "reused" not in again and "time_s" not in again
    assert first["case"]["dcp"] == 2 and first["case"]["s_q"] == 5 and first["case"]["h_q"] == 4
    assert first["errors"]["out"]["max_abs_err"] <= first["tolerance"]["out"]["abs"] or \
        first["errors"]["out"]["max_rel_err"] <= first["tolerance"]["out"]["rel"]
    flashmla = cells["tiny-mla/flashmla/dcp1/none/sm90"]["kernel"]
    assert flashmla["status"] == "not-run" and "flash_mla" in flashmla["reason"]


def test_a_kernel_out_of_tolerance_fails_its_cell(pytester):
    # A kernel provided by a conftest through pytest_mla_kernel: the Triton kernel, then a planted error.
    pytester.makepyfile(badkernel='''
from pytest_mla.kernels.triton_mla import mla_decode

def off_by_a_bit(*args, **kwargs):
    out, lse = mla_decode(*args, **kwargs)
    return out + 0.05, lse
''')
    pytester.makeconftest('''
import sys, os
sys.path.insert(0, os.path.dirname(__file__))
from pytest_mla.engines.protocol import KernelSpec

def pytest_mla_kernel(config, cell, spec):
    if spec is not None:
        return KernelSpec("bad", "badkernel:off_by_a_bit")
''')
    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90",)).replace('["triton", "flashmla"]', '["triton"]')
                      .replace("dcp = [1, 2]", "dcp = [1]").replace('["none", "eagle-2x2"]', '["none"]'))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    result.assert_outcomes(failed=1)
    # headed for what went wrong: the engine accepted, as expected; its kernel did not compute
    result.stdout.fnmatch_lines(["tiny-mla/triton/dcp1/none/sm90: kernel out of tolerance",
                                 "  expectation from no rule (default: accept): accept"])
    cell = read_report(pytester)["cells"][0]
    assert cell["verdict"] == "fail" and cell["kernel"]["status"] == "failed"
    assert cell["kernel"]["kernel"] == "bad"
    assert "out" in cell["reason"]


def test_workers_share_kernel_results_through_the_controllers_folder(tmp_path):
    config = types.SimpleNamespace(workerinput={KERNEL_CACHE_INPUT: str(tmp_path)})
    one, two = MatrixRun(config, Settings(()), []), MatrixRun(config, Settings(()), [])
    key = ("case", "mod:fn", "interpreter", "in-process")
    assert two._shared_result(key) is None
    one._share_result(key, {"status": "verified", "errors": {"out": {"max_abs_err": 1e-4}}})
    assert two._shared_result(key) == {"status": "verified", "errors": {"out": {"max_abs_err": 1e-4}}}
    (next(tmp_path.iterdir())).write_text("{trunc")  # a torn file is recomputed, not trusted
    assert two._shared_result(key) is None
    serial = MatrixRun(types.SimpleNamespace(), Settings(()), [])
    serial._share_result(key, {"status": "verified"})
    assert serial._shared_result(key) is None


def test_distributed_dcp_mode_runs_real_ranks_and_agrees(pytester):
    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90",)).replace('["triton", "flashmla"]', '["triton"]')
                      .replace('["none", "eagle-2x2"]', '["eagle-2x2"]').replace("dcp = [1, 2]", "dcp = [2]"))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist", "--mla-dcp-mode=distributed",
                                           "--mla-dcp-timeout=120")
    result.assert_outcomes(passed=1)
    distributed = read_report(pytester)["cells"][0]
    assert distributed["kernel"]["status"] == "verified"
    assert read_report(pytester)["run"]["dcp_mode"] == "distributed"
    pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist").assert_outcomes(passed=1)
    in_process = read_report(pytester)["cells"][0]
    # Same inputs (same seed), same ranks and merge: the same numbers either way, to the four significant
    # digits a record keeps (two values a hair apart may round either side of one digit: one step apart).
    assert distributed["kernel"]["case"] == in_process["kernel"]["case"]
    assert distributed["kernel"]["errors"]["out"]["max_abs_err"] == pytest.approx(
        in_process["kernel"]["errors"]["out"]["max_abs_err"], rel=2e-4, abs=1e-9)


ENGINE_CONFTEST = '''
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
from pytest_mla.engines.protocol import Configured, KernelSpec


class OwnKernelEngine:
    """Accepts every cell and hands back its own runner (fake_engine.py); the backend name picks a fault."""

    name = "own"
    version = "1.0"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        options = {"good": (), "average": (("merge", "average"),), "crashes": (("raise_in", "decode"),)}
        spec = KernelSpec("own", "fake_engine:run", protocol="engine", level="backend", package="fake_engine",
                          function="fake_engine:decode_rank", options=options[cell.backend])
        return Configured({"decode": cell.backend}, kernel=spec)

    def metadata(self):
        return {}


def pytest_mla_engines(config):
    return {"own": OwnKernelEngine}
'''


def test_engine_runner_cells_verified_caught_and_found(pytester):
    """An engine's own path through the plugin: verified; a merge ignoring the LSE fails; a raise is a finding."""
    from pathlib import Path

    pytester.makepyfile(fake_engine=(Path(__file__).parents[1] / "kernels" / "fake_engine.py").read_text())
    pytester.makeconftest(ENGINE_CONFTEST)
    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90", "sm100"), engine="own")
                      .replace('["triton", "flashmla"]', '["good", "average", "crashes"]')
                      .replace('["none", "eagle-2x2"]', '["eagle-1x3"]').replace("dcp = [1, 2]", "dcp = [2]"))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    result.assert_outcomes(passed=2, failed=4)
    cells = {c["id"]: c for c in read_report(pytester)["cells"]}
    good = cells["tiny-mla/good/dcp2/eagle-1x3/sm90"]
    assert good["verdict"] == "pass" and good["kernel"]["status"] == "verified"
    assert good["kernel"]["level"] == "backend" and good["kernel"]["function"] == "fake_engine:decode_rank"
    assert "fake_engine:merge" in good["kernel"]["functions"]
    assert run_facts(pytester)["tiny-mla/good/dcp2/eagle-1x3/sm100"]["kernel"]["reused"]
    average = cells["tiny-mla/average/dcp2/eagle-1x3/sm90"]
    assert average["verdict"] == "fail" and average["kernel"]["status"] == "failed"
    assert "beyond abs" in average["reason"]
    crashes = cells["tiny-mla/crashes/dcp2/eagle-1x3/sm90"]
    assert crashes["verdict"] == "fail" and crashes["kernel"]["status"] == "failed"
    assert crashes["kernel"]["finding"] is True
    assert crashes["reason"] == ("engine accepted this configuration, but its backend raised ValueError: "
                                 "too many values to unpack (expected 2) in fake_engine:decode_rank")
    # what was raised, as plain fields, and where in the engine (outermost frame first)
    assert crashes["kernel"]["raised"] == "ValueError"
    assert crashes["kernel"]["raised_text"] == "too many values to unpack (expected 2)"
    assert [f.split(" (line ")[0] for f in crashes["kernel"]["frames"]] == ["fake_engine:run", "fake_engine:decode_rank"]


def test_a_known_bug_after_acceptance_is_checked_by_the_kernel(pytester):
    """An xfail-only rule on accepted cells: the engine's raise is the xfail, a verified kernel the xpass."""
    from pathlib import Path

    pytester.makepyfile(fake_engine=(Path(__file__).parents[1] / "kernels" / "fake_engine.py").read_text())
    pytester.makeconftest(ENGINE_CONFTEST)
    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90",), engine="own", rules="""
        [[rule]]
        when = { dcp = 2 }
        xfail = "the backend raises under DCP (issue 9)"
    """).replace('["triton", "flashmla"]', '["good", "crashes"]')
                      .replace('["none", "eagle-2x2"]', '["eagle-1x3"]').replace("dcp = [1, 2]", "dcp = [2]"))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    result.assert_outcomes(xpassed=1, xfailed=1)
    cells = {c["id"]: c for c in read_report(pytester)["cells"]}
    assert cells["tiny-mla/good/dcp2/eagle-1x3/sm90"]["verdict"] == "xpass"
    assert cells["tiny-mla/crashes/dcp2/eagle-1x3/sm90"]["verdict"] == "xfail"
    assert cells["tiny-mla/crashes/dcp2/eagle-1x3/sm90"]["kernel"]["finding"] is True


def test_nan_from_an_empty_dcp_rank_fails_its_cell_at_every_dcp_size(pytester):
    # A kernel right wherever a rank holds tokens, NaN where it holds none: the merge used to hide it.
    pytester.makepyfile(emptynan='''
from pytest_mla.kernels.reference import ref_kernel

def nan_when_empty(*args, **kwargs):
    out, lse = ref_kernel(*args, **kwargs)
    empty = args[3] == 0
    out[empty] = float("nan")
    lse[empty] = float("nan")
    return out, lse
''')
    pytester.makeconftest('''
import sys, os
sys.path.insert(0, os.path.dirname(__file__))
from pytest_mla.engines.protocol import KernelSpec

def pytest_mla_kernel(config, cell, spec):
    if spec is not None:
        return KernelSpec("nan-when-empty", "emptynan:nan_when_empty")
''')
    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90",)).replace('["triton", "flashmla"]', '["triton"]')
                      .replace("dcp = [1, 2]", "dcp = [1, 2, 4]").replace('["none", "eagle-2x2"]', '["none"]'))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist")
    result.assert_outcomes(failed=3)
    cells = {c["id"]: c for c in read_report(pytester)["cells"]}
    for dcp in (2, 4):
        kernel = cells[f"tiny-mla/triton/dcp{dcp}/none/sm90"]["kernel"]
        assert kernel["status"] == "failed"
        assert f"of {dcp} returned NaN out and lse for request 2, which has no tokens on that rank" in kernel["message"]


ELSEWHERE_CONFTEST = ENGINE_CONFTEST.replace('''    def metadata(self):
        return {}
''', '''    def metadata(self):
        return {}

    def run_check(self, case, spec, *, where, dcp_mode, timeout_s):
        """Where the engine configured the cell (a platform process, say): here, a record it marks."""
        if spec.options != ():
            return None  # the runner runs it in its own process
        from pytest_mla.kernels.run import run_check

        record = run_check(case, spec, where=where, dcp_mode=dcp_mode, timeout_s=timeout_s)
        return {**record, "notes": [*record.get("notes", []), "run by the engine's run_check"]}
''')


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_an_engine_that_runs_its_own_checks_gets_their_records_and_none_falls_back(pytester, workers):
    """``Engine.run_check`` (optional): its record is the cell's; None lets the runner run the check."""
    from pathlib import Path

    pytester.makepyfile(fake_engine=(Path(__file__).parents[1] / "kernels" / "fake_engine.py").read_text())
    pytester.makeconftest(ELSEWHERE_CONFTEST)
    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90",), engine="own")
                      .replace('["triton", "flashmla"]', '["good", "average"]')
                      .replace('["none", "eagle-2x2"]', '["none"]').replace("dcp = [1, 2]", "dcp = [2]"))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", *(workers or ["-p", "no:xdist"]))
    result.assert_outcomes(passed=1, failed=1)
    cells = {c["id"]: c for c in read_report(pytester)["cells"]}
    good = cells["tiny-mla/good/dcp2/none/sm90"]["kernel"]
    assert good["status"] == "verified" and "run by the engine's run_check" in good["notes"]
    average = cells["tiny-mla/average/dcp2/none/sm90"]["kernel"]
    assert average["status"] == "failed" and "run by the engine's run_check" not in average.get("notes", [])


#: Another CPU's float64 reference: the same values but for their last bits (summation order, FMA).
LAST_BITS_CONFTEST = '''
import torch
import pytest_mla.kernels.reference as reference
import pytest_mla.core.records as records

_exact = reference._ref_paged


def _last_bits(*args, **kwargs):
    out, lse = _exact(*args, **kwargs)
    g = torch.Generator().manual_seed(7)
    ulps = lambda t: 1 + torch.randint(-4, 5, t.shape, generator=g, dtype=torch.float64) * 2.0 ** -52
    return out * ulps(out), lse * ulps(lse)


if {perturb}:
    reference._ref_paged = _last_bits
records.MEASURE_DIGITS = {digits}
'''


def _one_check_report(pytester, folder, *, perturb, digits=4):
    run = pytester.mkdir(folder)
    (run / "conftest.py").write_text(LAST_BITS_CONFTEST.format(perturb=perturb, digits=digits))
    (run / "m.toml").write_text(_tiny_matrix(archs=("sm90",)).replace('["triton", "flashmla"]', '["triton"]')
                                .replace("dcp = [1, 2]", "dcp = [1]").replace('["none", "eagle-2x2"]', '["none"]'))
    result = pytester.runpytest_subprocess(f"--rootdir={run}", f"--mla-matrix={run}/m.toml", "-p", "no:xdist",
                                           f"--mla-report-dir={run}/reports", "--mla-report-format=json")
    result.assert_outcomes(passed=1)
    return (run / "reports" / "m.json").read_bytes()


def test_a_result_file_does_not_change_with_the_last_bits_of_the_reference(pytester):
    """Reports are a function of the matrix, the engine and the code: the float64 reference's last bits,
    which differ between CPUs, reach the raw errors but not the stored (rounded) ones."""
    raw = [_one_check_report(pytester, f"raw{p}", perturb=p, digits=17) for p in (False, True)]
    assert raw[0] != raw[1]  # the perturbation reaches the numbers a record measures
    stored = [_one_check_report(pytester, f"stored{p}", perturb=p) for p in (False, True)]
    assert stored[0] == stored[1]


FLASHMLA_TOPK_RULE = """
    [[rule]]
    when = { backend = "flashmla", "spec.topk" = ">1" }
    reject = { error = "ValueError", message = "Currently FlashMLA only supports topk=1 for speculative decoding" }
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_the_quick_tier_checks_numbers_on_a_named_covering_sample_and_says_so(pytester, workers):
    if workers:
        pytest.importorskip("xdist")
    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90", "sm100"), rules=FLASHMLA_TOPK_RULE))
    result = pytester.runpytest_subprocess("--mla-matrix=m.toml", "--mla-tier=quick", *workers)
    result.assert_outcomes(passed=16)
    result.stdout.fnmatch_lines(["quick tier: numeric checks on a covering sample of * cells *not a full report"])
    doc = read_report(pytester)
    assert doc["run"]["tier"] == "quick"
    sample = doc["run"]["sample"]["cells"]
    cells = {c["id"]: c for c in doc["cells"]}
    triton = [i for i in sample if "/triton/" in i]
    # triton's keys on the dense-MLA family: each arch, spec none and tree, DCP, DCP + spec
    assert {i.split("/")[4] for i in triton} == {"sm90", "sm100"}
    assert {i.split("/")[3] for i in triton} == {"none", "eagle-2x2"}
    assert any(i.split("/")[2] == "dcp2" and i.split("/")[3] != "none" for i in triton)
    assert 2 <= len(triton) <= 3
    for cell_id, cell in cells.items():
        kernel = cell.get("kernel") or {}
        if cell_id in sample:
            assert not str(kernel.get("reason", "")).startswith("quick tier")
            if "/triton/" in cell_id:
                assert kernel["status"] == "verified"
        elif kernel:  # accepted, outside the sample: validated only, and says why
            assert kernel["status"] == "not-run" and kernel["reason"].startswith("quick tier: validated only")
    markdown = (pytester.path / "reports" / "m.md").read_text()
    assert "- **quick tier: numeric checks on a covering sample of" in markdown


def test_the_full_tier_is_the_default_and_names_no_sample(pytester):
    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90",), rules=FLASHMLA_TOPK_RULE))
    pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist").assert_outcomes(passed=8)
    doc = read_report(pytester)
    assert doc["run"]["tier"] == "full" and "sample" not in doc["run"]
    triton = [c["kernel"] for c in doc["cells"] if "/triton/" in c["id"]]
    assert len(triton) == 4 and all(k["status"] == "verified" for k in triton)
    assert "quick tier" not in (pytester.path / "reports" / "m.md").read_text()


def test_a_merge_of_a_quick_and_a_full_run_keeps_each_cells_level(pytester, capsys):
    from pytest_mla.cli import main

    pytester.makefile(".toml", m=_tiny_matrix(archs=("sm90",), rules=FLASHMLA_TOPK_RULE))
    for tier in ("quick", "full"):
        pytester.runpytest_subprocess("--mla-matrix=m.toml", "-p", "no:xdist", f"--mla-tier={tier}",
                                      f"--mla-report-dir={tier}").assert_outcomes(passed=8)
    quick, full = (str(pytester.path / tier / "m.json") for tier in ("quick", "full"))
    merged = str(pytester.path / "merged.json")
    assert main(["merge", quick, full, "-o", merged]) == 2  # two tiers: only when told
    assert "ran different settings (tier 'quick' vs 'full')" in capsys.readouterr().err
    assert main(["merge", quick, full, "-o", merged, "--allow-mixed"]) == 0
    doc, by_tier = read_results(merged), {t: read_results(str(pytester.path / t / "m.json")) for t in ("quick", "full")}
    assert doc["run"]["tier"] == "quick / full" and [m["tier"] for m in doc["run"]["merged_from"]] == ["quick", "full"]
    quick_kernels = {c["id"]: c.get("kernel") for c in by_tier["quick"]["cells"]}
    assert any(k and k["reason"].startswith("quick tier") for k in quick_kernels.values() if k.get("reason"))
    for cell in doc["cells"]:  # cell by cell: the full run's check stands, whatever the quick run said
        full_kernel = next(c.get("kernel") for c in by_tier["full"]["cells"] if c["id"] == cell["id"])
        assert (cell.get("kernel") or {}).get("status") == (full_kernel or {}).get("status")
        if full_kernel and full_kernel["status"] == "verified":
            assert cell["kernel"]["status"] == "verified" and not cell["kernel"].get("reason")
    assert main(["render", merged, "--format", "md"]) == 0
    assert "merged from quick- and full-tier runs" in capsys.readouterr().out
