"""Every ``pytest-mla`` command that writes a file: a regular file, replaced whole, never its own input.

Issue 44 (writers): ``-o`` onto a symbolic link, a FIFO, a device or a folder replaced the entry with a
plain file and exited 0; ``-o`` naming an input overwrote it. Each command now refuses such an output in
one line (exit 2) before doing its work, and again just before the replace.
"""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from pytest_mla import cli
from pytest_mla.cli import main

from .helpers import make_document

#: Each command that writes, with ``{out}`` where its output goes; ``{r}`` is a result file.
WRITERS = {
    "render": ["render", "{r}", "-f", "md", "-o", "{out}"],
    "render-json": ["render", "{r}", "-f", "json", "-o", "{out}"],
    "render-two": ["render", "{r}", "-o", "{t}/fine.html", "-o", "{out}"],
    "merge": ["merge", "{r}", "-o", "{out}"],
    "diff": ["diff", "{r}", "{r}", "-o", "{out}"],
    "suggest": ["suggest", "{r}", "-o", "{out}"],
    "init": ["init", "sglang", "--force", "-o", "{out}"],
    "repro": ["repro", "{r}", "deepseek-v3/triton/dcp1/none/sm90", "-o", "{out}"],
    "repro-report": ["repro", "{r}", "deepseek-v3/triton/dcp1/none/sm90", "--report", "{out}"],
}
#: The output's name where ``out.md`` does not fit the command.
OUT = {"render-json": "out.json"}


@pytest.fixture
def result(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(make_document()), encoding="utf-8")
    return path


def run(argv, **values):
    return main([a.format(**values) for a in argv])


def one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("pytest-mla: error: "), captured.err
    assert "Traceback" not in captured.err
    return captured.err.rstrip("\n")[len("pytest-mla: error: "):]


def option_of(argv) -> str:
    return argv[argv.index("{out}") - 1]


def make_entry(kind: str, path, target) -> str:
    """A non-regular entry at ``path``; returns how to recognise it afterwards."""
    if kind == "symlink":
        os.symlink(target, path)
    elif kind == "dangling symlink":
        os.symlink(str(target) + ".missing", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        os.mkdir(path)
    return kind


REASONS = {
    "symlink": "not a regular file (a symbolic link to {target}); pytest-mla replaces only regular files: "
               "write to the link's target instead",
    "dangling symlink": "not a regular file (a symbolic link to {target}.missing); pytest-mla replaces only "
                        "regular files: write to the link's target instead",
    "fifo": "not a regular file (a FIFO); pytest-mla writes only regular files, replacing them whole",
    "folder": "not a regular file (a folder); pytest-mla writes only regular files, replacing them whole",
}


@pytest.mark.parametrize("kind", sorted(REASONS))
@pytest.mark.parametrize("command", sorted(WRITERS))
def test_an_output_that_is_not_a_regular_file_is_refused_in_one_line_and_left_as_it_was(
        tmp_path, capsys, result, no_hang, command, kind):
    if command == "init" and kind == "folder":
        pytest.skip("init -o FOLDER writes FOLDER/ENGINE.toml (its folder form)")
    target = tmp_path / "target.txt"
    target.write_text("someone else's file\n")
    out = tmp_path / OUT.get(command, "out.md")
    make_entry(kind, out, target)
    argv = WRITERS[command]
    assert run(argv, r=result, t=tmp_path, out=out) == 2
    reason = REASONS[kind].format(target=target)
    assert one_line(capsys) == f"{option_of(argv)} {out}: {reason}"
    # nothing replaced, nothing written beside it
    mode = os.lstat(out).st_mode
    assert {"symlink": stat.S_ISLNK, "dangling symlink": stat.S_ISLNK, "fifo": stat.S_ISFIFO,
            "folder": stat.S_ISDIR}[kind](mode)
    assert target.read_text() == "someone else's file\n"
    if kind == "folder":
        assert list(out.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, "r.json", "target.txt"])


@pytest.mark.parametrize("device", ["/dev/full", "/dev/null", "/dev/stdout"])
def test_a_device_or_standard_output_as_a_file_is_refused_with_the_way_to_standard_output(
        tmp_path, capsys, result, device):
    if not os.path.lexists(device) or stat.S_ISREG(os.lstat(device).st_mode):
        pytest.skip(f"no {device} device here")
    assert main(["render", str(result), "-f", "md", "-o", device]) == 2
    line = one_line(capsys)
    kind = "a symbolic link to " if os.path.islink(device) else "a character device"
    assert line.startswith(f"-o {device}: not a regular file ({kind}")
    assert line.endswith("(for standard output, leave the option out or give -)")
    assert capsys.readouterr().out == ""


def _suggesting_document(matrix_file) -> dict:
    """A result with one cell that failed because the engine refused what the matrix accepts."""
    doc = make_document()
    cell = next(c for c in doc["cells"] if c["expectation"]["kind"] == "accept")
    cell.update(verdict="fail", outcome={"kind": "rejected", "error": "ValueError", "message": "no."},
                kernel=None, reason="rejected, expected accept")
    doc["run"]["matrix_file"] = os.fspath(matrix_file)
    return doc


#: A command and its input given again as its output (``{in}``: the input it names).
INPUTS = {
    "render-json": (["render", "{r}", "-f", "json", "-o", "{in}"], "{r}"),
    "render-hardlink": (["render", "{r}", "-f", "json", "-o", "{t}/hard.json"], "{r}"),
    "merge": (["merge", "{r}", "{t}/s.json", "-o", "{in}"], "{t}/s.json"),
    "diff": (["diff", "{r}", "{t}/s.json", "-o", "{in}"], "{t}/s.json"),
    "suggest --matrix": (["suggest", "{s}", "--matrix", "{t}/m.toml", "-o", "{in}"], "{t}/m.toml"),
    "suggest run.matrix_file": (["suggest", "{s}", "-f", "rules", "-o", "{in}"], "{t}/m.toml"),
    "repro": (["repro", "{r}", "deepseek-v3/triton/dcp1/none/sm90", "-o", "{in}"], "{r}"),
}


@pytest.mark.parametrize("command", sorted(INPUTS))
def test_an_output_that_is_an_input_of_the_command_is_refused_and_the_input_kept(tmp_path, capsys, result, command):
    second = make_document(hostname="host-b")
    (tmp_path / "s.json").write_text(json.dumps(second), encoding="utf-8")
    matrix = tmp_path / "m.toml"
    matrix.write_text("# the matrix\n", encoding="utf-8")
    suggesting = tmp_path / "suggest.json"
    suggesting.write_text(json.dumps(_suggesting_document(matrix)), encoding="utf-8")
    os.link(result, tmp_path / "hard.json")
    argv, given = INPUTS[command]
    values = {"r": result, "s": suggesting, "t": tmp_path}
    given = given.format(**values)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert run(argv, **values, **{"in": given}) == 2
    line = one_line(capsys)
    out = argv[-1].format(**values, **{"in": given})
    also = "" if out == given else f" ({given}: the same file)"
    assert line == (f"-o {out}: is an input of this command{also}; writing it would replace what the command "
                    "reads: write to another file")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert "nothing was changed" not in capsys.readouterr().err


def test_init_refuses_to_write_over_the_matrix_it_copies(tmp_path, capsys):
    shipped = cli.shipped_matrices()["sglang"]
    if not isinstance(shipped, os.PathLike):
        pytest.skip("the shipped matrices are not files here (a zip install)")
    copied = os.path.realpath(shipped)  # in this repository the shipped file links to matrix/sglang.toml
    before = open(copied, "rb").read()
    assert main(["init", "sglang", "--force", "-o", copied]) == 2
    also = "" if copied == os.fspath(shipped) else f" ({os.fspath(shipped)}: the same file)"
    assert one_line(capsys) == (f"-o {copied}: is an input of this command{also}; writing it would replace what "
                                "the command reads: write to another file")
    assert open(copied, "rb").read() == before


def test_two_outputs_that_are_one_file_are_refused(tmp_path, capsys, result):
    assert main(["render", str(result), "-o", str(tmp_path / "a.md"), "-o", f"{tmp_path}/./a.md"]) == 2
    assert one_line(capsys) == f"-o {tmp_path}/./a.md: is also the output {tmp_path / 'a.md'}: give each output its own file"
    argv = ["repro", str(result), "deepseek-v3/triton/dcp1/none/sm90", "-o", str(tmp_path / "x.md"),
            "--report", str(tmp_path / "x.md")]
    assert main(argv) == 2
    assert one_line(capsys) == f"--report {tmp_path / 'x.md'}: is also the output {tmp_path / 'x.md'}: give each output its own file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_an_entry_that_turns_into_a_fifo_after_the_first_check_is_refused_at_the_replace(
        tmp_path, capsys, monkeypatch, result, no_hang):
    out = tmp_path / "out.md"
    monkeypatch.setattr(cli, "check_outputs", lambda outputs, inputs: os.mkfifo(out))  # it appears after the check
    assert main(["render", str(result), "-o", str(out)]) == 2
    assert one_line(capsys) == (f"-o {out}: not a regular file (a FIFO); pytest-mla writes only regular files, "
                                "replacing them whole")
    assert stat.S_ISFIFO(os.lstat(out).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.md", "r.json"]  # no temporary file left


class FullDisk:
    """``os.fdopen`` on a full disk: the file opens, every write fails."""

    def __init__(self, fd, *args, **kwargs):
        self.fd = fd

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("command", ["render", "render-json", "merge", "diff", "init"])
def test_a_full_disk_leaves_the_previous_output_byte_identical(tmp_path, capsys, monkeypatch, result, command):
    out = tmp_path / OUT.get(command, "out.md")
    out.write_bytes(b"the previous output\n")
    monkeypatch.setattr(os, "fdopen", FullDisk)
    try:
        code = run(WRITERS[command], r=result, t=tmp_path, out=out)
    finally:
        monkeypatch.undo()
    assert code == 2
    assert one_line(capsys) == f"{out}: cannot write: No space left on device"
    assert out.read_bytes() == b"the previous output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, "r.json"])  # no temporary file left
