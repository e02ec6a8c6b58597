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

Files we create or append to in an output folder never follow a symbolic link: an output folder may have been
made (or unpacked) by someone else, and a planted ``.llmgym.lock`` or ``episodes.jsonl`` link would otherwise
make us truncate or append to any file the user can write. Appends and the lock open their file with
``O_NOFOLLOW`` and refuse anything but a regular file with one link (:func:`open_regular`); whole files and
folders are replaced by a rename, which replaces a link itself, never its target.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

try:  # POSIX only; elsewhere the output lock is a no-op
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".llmgym.lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UnsafeOutputError(OSError):
    """An output file that is a symbolic link, not a regular file, or has other hard links: writing it could
    change a file elsewhere, so it is refused."""


def _refuse(path: Path, why: str) -> UnsafeOutputError:
    return UnsafeOutputError(
        errno.EPERM,
        f"refusing to write through {why} (move it away; llm-gym never follows links here)",
        str(path),
    )


def check_regular(path: str | os.PathLike) -> bool:
    """Whether ``path`` exists as a regular file; raises :class:`UnsafeOutputError` when something else is there
    (a symbolic link, even a dangling one, a folder, a FIFO or device, a file with other hard links), without
    following a link."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "something that is not a regular file")
    if st.st_nlink > 1:
        raise _refuse(path, f"a file with {st.st_nlink} hard links")
    return True


def open_regular(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """``os.open`` for a file we write in an output folder: never follows a symbolic link in the last path
    component (``O_NOFOLLOW``), never blocks on a FIFO, and refuses anything but a regular file with a single
    link (:class:`UnsafeOutputError`). Returns the descriptor."""
    path = Path(path)
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as e:
        if e.errno == errno.ELOOP or (_NOFOLLOW == 0 and os.path.islink(path)):
            raise _refuse(path, "a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, "something that is not a regular file")
        if st.st_nlink > 1:
            raise _refuse(path, f"a file with {st.st_nlink} hard links")
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


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


def _named(e: OSError, path: Path, tmp: Path | None = None) -> OSError:
    """``e`` naming ``path`` when it names no file (a failed ``write`` says only "No space left on device") or
    names our temporary file ``tmp`` (the user never chose that name)."""
    if e.errno is None or (
        e.filename is not None and (tmp is None or os.fspath(e.filename) != os.fspath(tmp))
    ):
        return e
    try:
        return type(e)(e.errno, e.strerror, str(path))
    except TypeError:  # pragma: no cover - an OSError subclass with another signature
        return e


@contextlib.contextmanager
def _undo_on_error(path: Path, undo: Callable[[], object], tmp: Path | None = None) -> Iterator[None]:
    """Run ``undo`` (its own ``OSError`` ignored) if the block raises, then re-raise; an ``OSError`` is re-raised
    naming ``path`` (see :func:`_named`), anything else (``KeyboardInterrupt`` included) as it is."""
    try:
        yield
    except OSError as e:
        with contextlib.suppress(OSError):
            undo()
        raise _named(e, path, tmp) from None
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
    with _undo_on_error(path, lambda: os.unlink(tmp), tmp):
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
    with _undo_on_error(path, lambda: shutil.rmtree(tmp, ignore_errors=True), tmp):
        yield tmp
        replace_dir(tmp, path)


def remove_path(path: str | os.PathLike) -> None:
    """Remove ``path``: a folder with its contents, a file, or a symbolic link itself (never what it points to)."""
    import shutil

    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        shutil.rmtree(path)


def replace_dir(src: str | os.PathLike, path: str | os.PathLike) -> None:
    """Put the complete folder ``src`` in place of ``path`` (same file system) by renames: whatever was at
    ``path`` (a folder, a file, a symbolic link: the link itself) is moved aside first and removed after the
    swap. A crash between the two renames leaves a hidden ``.NAME.old-*`` next to ``path``, never a partial
    ``path``."""
    src, path = Path(src), Path(path)
    for p in src.rglob("*"):  # durable before the rename makes the folder visible as complete
        if p.is_symlink():
            continue
        if p.is_file():
            fsync_file(p)
        elif p.is_dir():
            fsync_dir(p)
    fsync_dir(src)
    old = path.with_name(f".{path.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    moved = False
    if path.is_symlink() or path.exists():
        os.replace(path, old)
        moved = True
    os.replace(src, path)
    if moved:
        with contextlib.suppress(OSError):
            remove_path(old)
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


def _append_file(path: Path) -> IO[bytes]:
    return os.fdopen(open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT), "ab+")


def append_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> None:
    """Append ``text`` to ``path`` (created with its parent folders if missing). If the write fails (a full
    disk), the file is cut back to its previous size before the error is raised: an error never leaves a
    torn line. A file whose last byte is not a newline (a complete last line written without one) gets one
    first, so the appended text never joins the previous line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode(encoding)
    created = not check_regular(path)
    with _append_file(path) as f:
        start = f.seek(0, os.SEEK_END)
        if start > 0 and data and not data.startswith(b"\n"):
            f.seek(start - 1)
            if f.read(1) != b"\n":
                data = b"\n" + data
            f.seek(0, os.SEEK_END)

        def undo() -> None:
            f.truncate(start)
            if created and start == 0:  # a file this call created holds nothing: leave none behind
                os.unlink(path)

        with _undo_on_error(path, undo):
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
        # never through a link: a planted .llmgym.lock -> ~/file would be truncated below
        fd = open_regular(self.path, os.O_RDWR | os.O_CREAT)
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
