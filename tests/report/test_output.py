"""``report.output``: the guard every writer shares, and the report folder's lock."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile

import pytest

from pytest_mla.report.output import (
    LOCK_NAME, FolderBusyError, FolderLock, OutputError, check_output, write_text_atomic,
)


def test_a_socket_is_not_a_regular_file():
    folder = tempfile.mkdtemp(prefix="mla-", dir="/tmp")  # a socket's path must be short
    try:
        path = os.path.join(folder, "s.md")
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)
            with pytest.raises(OutputError) as info:
                write_text_atomic(path, "text")
        assert str(info.value) == (f"{path}: not a regular file (a socket); pytest-mla writes only regular files, "
                                   "replacing them whole")
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and os.listdir(folder) == ["s.md"]
    finally:
        shutil.rmtree(folder)


def test_a_regular_file_is_replaced_whole_with_the_umask_mode(tmp_path):
    out = tmp_path / "x.md"
    out.write_text("old")
    os.chmod(out, 0o600)
    check_output(out, [tmp_path / "other.json"])  # absent input: not this file
    write_text_atomic(out, "new", mode=0o777)
    mask = os.umask(0)
    os.umask(mask)
    assert out.read_text() == "new" and stat.S_IMODE(os.stat(out).st_mode) == 0o777 & ~mask
    assert os.listdir(tmp_path) == ["x.md"]


def test_the_folder_lock_is_exclusive_names_its_holder_and_goes_with_it(tmp_path):
    first, second = FolderLock(tmp_path), FolderLock(tmp_path)
    first.acquire()
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(FolderBusyError) as info:
        second.acquire()  # flock: another open file, even in the same process
    assert info.value.pid == os.getpid() and info.value.folder == tmp_path
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    second.acquire()
    second.release()
    second.release()  # twice is harmless
    assert os.listdir(tmp_path) == []
