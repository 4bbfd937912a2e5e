"""The files a run writes (issue 44, writers): regular files only, the previous report never destroyed,
never left beside a new one it does not describe, one run per report folder."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from pytest_mla.report import output, results
from pytest_mla.report.results import read_results

from .helpers import HANGS, matrix, verdicts

pytest_plugins = ["pytester"]

PREVIOUS = b'{"the previous complete report": true}\n'


def _previous_report(path):
    """A report folder as the last run left it (json, run facts, md, html)."""
    reports = path / "reports"
    reports.mkdir()
    files = {name: f"the previous {name}\n".encode() for name in ("m.md", "m.html", "m.run.json")}
    files["m.json"] = PREVIOUS
    for name, data in files.items():
        (reports / name).write_bytes(data)
    return reports, files


def _contents(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


# -- 1. what is in the way is refused before the first cell --------------------------------------

@pytest.mark.parametrize("name, kind", [
    ("m.json", "symlink"), ("m.json", "fifo"), ("m.json", "folder"),
    ("m.md", "fifo"), ("m.html", "symlink"), ("m.run.json", "folder"),
])
def test_an_output_that_is_not_a_regular_file_stops_the_run_before_the_first_cell(liar, no_hang, name, kind):
    liar.makefile(".toml", m=matrix(["lenient"]))
    reports = liar.path / "reports"
    reports.mkdir()
    target = liar.path / "elsewhere.json"
    target.write_bytes(PREVIOUS)
    entry = reports / name
    {"symlink": lambda: os.symlink(target, entry), "fifo": lambda: os.mkfifo(entry),
     "folder": lambda: entry.mkdir()}[kind]()
    result = liar.runpytest("--mla-matrix=m.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    what = {"symlink": f"a symbolic link to {target}); pytest-mla replaces only regular files: write to the "
                       "link's target instead",
            "fifo": "a FIFO); pytest-mla writes only regular files, replacing them whole",
            "folder": "a folder); pytest-mla writes only regular files, replacing them whole"}[kind]
    assert result.stderr.lines == [f"ERROR: --mla-report-dir: {entry}: not a regular file ({what}", ""] or \
        result.stderr.lines == [f"ERROR: --mla-report-dir: {entry}: not a regular file ({what}"]
    assert "passed" not in result.stdout.str()
    assert sorted(p.name for p in reports.iterdir()) == [name]  # no cell streamed, no lock left
    assert {"symlink": stat.S_ISLNK, "fifo": stat.S_ISFIFO, "folder": stat.S_ISDIR}[kind](os.lstat(entry).st_mode)
    assert target.read_bytes() == PREVIOUS


def test_a_baseline_that_is_the_report_it_would_replace_is_refused(liar):
    liar.makefile(".toml", m=matrix(["lenient"]))
    liar.runpytest("--mla-matrix=m.toml").assert_outcomes(passed=2)
    report = liar.path / "reports" / "m.json"
    before = report.read_bytes()
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-baseline=reports/m.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --mla-report-dir: {report}: is an input of this command; writing it "
                                 "would replace what the command reads: write to another file"])
    link = liar.path / "baseline.json"
    os.link(report, link)  # the same file under another name
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-baseline=baseline.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --mla-report-dir: {report}: is an input of this command (baseline.json: "
                                 "the same file); writing it would replace what the command reads: write to "
                                 "another file"])
    assert "passed" not in result.stdout.str()
    assert report.read_bytes() == before


# -- 2. a write error never destroys the previous report ------------------------------------------

class FullAfter:
    """A stream's file on a disk that fills up after ``writes`` writes."""

    def __init__(self, path, writes):
        self.file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by close()
        self.writes = writes

    def write(self, data):
        if self.writes == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.writes -= 1
        return self.file.write(data)

    def seek(self, *args):
        return self.file.seek(*args)

    def truncate(self, *args):
        return self.file.truncate(*args)

    def close(self):
        self.file.close()


@pytest.mark.parametrize("when", ["as the run goes", "at the end"])
def test_a_full_disk_leaves_the_previous_report_byte_identical_and_fails_the_run(liar, monkeypatch, when):
    liar.makefile(".toml", m=matrix(["a", "b", "c"]))
    reports, previous = _previous_report(liar.path)
    real_replace = output.replace_file

    def replace_file(source, path, inputs=()):  # the report folder is full: nothing lands there
        if os.path.dirname(os.fspath(path)) == os.fspath(reports):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(source, path, inputs)

    monkeypatch.setattr(output, "replace_file", replace_file)
    monkeypatch.setattr(results, "replace_file", replace_file)
    if when == "as the run goes":  # the header and a cell fit, then nothing
        monkeypatch.setattr(results, "open_fresh", lambda path: FullAfter(path, 2))
    result = liar.runpytest("--mla-matrix=m.toml", "-p", "no:xdist")
    result.assert_outcomes(passed=6)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    failures = [ln for ln in result.stdout.lines if ln.startswith("mla report: ")]
    lost = (f"mla report: cannot write {reports / 'm.json'}: No space left on device; the results are in ")
    assert failures[-1].startswith(lost)
    if when == "as the run goes":
        assert failures[:-1] == [f"mla report: cannot write {reports / 'm.json'} as the run goes: No space left on "
                                 "device; writing it at the end"]
    else:
        assert len(failures) == 1
    fallback = failures[-1][len(lost):]
    try:
        assert list(verdicts(read_results(fallback)).values()) == ["pass"] * 6
    finally:
        os.unlink(fallback)
    # the previous report and its renderings are as they were (they still describe each other)
    assert _contents(reports) == previous


def test_a_new_report_never_sits_beside_renderings_of_the_previous_run(liar, monkeypatch):
    liar.makefile(".toml", m=matrix(["a"]))
    reports, _ = _previous_report(liar.path)
    import pytest_mla.report.html

    def broken(document, **kwargs):
        raise KeyError("no such column")

    render_html = pytest_mla.report.html.render_html
    monkeypatch.setattr(pytest_mla.report.html, "render_html", broken)
    result = liar.runpytest("--mla-matrix=m.toml")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["mla report: cannot render the reports of *m.json: KeyError: 'no such column'*"])
    # the new JSON landed with its own run facts and Markdown; the old HTML is gone, not left to contradict it
    assert sorted(p.name for p in reports.iterdir()) == ["m.docs.md", "m.json", "m.md", "m.run.json"]
    assert len(read_results(reports / "m.json")["cells"]) == 2
    assert b"the previous" not in (reports / "m.md").read_bytes() + (reports / "m.run.json").read_bytes()
    monkeypatch.setattr(pytest_mla.report.html, "render_html", render_html)  # (pytester's cwd is on monkeypatch)
    # renderings not asked for are removed too: the JSON alone
    result = liar.runpytest("--mla-matrix=m.toml", "--mla-report-format=json")
    assert result.ret == pytest.ExitCode.OK
    assert sorted(p.name for p in reports.iterdir()) == ["m.json", "m.run.json"]


# -- 3. one run per report folder ----------------------------------------------------------------

def test_a_second_run_into_the_same_report_folder_is_refused_naming_the_first(pytester):
    pytester.makeconftest(HANGS)
    pytester.makefile(".toml", m=matrix(["a", "hang"], archs=("sm90",)))
    reports, previous = _previous_report(pytester.path)
    first = subprocess.Popen([sys.executable, "-m", "pytest", "--mla-matrix=m.toml", "-p", "no:xdist",
                              "-p", "no:cacheprovider"], cwd=pytester.path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (pytester.path / "hanging").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run never reached its hang"
            time.sleep(0.05)
        second = pytester.runpytest("--mla-matrix=m.toml", "--mla-select=backend=a")
        assert second.ret == pytest.ExitCode.USAGE_ERROR
        second.stderr.fnmatch_lines([f"ERROR: --mla-report-dir: {reports} is being written by another pytest-mla "
                                     f"run (pid {first.pid}); wait for it to end, or give this run another "
                                     "--mla-report-dir"])
        assert "passed" not in second.stdout.str()
        # the second run wrote nothing; the first one's finished cell is in its side file
        assert {n: d for n, d in _contents(reports).items() if n in previous} == previous
        assert sorted(_contents(reports)) == sorted([*previous, ".pytest-mla.lock", "m.json.partial"])
    finally:
        first.send_signal(signal.SIGKILL)  # killed with its lock held: the kernel lets it go
        first.wait()
    assert (reports / ".pytest-mla.lock").exists()  # left by the killed run; it must not block
    again = pytester.runpytest("--mla-matrix=m.toml", "--mla-select=backend=a")
    assert again.ret == pytest.ExitCode.OK
    assert list(verdicts(read_results(reports / "m.json")).values()) == ["pass"]
    assert ".pytest-mla.lock" not in _contents(reports) and "m.json.partial" not in _contents(reports)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_held_report_folder_lock_stops_the_run_and_only_the_controller_takes_it(liar, workers):
    if workers:
        pytest.importorskip("xdist")
    liar.makefile(".toml", m=matrix(["lenient"]))
    reports = liar.path / "reports"
    reports.mkdir()
    fd = os.open(reports / ".pytest-mla.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"4242\n")
        result = liar.runpytest("--mla-matrix=m.toml", *workers)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"ERROR: --mla-report-dir: {reports} is being written by another pytest-mla "
                                     "run (pid 4242); wait for it to end, or give this run another --mla-report-dir"])
        assert sorted(p.name for p in reports.iterdir()) == [".pytest-mla.lock"]
    finally:
        os.close(fd)
    # released: the run goes, under xdist too (a worker taking the lock would stop it), and leaves no lock
    result = liar.runpytest("--mla-matrix=m.toml", *workers)
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    assert sorted(p.name for p in reports.iterdir()) == ["m.docs.md", "m.html", "m.json", "m.md", "m.run.json"]
