"""The opt-in ``math-verify`` checker (Hugging Face's ``math_verify`` package) behind a time-limited worker.

``math_verify`` parses LaTeX into sympy and compares symbolically. Its own timeouts use ``signal.alarm``, which
only works on a process's main thread, and sympy can take unbounded time and memory on hostile input (``9^9^9``,
deeply nested fractions). So checks run in one persistent worker process: the answer is capped in length
first, the worker's address space is capped, and a check that misses its deadline gets the worker killed (it
is restarted on the next call) and counts as *not equivalent*. Nothing is ever executed from the answer.

The worker is a plain ``subprocess.Popen`` of ``python -m llm_gym.envs.metamathqa._mv_worker`` speaking
length-prefixed JSON on its stdin/stdout. ``multiprocessing`` would not do: its processes cannot be started
from a daemonic process (Gymnasium's ``AsyncVectorEnv`` workers), a forked child inherits a handle it may not
use, and the spawn start method re-runs an unguarded ``__main__``. Any worker failure (start-up, crash, kill,
garbled reply) makes the answer count as wrong; :meth:`MathVerifyWorker.check` never raises.

Install with ``pip install "llm-gym[math]"``.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from llm_gym.envs.metamathqa._mv_worker import HEADER, MAX_MESSAGE, encode

#: Answers (and gold answers) longer than this are rejected before they reach sympy.
MAX_CHARS = 1000
#: Seconds one check may take (after the worker has started).
DEFAULT_TIMEOUT = 5.0
#: Seconds the worker may take to start (interpreter start + importing sympy and math_verify).
STARTUP_TIMEOUT = 120.0
#: Address-space cap of the worker process (bytes), where the OS supports it.
MEMORY_LIMIT = 4 * 1024**3

WORKER_MODULE = "llm_gym.envs.metamathqa._mv_worker"
_INSTALL_HINT = 'checker="math-verify" needs the math-verify package: pip install "llm-gym[math]"'


def require_math_verify() -> None:
    """Raise ``ImportError`` with the install hint when ``math_verify`` is missing."""
    import importlib.util

    if importlib.util.find_spec("math_verify") is None:
        raise ImportError(_INSTALL_HINT)


class WorkerError(Exception):
    """The worker failed to start, died, or answered out of protocol (counted as a wrong answer)."""


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    chunks = []
    while n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, n)
        if not chunk:
            raise WorkerError("the math-verify worker closed its output")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_message(fd: int, deadline: float) -> Any:
    (size,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    if size > MAX_MESSAGE:
        raise WorkerError(f"the math-verify worker sent a {size}-byte message")
    try:
        return json.loads(_read_exact(fd, size, deadline))
    except ValueError as e:
        raise WorkerError(f"the math-verify worker sent invalid JSON: {e}") from None


class MathVerifyWorker:
    """A persistent checker process; :meth:`check` is thread-safe, never raises and never takes longer than its
    deadline (plus the worker's start-up on first use or after a kill).

    The worker belongs to the process that started it: after ``os.fork()`` the child starts its own on first
    use and leaves the parent's alone.
    """

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        memory_limit: int | None = MEMORY_LIMIT,
        startup_timeout: float = STARTUP_TIMEOUT,
    ):
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if not startup_timeout > 0:
            raise ValueError(f"startup_timeout must be positive, got {startup_timeout!r}")
        self.timeout = float(timeout)
        self.startup_timeout = float(startup_timeout)
        self.memory_limit = memory_limit
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = os.getpid()
        #: Checks that missed the deadline (the worker was killed each time).
        self.timeouts = 0
        #: Checks that failed because the worker could not start, died or broke the protocol.
        self.failures = 0

    def _forget_inherited(self) -> None:
        # A forked child holds copies of the parent's pipes: close the copies (so the parent's worker still
        # sees EOF when the parent lets go) and never signal or wait on a process that is not ours.
        proc, self._proc = self._proc, None
        if proc is not None:
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    try:
                        f.close()  # this process's copy of the descriptor only (unbuffered: nothing to flush)
                    except (OSError, ValueError):
                        pass
            proc.returncode = 0  # so Popen.__del__ does not try to reap the parent's child
        self._lock = threading.Lock()  # the parent's lock may have been held by another thread at fork time
        self._owner = os.getpid()

    def _start(self) -> None:
        cmd = [sys.executable, "-m", WORKER_MODULE, str(int(self.memory_limit or 0))]
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0
            )
        except OSError as e:
            raise WorkerError(f"could not start the math-verify worker: {e}") from None
        self._proc = proc
        assert proc.stdout is not None  # stdout=PIPE
        try:
            reply = _read_message(proc.stdout.fileno(), time.monotonic() + self.startup_timeout)
        except TimeoutError:
            self._kill()
            raise WorkerError(
                f"the math-verify worker did not start within {self.startup_timeout:g} s"
            ) from None
        except WorkerError:
            self._kill()
            raise
        if not (isinstance(reply, list) and reply[:1] == ["ready"]):
            self._kill()
            raise WorkerError(f"{_INSTALL_HINT} ({reply!r:.200})")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.kill()
        except OSError:
            pass
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover (SIGKILL was sent)
            pass

    def _ask(self, gold: str, pred: str) -> bool:
        fresh = self._proc is None or self._proc.poll() is not None
        if fresh:
            self._kill()
            self._start()
        try:
            return self._ask_running(gold, pred)
        except WorkerError:
            if fresh:
                raise
        # A worker that died since the last check (and poll() did not see it yet): one retry on a fresh one.
        self._kill()
        self._start()
        return self._ask_running(gold, pred)

    def _ask_running(self, gold: str, pred: str) -> bool:
        proc = self._proc
        # _ask started it, with both pipes
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            os.write(proc.stdin.fileno(), encode([gold, pred]))  # a few KiB at most: fits the pipe buffer
            reply = _read_message(proc.stdout.fileno(), time.monotonic() + self.timeout)
        except TimeoutError:
            self.timeouts += 1
            self._kill()
            return False
        except OSError as e:
            raise WorkerError(f"the math-verify worker died: {e}") from None
        if not (isinstance(reply, list) and len(reply) == 2 and reply[0] == "ok"):
            raise WorkerError(f"unexpected reply from the math-verify worker: {reply!r:.200}")
        return reply[1] is True

    def check(self, pred: str, gold: str) -> bool:
        """Whether ``math_verify`` shows ``pred`` equal to ``gold``; ``False`` on timeout, crash, failed start-up or
        overlong input."""
        if not isinstance(pred, str) or not isinstance(gold, str):
            return False
        if len(pred) > MAX_CHARS or len(gold) > MAX_CHARS or not pred.strip() or not gold.strip():
            return False
        if self._owner != os.getpid():
            self._forget_inherited()
        with self._lock:
            try:
                return self._ask(gold, pred)
            except WorkerError:
                self.failures += 1
                self._kill()  # restarted on the next call
                return False

    def close(self) -> None:
        if self._owner != os.getpid():
            self._forget_inherited()
            return
        with self._lock:
            self._kill()  # closing stdin would do; the kill also covers a worker stuck in a check

    def __del__(self) -> None:
        try:
            if self._owner == os.getpid():
                self._kill()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


_shared: MathVerifyWorker | None = None
_shared_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()  # may have been held by another thread at fork time


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def shared_worker() -> MathVerifyWorker:
    """The process-wide worker every MetaMathQA env with ``checker="math-verify"`` uses (started lazily)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MathVerifyWorker()
        return _shared


def math_verify_equivalent(pred: str, gold: str) -> bool:
    """``math_verify``'s verdict on ``pred`` vs ``gold`` through the shared time-limited worker."""
    return shared_worker().check(pred, gold)
