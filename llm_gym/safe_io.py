"""Crash-safe output, shared by every llm-gym command (the one place for it).

- :func:`atomic_write` / :func:`atomic_path`: a whole file (JSON, JSONL, PNG, GIF, MP4) is written to a temporary
  file in the target's folder, flushed to disk and renamed over the target. A crash, a full disk or a kill
  leaves either the old file or the new one, never a partial one (``os.replace`` is atomic on POSIX and
  Windows within one file system). :func:`atomic_dir` does the same for a folder (a saved data set).
- :func:`append_text`: appends to a log-like file (episode records); a failed write (full disk) is cut back to
  the file's previous size, so no torn line is left behind by an error (a SIGKILL still can: readers skip a
  torn last line).
- :class:`OutputLock`: an exclusive ``flock`` on ``<folder>/.llmgym.lock`` for a run's lifetime, so two runs
  cannot write one output folder. The kernel drops the lock when the process dies, however it dies, so a
  stale lock file from a killed run never blocks the next one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

try:  # POSIX only; elsewhere the output lock is a no-op
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".llmgym.lock"


def _temp_name(path: Path) -> Path:
    # Same folder (so the rename is atomic), same suffix (writers pick the format from it), hidden, unique.
    return path.with_name(f".{path.stem}.tmp-{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename or a new file in ``folder`` durable (no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _named(e: OSError, path: Path) -> OSError:
    """``e`` naming ``path`` when it names no file (a failed ``write`` says only "No space left on device")."""
    if e.filename is not None or e.errno is None:
        return e
    try:
        return type(e)(e.errno, e.strerror, str(path))
    except TypeError:  # pragma: no cover - an OSError subclass with another signature
        return e


@contextlib.contextmanager
def _undo_on_error(path: Path, undo: Callable[[], object]) -> Iterator[None]:
    """Run ``undo`` (its own ``OSError`` ignored) if the block raises, then re-raise; an ``OSError`` is re-raised
    naming ``path`` (see :func:`_named`), anything else (``KeyboardInterrupt`` included) as it is."""
    try:
        yield
    except OSError as e:
        with contextlib.suppress(OSError):
            undo()
        raise _named(e, path) from None
    except BaseException:
        with contextlib.suppress(OSError):
            undo()
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` for a writer that takes a file name; on success the file is
    synced and renamed onto ``path``; on any error it is removed and ``path`` is left as it was.

    Creates the missing parent folders (an ``OSError`` such as ``NotADirectoryError`` if a parent is a file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path)
    with _undo_on_error(path, lambda: os.unlink(tmp)):
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Like :func:`atomic_path` for a writer that fills a folder (``datasets.save_to_disk``): the new folder
    replaces ``path`` only when complete. A folder cannot be renamed over a non-empty one, so an existing
    ``path`` is first moved aside and removed after the swap; a crash between the two renames leaves it as
    a hidden ``.NAME.old-*`` folder next to ``path``, never a partial ``path``."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path)
    with _undo_on_error(path, lambda: shutil.rmtree(tmp, ignore_errors=True)):
        yield tmp
        old = path.with_name(f".{path.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """``open(path, mode)`` that replaces ``path`` only once everything was written (see :func:`atomic_path`).

    ``mode`` is ``"w"`` (text, ``encoding``) or ``"wb"``."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', got {mode!r}")
    with atomic_path(path) as tmp:
        # O_EXCL: never follow or reuse something already there; 0o666 lets the umask decide as open() does.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        if mode == "wb":
            f: IO[Any] = os.fdopen(fd, "wb")
        else:
            f = os.fdopen(fd, "w", encoding=encoding)
        with f:
            yield f


def atomic_write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> None:
    with atomic_write(path, "w", encoding=encoding) as f:
        f.write(text)


def append_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> None:
    """Append ``text`` to ``path`` (created with its parent folders if missing). If the write fails (a full
    disk), the file is cut back to its previous size before the error is raised: an error never leaves a
    torn line. A file whose last byte is not a newline (a complete last line written without one) gets one
    first, so the appended text never joins the previous line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode(encoding)
    with open(path, "ab+") as f:
        start = f.seek(0, os.SEEK_END)
        if start > 0 and data and not data.startswith(b"\n"):
            f.seek(start - 1)
            if f.read(1) != b"\n":
                data = b"\n" + data
            f.seek(0, os.SEEK_END)
        with _undo_on_error(path, lambda: f.truncate(start)):
            f.write(data)
            f.flush()


class OutputLockedError(RuntimeError):
    """Another process holds the output folder's lock."""


class OutputLock:
    """An exclusive lock on ``folder`` held from :meth:`acquire` (or ``with``) until :meth:`release` or the
    process's end, whichever comes first (``flock`` on ``folder/.llmgym.lock``; the file holds the holder's
    pid, for the error message). Raises :class:`OutputLockedError` naming the other pid when it is taken.

    The lock file is left in place on release: deleting it would let a third process lock a new file while
    a second one still holds the old one.
    """

    def __init__(self, folder: str | os.PathLike, what: str = "run"):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        if self._fd is not None or fcntl is None:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").split()
            os.close(fd)
            pid = f"pid {holder[0]}" if holder and holder[0].isdigit() else "another process"
            raise OutputLockedError(
                f"{self.folder} is in use by another llm-gym {self.what} ({pid}); wait for it to finish or "
                "choose another output folder"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
