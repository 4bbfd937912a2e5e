"""A platform child process runs an accepted cell's numeric check: every outcome ends in a precise record.

The child (``engines/common/platform_process.py``) builds an adapter for its
platform and answers ``run_check`` with the kernel record of
``kernels.run.run_check``. Here the adapter is a stand-in and the engine
runners are small modules written per test: one computes the float64
reference (the check verifies), one is off by a scale (the check fails), one
ends the child's process, one never returns. None needs an engine venv.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from pytest_mla.core.deadline import CellTimeout, Deadline
from pytest_mla.core.kernelspec import KernelSpec
from pytest_mla.engines.common.platform_process import PlatformProcess

RUNNERS = textwrap.dedent('''
    import os, time

    from pytest_mla.kernels.engine_runner import RankResult
    from pytest_mla.kernels.reference import ref_mla_decode


    class Adapter:
        def __init__(self, platform):
            self.platform = platform


    def _reference(inputs, scale=1.0):
        args = inputs.ref_args()
        args["softmax_scale"] = args["softmax_scale"] * scale
        out, _ = ref_mla_decode(**args)
        return RankResult(out.to(inputs.q.dtype), None, None, ("fake:attend",),
                          notes=("platform " + os.environ["PYTEST_MLA_IMPORT_PLATFORM"],))


    def exact(inputs, ctx, options):
        return _reference(inputs)


    def scaled(inputs, ctx, options):
        return _reference(inputs, 1.05)


    def dies(inputs, ctx, options):
        os._exit(3)


    def hangs(inputs, ctx, options):
        time.sleep(600)
''')


@pytest.fixture
def child(tmp_path, monkeypatch):
    (tmp_path / "fake_platform_runners.py").write_text(RUNNERS)
    monkeypatch.syspath_prepend(str(tmp_path))  # the child gets the parent's import path
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # its log
    process = PlatformProcess("fake_platform_runners:Adapter", "rocm", engine="fake", version="1.0")
    yield process
    process.close()


def _case():
    from pytest_mla.core.models import ModelConfig
    from pytest_mla.kernels import harness

    model = ModelConfig("mla-tiny", True, 4, 1, 64, 32, 64, 64)
    coords = {"model": "mla-tiny", "backend": "fake", "dcp": 1, "spec": "none", "arch": "gfx942"}
    return harness.case_for(coords, model, seed=0, dtype="fp32", overrides={"min_seqlen": 1})


def _spec(runner: str) -> KernelSpec:
    return KernelSpec(name="fake", target=f"fake_platform_runners:{runner}", protocol="engine", level="backend",
                      package="fake_platform_runners", returns_lse=False)


def _run(process, runner, case=None):
    return process.run_check(case or _case(), _spec(runner), where="interpreter", dcp_mode="in-process",
                             timeout_s=60)


def test_the_child_runs_the_check_on_its_platform_and_sends_the_record(child):
    record = _run(child, "exact")
    assert record["status"] == "verified", record
    assert "platform rocm" in record["notes"]  # computed in the child, whose platform variable is rocm
    assert record["functions"] == ["fake:attend"]
    failed = _run(child, "scaled")  # the same child, a wrong scale: the comparison failed there
    assert failed["status"] == "failed" and "beyond abs" in failed["message"] and not failed.get("crashed")


def test_a_child_that_dies_in_the_check_is_a_crashed_record_and_the_next_check_starts_a_fresh_child(child):
    record = _run(child, "dies")
    assert record["status"] == "failed" and record["crashed"] is True
    assert "the fake rocm child process ended (EOFError; its log: " in record["message"]
    assert record["level"] == "backend" and record["case"]["dcp"] == 1
    assert _run(child, "exact")["status"] == "verified"


def test_a_check_past_the_cell_deadline_ends_the_child_never_hangs(child):
    case = _case()
    _run(child, "exact", case)  # the child is up (its start is not what the deadline measures)
    pid = child._child.pid
    start = time.monotonic()
    with pytest.raises(CellTimeout, match="timed out after 2 s in the kernel check"):
        with Deadline(2, phase="the kernel check"):
            _run(child, "hangs", case)
    assert time.monotonic() - start < 30
    assert child._child is None  # killed and forgotten
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert _run(child, "exact", case)["status"] == "verified"


@pytest.mark.skipif(sys.platform == "win32", reason="SIGALRM")
def test_configure_still_answers_through_the_same_child(child):
    from pytest_mla.core.cells import Cell

    # the stand-in adapter has no configure(): the child's AttributeError comes back as itself
    with pytest.raises(AttributeError, match="configure"):
        child.configure(Cell.from_id("mla-tiny/fake/dcp1/none/gfx942"), None)


def test_an_empty_log_is_removed_when_the_process_closes_and_a_log_with_text_is_kept(child, tmp_path):
    assert _run(child, "exact")["status"] == "verified"
    log = child._log
    assert os.path.exists(log) and os.path.getsize(log) == 0  # the child wrote nothing to stderr
    child.close()
    assert not os.path.exists(log)
    record = _run(child, "dies")  # a fresh child that dies: what it wrote stays for the message's reader
    assert record["crashed"] and child._log in record["message"]
    with open(child._log, "ab") as log_file:  # (as a dying child's traceback would be)
        log_file.write(b"Traceback\n")
    child.close()
    assert os.path.exists(child._log)
