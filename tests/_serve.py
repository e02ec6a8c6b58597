"""``llmgym serve`` in a subprocess on 127.0.0.1 for the tests: a free port, bounded waits, always stopped."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0
#: The ``llmgym`` command (through its entry function, as the console script runs it).
LLMGYM = [sys.executable, "-c", "import sys; from llm_gym.cli import main; sys.exit(main())"]


class Server:
    """A running ``llmgym serve`` process and its URL."""

    def __init__(self, proc: subprocess.Popen, url: str, lines: queue.Queue):
        self.proc, self.url, self._lines = proc, url, lines

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def status(self, token: str | None = None) -> dict:
        req = urllib.request.Request(self.url + "/llmgym/status")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=10) as resp:
            return json.loads(resp.read())

    def wait_open_envs(self, n: int, timeout: float = 15.0, token: str | None = None) -> int:
        """Poll ``/llmgym/status`` until ``open_envs == n`` (or the timeout); returns the last count."""
        deadline = time.monotonic() + timeout
        count = -1
        while time.monotonic() < deadline:
            count = self.status(token)["open_envs"]
            if count == n:
                return count
            time.sleep(0.1)
        return count

    def output(self) -> str:
        out = []
        while True:
            try:
                out.append(self._lines.get_nowait())
            except queue.Empty:
                return "".join(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=15)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


def start_server(*args: str, env: dict | None = None, port: int = 0) -> Server:
    """Start ``llmgym serve --port PORT ARGS`` and wait (bounded) for its URL line."""
    cmd = [*LLMGYM, "serve", "--port", str(port), *args]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        m = re.search(r"on (http://[^\s]+)", line)
        if m:
            return Server(proc, m.group(1), lines)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=15)
    raise RuntimeError(f"llmgym serve did not start: {''.join(seen)[-2000:]}")


@contextlib.contextmanager
def running_server(*args: str, env: dict | None = None, port: int = 0) -> Iterator[Server]:
    server = start_server(*args, env=env, port=port)
    try:
        yield server
    finally:
        server.stop()
