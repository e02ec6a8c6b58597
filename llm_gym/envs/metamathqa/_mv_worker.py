"""The math-verify check process: ``python -m llm_gym.envs.metamathqa._mv_worker [MEMORY_LIMIT]``.

Started by :class:`llm_gym.envs.metamathqa.math_verify_checker.MathVerifyWorker` with ``subprocess.Popen``
(not ``multiprocessing``): a plain child process works inside daemonic processes (Gymnasium's
``AsyncVectorEnv`` workers), after ``os.fork()`` and in scripts without a ``__main__`` guard, because it never
re-imports the parent's ``__main__``.

Protocol on stdin/stdout: each message is a 4-byte big-endian length and that many bytes of UTF-8 JSON.
The worker first sends ``["ready", null]`` (or ``["error", "..."]`` when ``math_verify`` is missing), then
answers each ``[gold, pred]`` request with ``["ok", bool]``. EOF on stdin ends it; so does its parent's death.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time
from typing import Any

HEADER = struct.Struct(">I")
#: Largest message either side accepts (requests are capped far below this by the parent).
MAX_MESSAGE = 1 << 20


def encode(obj: Any) -> bytes:
    data = json.dumps(obj).encode("utf-8")
    return HEADER.pack(len(data)) + data


def _wrap(text: str) -> str:
    # math_verify extracts LaTeX from $...$ or \boxed{}; bare answers ("\sqrt{2}", "(1, 2)") need the delimiters.
    if "$" in text or "\\boxed" in text:
        return text
    return f"${text}$"


def verify_pair(gold: str, pred: str) -> bool:
    """``math_verify``'s verdict, unguarded: it runs only here, inside the worker process."""
    from math_verify import parse, verify

    # Inside the worker these run on its main thread, so math_verify's own signal timeouts work as well.
    g = parse(_wrap(gold), parsing_timeout=3)
    p = parse(_wrap(pred), parsing_timeout=3)
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=3))


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _watch_parent(parent: int) -> None:  # pragma: no cover (runs in the worker)
    # A check stuck in sympy never reads stdin, so EOF alone would not end an orphaned worker.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def main(argv: list[str]) -> int:  # pragma: no cover (runs in the worker; tested through MathVerifyWorker)
    memory_limit = int(argv[1]) if len(argv) > 1 else 0
    out_fd = os.dup(1)
    os.dup2(2, 1)  # a library that prints must not corrupt the protocol stream
    if memory_limit > 0:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
        except (ImportError, ValueError, OSError):
            pass
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    try:
        import math_verify  # noqa: F401
    except ImportError as e:
        _write_all(out_fd, encode(["error", str(e)]))
        return 1
    _write_all(out_fd, encode(["ready", None]))
    while True:
        header = _read_exact(0, HEADER.size)
        if header is None:
            return 0
        (size,) = HEADER.unpack(header)
        if size > MAX_MESSAGE:
            return 1
        body = _read_exact(0, size)
        if body is None:
            return 0
        try:
            gold, pred = json.loads(body)
            ok = verify_pair(str(gold), str(pred))
        except (MemoryError, RecursionError):
            ok = False
        except Exception:  # noqa: BLE001 (any parser failure means "not shown equivalent")
            ok = False
        _write_all(out_fd, encode(["ok", bool(ok)]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv))
