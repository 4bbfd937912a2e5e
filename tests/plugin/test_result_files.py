"""The result files a run writes: as it goes (a killed run keeps its finished cells), the same bytes
for the same outcomes (issue 23.5: run facts that change every time go to a side file)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from pytest_mla.cli import main as cli_main
from pytest_mla.report.results import read_results

from .helpers import HANGS, LIAR_CONFTEST, matrix, read_report

pytest_plugins = ["pytester"]

MANY = matrix([f"b{i}" for i in range(10)] + ["strict"], archs=("sm80", "sm90", "sm100"), rules="""
    [[rule]]
    when = { backend = "strict" }
    reject = { error = "ValueError", message = "strict refuses {arch}." }
""")

def test_a_killed_run_leaves_every_finished_cell_readable_and_the_previous_report(pytester):
    pytester.makeconftest(HANGS)
    pytester.makefile(".toml", m=matrix(["a", "b", "c", "hang", "d"], archs=("sm80", "sm90", "sm100")))
    previous = pytester.path / "reports" / "m.json"
    previous.parent.mkdir()
    previous.write_bytes(b'{"the previous complete report": true}\n')
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--mla-matrix=m.toml", "-p", "no:xdist",
                             "-p", "no:cacheprovider"], cwd=pytester.path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (pytester.path / "hanging").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run never reached the hanging cell"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # no handler runs: nothing is written after this
    finally:
        proc.kill()
        proc.wait()
    # the cells went to a side file; the previous report is as it was
    assert previous.read_bytes() == b'{"the previous complete report": true}\n'
    doc = read_results(pytester.path / "reports" / "m.json.partial")
    assert [c["id"] for c in doc["cells"]] == [f"deepseek-v3/{b}/dcp1/none/{a}" for b in "abc"
                                               for a in ("sm80", "sm90", "sm100")]
    assert doc["run"]["complete"] is False and doc["run"]["interrupted"] is True
    assert doc["warnings"][0].endswith("read the 9 whole cell(s) before the cut; 6 of the 15 cells it was to "
                                       "report are missing")


def test_the_same_run_writes_the_same_bytes_and_keeps_run_facts_beside(liar):
    liar.makefile(".toml", m=MANY)
    liar.runpytest("--mla-matrix=m.toml", "-p", "no:xdist").assert_outcomes(passed=33)
    reports = liar.path / "reports"
    first = {p.name: p.read_bytes() for p in reports.iterdir()}
    assert sorted(first) == ["m.docs.md", "m.html", "m.json", "m.md", "m.run.json"]
    # the docs page links into the HTML report beside it and passes the drift gate as written
    assert b"](m.html#g=" in first["m.docs.md"]
    assert cli_main(["check", str(reports / "m.docs.md"), "--from", str(reports / "m.json")]) == 0
    text = first["m.json"].decode()
    for volatile in ('"started"', '"finished"', '"git_commit"', '"args"', '"duration_s"', '"time_s"'):
        assert volatile not in text
    facts = json.loads(first["m.run.json"])
    assert facts["results"] == "m.json" and facts["args"][:3] == ["--mla-matrix=m.toml", "-p", "no:xdist"]
    assert facts["started"] <= facts["finished"]
    assert len(facts["cells"]) == 33 and all(c["duration_s"] >= 0 for c in facts["cells"].values())
    time.sleep(1.1)  # a second later: other timestamps, other durations
    liar.runpytest("--mla-matrix=m.toml", "-p", "no:xdist").assert_outcomes(passed=33)
    again = {p.name: p.read_bytes() for p in reports.iterdir()}
    assert {n: again[n] == first[n] for n in first} == {"m.docs.md": True, "m.html": True, "m.json": True,
                                                         "m.md": True, "m.run.json": False}
    # xdist: cells come back in another order and the file is written again in matrix order
    result = liar.runpytest_subprocess("--mla-matrix=m.toml", "-n", "2")
    result.assert_outcomes(passed=33)
    parallel = {p.name: p.read_bytes() for p in reports.iterdir()}
    assert {n: parallel[n] == first[n] for n in ("m.docs.md", "m.html", "m.json", "m.md")} == {
        "m.docs.md": True, "m.html": True, "m.json": True, "m.md": True}


def test_a_record_travels_from_an_xdist_worker_as_one_json_text(liar):
    liar.makeconftest(LIAR_CONFTEST + '''
import json, os

@__import__("pytest").hookimpl(wrapper=True)
def pytest_report_to_serializable(config, report):
    data = yield
    if data and "mla_cell" in data and hasattr(config, "workerinput"):
        with open(os.path.join(str(config.rootpath), "carried-" + config.workerinput["workerid"]), "a") as f:
            f.write(type(data["mla_cell"]).__name__ + "\\n")
    return data
''')
    liar.makefile(".toml", m=matrix(["a", "b"]))
    liar.runpytest_subprocess("--mla-matrix=m.toml", "-n", "2").assert_outcomes(passed=4)
    carried = "".join(p.read_text() for p in liar.path.glob("carried-*")).split()
    assert carried == ["str"] * 4
    assert [c["verdict"] for c in read_report(liar)["cells"]] == ["pass"] * 4


def test_git_ignores_the_run_facts_of_the_committed_reports():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.exists(os.path.join(root, ".git")):
        return  # an unpacked sdist: no repository to ask
    done = subprocess.run(["git", "check-ignore", "reports/reference.run.json", "reports/sglang-0.5.23.run.json"],
                          cwd=root, capture_output=True, text=True)
    assert done.stdout.split() == ["reports/reference.run.json", "reports/sglang-0.5.23.run.json"]
