"""The opt-in ``math-verify`` checker (Hugging Face's ``math_verify`` package) behind a time-limited worker.

``math_verify`` parses LaTeX into sympy and compares symbolically. Its own timeouts use ``signal.alarm``, which
only works on a process's main thread, and sympy can take unbounded time and memory on hostile input (``9^9^9``,
deeply nested fractions). So checks run in one persistent worker process: the answer is capped in length
first, the worker's address space is capped, and a check that misses its deadline gets the worker killed (it
is restarted on the next call) and counts as *not equivalent*. Nothing is ever executed from the answer.

Install with ``pip install "llm-gym[math]"``.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from typing import Any

#: Answers (and gold answers) longer than this are rejected before they reach sympy.
MAX_CHARS = 1000
#: Seconds one check may take (after the worker has started).
DEFAULT_TIMEOUT = 5.0
#: Seconds the worker may take to start (spawn + importing sympy and math_verify).
STARTUP_TIMEOUT = 120.0
#: Address-space cap of the worker process (bytes), where the OS supports it.
MEMORY_LIMIT = 4 * 1024**3

_INSTALL_HINT = 'checker="math-verify" needs the math-verify package: pip install "llm-gym[math]"'


def require_math_verify() -> None:
    """Raise ``ImportError`` with the install hint when ``math_verify`` is missing."""
    import importlib.util

    if importlib.util.find_spec("math_verify") is None:
        raise ImportError(_INSTALL_HINT)


def _wrap(text: str) -> str:
    # math_verify extracts LaTeX from $...$ or \boxed{}; bare answers ("\sqrt{2}", "(1, 2)") need the delimiters.
    if "$" in text or "\\boxed" in text:
        return text
    return f"${text}$"


def _verify(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    # Inside the worker these run on its main thread, so math_verify's own signal timeouts work as well.
    g = parse(_wrap(gold), parsing_timeout=3)
    p = parse(_wrap(pred), parsing_timeout=3)
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=3))


def _worker(conn, memory_limit: int | None) -> None:  # pragma: no cover (runs in the child process)
    if memory_limit:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
        except (ImportError, ValueError, OSError):
            pass
    try:
        import math_verify  # noqa: F401
    except ImportError as e:
        conn.send(("error", str(e)))
        return
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        gold, pred = job
        try:
            conn.send(("ok", _verify(gold, pred)))
        except MemoryError:
            conn.send(("ok", False))
        except Exception:  # noqa: BLE001 (any parser failure means "not shown equivalent")
            conn.send(("ok", False))


class MathVerifyWorker:
    """A persistent checker process; :meth:`check` is thread-safe and never takes longer than its deadline
    (plus the worker's start-up on first use or after a kill)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, memory_limit: int | None = MEMORY_LIMIT):
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.timeout = float(timeout)
        self.memory_limit = memory_limit
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        #: Checks that missed the deadline (the worker was killed each time).
        self.timeouts = 0

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # never fork a process that may hold torch / CUDA threads
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, self.memory_limit), daemon=True)
        proc.start()
        child.close()
        if not parent.poll(STARTUP_TIMEOUT):
            proc.kill()
            proc.join()
            raise RuntimeError(f"the math-verify worker did not start within {STARTUP_TIMEOUT:g} s")
        kind, detail = parent.recv()
        if kind != "ready":
            proc.join()
            raise ImportError(f"{_INSTALL_HINT} ({detail})")
        self._proc, self._conn = proc, parent

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def check(self, pred: str, gold: str) -> bool:
        """Whether ``math_verify`` shows ``pred`` equal to ``gold``; ``False`` on timeout, crash or overlong input."""
        if not isinstance(pred, str) or not isinstance(gold, str):
            return False
        if len(pred) > MAX_CHARS or len(gold) > MAX_CHARS or not pred.strip() or not gold.strip():
            return False
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._kill()
                self._start()
            try:
                self._conn.send((gold, pred))
                if self._conn.poll(self.timeout):
                    kind, value = self._conn.recv()
                    return kind == "ok" and bool(value)
            except (EOFError, OSError, BrokenPipeError):
                self._kill()  # the worker died (e.g. hit its memory cap): restart next time
                return False
            self.timeouts += 1
            self._kill()
            return False

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.send(None)
                except (OSError, BrokenPipeError):
                    pass
            self._kill()


_shared: MathVerifyWorker | None = None
_shared_lock = threading.Lock()


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
