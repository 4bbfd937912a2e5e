"""Where pytest-mla writes: whole regular files, never a command's own input, one writer per folder.

Every file the project writes (a result file, its run facts, Markdown and HTML,
a merge, a diff, a suggested patch, a matrix copied by ``init``, a reproducer)
goes through ``write_text_atomic``: the text goes to a temporary file in the
same folder, which then replaces the target with ``os.replace``; a reader sees
the old file or the new one, never half of one, and a write that fails (a full
disk) leaves the old file as it was.

``check_output`` is the one guard those writers share. It refuses, with a
one-line ``OutputError``, a target that exists and is not a regular file
(a symbolic link, a FIFO, a device such as ``/dev/full``, a folder, a socket):
replacing it would turn a device into a plain file, or cut a link someone made,
and opening one (a FIFO) can hang. A symbolic link is refused rather than
followed: the message says to write to the link's target instead. It also
refuses a target that is one of the command's inputs (the same file by
``os.path.samefile``: the same path, a hard link, a link to it): a command must
not replace what it reads. Commands check their outputs before doing the work,
and ``write_text_atomic`` checks again (``lstat``) just before ``os.replace``.

``FolderLock`` keeps two pytest runs from writing one report folder at once:
an advisory ``flock`` on ``.pytest-mla.lock`` in it, held by the controlling
process for the session. The kernel releases it when that process dies, so a
killed run never blocks the next one.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterable

#: The lock file a pytest run holds in its report folder.
LOCK_NAME = ".pytest-mla.lock"


class OutputError(OSError):
    """An output pytest-mla refuses to replace; prints as one line ``PATH: reason``."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(errno.EPERM, reason, os.fspath(path))
        self.path = os.fspath(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a plain file"


def check_output(path: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Raise ``OutputError`` unless ``path`` is absent or a regular file that is none of ``inputs``.

    Only ``lstat``/``stat`` are asked: nothing is opened (a FIFO would block)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # a new file (a missing folder on the way is the writer's error to report)
    except NotADirectoryError:
        return  # a file where a folder of the path should be: the writer names it
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise OutputError(path, f"not a regular file (a symbolic link to {target}); pytest-mla replaces only "
                                "regular files: write to the link's target instead")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(path, f"not a regular file ({_kind(st.st_mode)}); pytest-mla writes only regular files, "
                                "replacing them whole")
    for given in inputs:
        if given is None or os.fspath(given) == "-":
            continue
        try:
            same = os.path.samefile(path, given)
        except OSError:
            continue  # an input that is not there is not this file
        if same:
            shown = os.fspath(given)
            also = "" if os.path.abspath(shown) == os.path.abspath(path) else f" ({shown}: the same file)"
            raise OutputError(path, f"is an input of this command{also}; writing it would replace what the command "
                                    "reads: write to another file")


def check_distinct(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Raise ``OutputError`` when two outputs of one command are the same file (the second would
    replace the first)."""
    seen: dict[str, str] = {}
    for path in paths:
        if path is None or os.fspath(path) == "-":
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise OutputError(path, f"is also the output {seen[key]}: give each output its own file")
        seen[key] = os.fspath(path)


def write_text_atomic(path: str | os.PathLike[str], text: str, *,
                      inputs: Iterable[str | os.PathLike[str]] = (), mode: int = 0o666) -> Path:
    """``text`` as the whole file ``path`` (UTF-8): written beside it, then ``os.replace``d.

    ``check_output`` first and again just before the replace; ``mode`` less the umask."""
    path = Path(path)
    inputs = tuple(inputs)
    check_output(path, inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a crash leaves the old file or the new one
        os.chmod(tmp, mode & ~_umask())  # mkstemp makes 0600; a report is an ordinary file
        replace_file(tmp, path, inputs)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def replace_file(source: str | os.PathLike[str], path: str | os.PathLike[str],
                 inputs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """``os.replace(source, path)`` after ``check_output(path)``: what is there now, not at the start."""
    check_output(path, inputs)
    os.replace(source, path)


def open_fresh(path: str | os.PathLike[str]) -> IO[bytes]:
    """A new, empty regular file at ``path`` for writing (unbuffered), whatever was there: an
    earlier file (or a link: the link goes, not its target) is removed first, and the file is
    created exclusively, never through a link. A folder there is an ``OSError``."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    return os.fdopen(fd, "wb", buffering=0)


def open_append(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened to append (created if absent), refused unless it is a regular file: a FIFO is
    never waited on, a folder or device is an ``OSError`` naming what is there."""
    try:
        _regular_or_refuse(os.stat(path).st_mode, path)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)  # non-blocking: a FIFO put there since is ENXIO, not a wait
    try:
        _regular_or_refuse(os.fstat(fd).st_mode, path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def _regular_or_refuse(mode: int, path: str | os.PathLike[str]) -> None:
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"not a regular file ({_kind(mode)})", os.fspath(path))


def remove_file(path: str | os.PathLike[str]) -> bool:
    """Remove ``path`` if it is a regular file (a stale rendering); True if one was removed."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    os.unlink(path)
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- one writer per report folder ----------------------------------------------------------
class FolderBusyError(OSError):
    """Another process holds the folder's lock; ``pid`` is what it wrote there (None if unknown)."""

    def __init__(self, folder: Path, pid: int | None) -> None:
        super().__init__(errno.EWOULDBLOCK, "locked by another process", os.fspath(folder))
        self.folder = folder
        self.pid = pid


class FolderLock:
    """An exclusive advisory lock on ``folder/.pytest-mla.lock`` (``fcntl.flock``), holding this
    process's pid. ``acquire`` raises ``FolderBusyError`` when another process holds it; ``release``
    removes the file (still holding the lock, so that no third process locks a file already gone).
    Without ``fcntl`` (Windows) it locks nothing."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        for _ in range(100):  # the file may be removed by its holder between our open and our lock
            fd = os.open(self.path, flags, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _read_pid(fd)
                os.close(fd)
                raise FolderBusyError(self.folder, pid) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                held, there = os.fstat(fd), os.lstat(self.path)
                same = (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self._fd = fd
                return
            os.close(fd)  # we locked a file its holder has just removed: take the new one
        raise FolderBusyError(self.folder, None)  # pragma: no cover - a hundred holders in a row

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
