"""An output folder's guards: one writer at a time, and files written as a set.

:func:`folder_lock` holds an exclusive lock on a folder for as long as a run
writes there (``fcntl.flock`` on the file :data:`LOCK_FILE` inside it, which
names the holder: process id, host and command). A second run on the folder is
refused at once with :class:`FolderInUseError`, naming the holder; the lock is
released however the holder ends (the kernel drops it even when the process is
killed), and the lock file is removed on a normal exit.

:func:`write_set` writes a run's final outputs into a temporary folder inside
the output folder and renames them into place only once every one of them is
complete: a run that fails while writing (a full disk, say) leaves the previous
run's files as they were, and no partial file behind.

>>> import tempfile, pathlib
>>> out = pathlib.Path(tempfile.mkdtemp())
>>> def write(staging):
...     (staging / "a.txt").write_text("new")
...     return [staging / "a.txt"]
>>> with folder_lock(out):
...     files = write_set(out, write)
>>> [p.name for p in files], sorted(p.name for p in out.iterdir())
(['a.txt'], ['a.txt'])
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = [
    "LOCK_FILE",
    "FolderInUseError",
    "folder_lock",
    "fsync_directory",
    "is_empty",
    "write_set",
]

#: The lock file a running writer holds in its output folder.
LOCK_FILE = ".lbm_jax.lock"

#: Prefix of the temporary folders :func:`write_set` fills before renaming.
_PARTIAL = ".partial-"


class FolderInUseError(RuntimeError):
    """Another run holds the output folder's lock.

    Attributes:
        folder: The folder.
        holder: What the holder wrote in the lock file (``pid``, ``host``,
            ``command``, ``since``), or an empty dict if it could not be read.
    """

    def __init__(self, folder: Path, holder: dict[str, object]) -> None:
        self.folder = folder
        self.holder = holder
        who = "another run"
        if holder:
            who = (
                f"another run (pid {holder.get('pid')} on {holder.get('host')}, "
                f"since {holder.get('since')}: {holder.get('command')})"
            )
        super().__init__(
            f"{str(folder)!r} is in use by {who}; wait for it to end, or choose "
            "another directory."
        )


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``folder``'s lock (the folder must exist) for the ``with`` block.

    Yields:
        The lock file's path.

    Raises:
        FolderInUseError: At once, if another process holds the lock.
    """
    import fcntl  # POSIX only, like the advisory lock it takes

    path = Path(folder) / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderInUseError(Path(folder), _holder(path)) from None
        try:  # the holder before us may have removed the file we opened
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_me()).encode())
        for stale in Path(folder).glob(_PARTIAL + "*"):  # of a killed writer
            shutil.rmtree(stale, ignore_errors=True)
        yield path
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _me() -> dict[str, object]:
    """This process, as its lock file names it."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join(sys.argv) or sys.executable,
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _holder(path: Path) -> dict[str, object]:
    """What the lock file at ``path`` says of its holder (empty if unreadable)."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):  # e.g. not written yet
        return {}
    return holder if isinstance(holder, dict) else {}


def is_empty(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds nothing but a lock file and the temporary
    folders of a writer (it must exist)."""
    return not any(
        p.name != LOCK_FILE and not p.name.startswith(_PARTIAL)
        for p in Path(folder).iterdir()
    )


def write_set(
    folder: str | os.PathLike[str],
    write: Callable[[Path], Sequence[Path]],
    *,
    last: str | None = None,
) -> tuple[Path, ...]:
    """Write a set of files into ``folder`` all at once, or not at all.

    ``write(staging)`` writes the files into ``staging``, a temporary folder
    inside ``folder``, and returns their paths. Once it returns, every file is
    flushed to disk and renamed into ``folder``, replacing a file of the same
    name; files of ``folder`` the set does not hold stay. If ``write`` raises,
    ``folder`` is left as it was. Either way the temporary folder is removed.
    Call it while holding :func:`folder_lock`.

    Args:
        folder: The existing output folder.
        write: Writes the set into the folder it is given; returns the paths.
        last: The name of a file renamed after all others (e.g. a summary whose
            presence tells a reader that the set is complete).

    Returns:
        The paths of the written files in ``folder``, in ``write``'s order.
    """
    folder = Path(folder)
    staging = Path(tempfile.mkdtemp(prefix=_PARTIAL, dir=folder))
    try:
        written = [Path(p).relative_to(staging) for p in write(staging)]
        entries = sorted(staging.iterdir(), key=lambda p: p.name == last)
        for entry in entries:
            _fsync(entry)
        fsync_directory(staging)
        for entry in entries:
            os.replace(entry, folder / entry.name)
        fsync_directory(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tuple(folder / p for p in written)


def _fsync(path: Path) -> None:
    """Flush a file (or each file of a folder) to disk."""
    if path.is_dir():
        for inner in path.iterdir():
            _fsync(inner)
        return
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the platform allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. directories cannot be opened on Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
