"""OpenEnv's own validator against ``llmgym serve``, family by family: ``python -m llm_gym.serve.validate``.

``openenv validate`` has two forms (``openenv/cli/commands/validate.py``):

* ``openenv validate URL``: the running-server probe, no levels: ``GET /openapi.json`` (a version), ``/health``
  (``healthy``), ``/metadata`` (name, description), ``/schema`` (action, observation, state), ``POST /mcp``
  (JSON-RPC 2.0) and the simulation routes (``/reset``, ``/step``, ``/state``). Run here as that command against a
  ``llmgym serve`` of the family's ids.
* ``openenv validate DIR --level static|runtime|semantic``: RFC 008's graders on a package folder (its
  ``openenv.yaml``, :func:`llm_gym.serve.manifest.write_package`). ``static``: the manifest against the severity
  policy's bounds. ``runtime`` and ``semantic`` need a provider that starts the subject; the
  command's only one is Docker (an image built from the folder), so this module passes OpenEnv's
  ``run_validation`` (what the command calls) a provider of its own, :class:`ServeProvider`, whose subject is ``llmgym serve`` in a
  subprocess. OpenEnv's collector then plays the package's runtime plan over ``/ws`` and its graders judge the
  raw wire exchanges.

Checks that OpenEnv 0.10 lists but does not implement are SKIPs ("grader not implemented in this build"), and a
SKIP makes the verdict WARN (exit 0); so do ``runtime.network_policy`` (it needs a provider that measures the
subject's network namespace, which a plain process has not) and every ``semantic.*`` check. The docs page
``docs/serving.md`` ("OpenEnv's validator") records the verdicts.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from llm_gym.registration import env_family

#: The levels run, in order: the URL probe, then the package levels.
LEVELS = ("url", "static", "runtime", "semantic")
#: ``llmgym`` as its console script runs it (also where the ``llmgym`` script is not on PATH).
LLMGYM = [sys.executable, "-c", "import sys; from llm_gym.cli import main; sys.exit(main())"]
OPENENV = [sys.executable, "-m", "openenv.cli"]
#: Bound on one ``openenv validate`` command, and on a server's start.
COMMAND_TIMEOUT_S = 300.0
START_TIMEOUT_S = 120.0


def served_families() -> dict[str, list[str]]:
    """Family -> the ids ``llmgym serve`` serves by default (ids whose default data is a hub data set left out)."""
    from llm_gym.serve.config import default_env_ids

    out: dict[str, list[str]] = {}
    for env_id in default_env_ids({})[0]:
        out.setdefault(env_family(env_id), []).append(env_id)
    return out


# ------------------------------------------------------------------------------------------------ server
class ServedProcess:
    """``llmgym serve --env ID... --port 0`` in a subprocess: its URL, bounded start, bounded stop."""

    def __init__(self, env_ids: Sequence[str], timeout_s: float = START_TIMEOUT_S):
        cmd = [*LLMGYM, "serve", "--port", "0"]
        for env_id in env_ids:
            cmd += ["--env", env_id]
        self.argv = cmd
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ}
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = self._wait_url(timeout_s)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def _wait_url(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self._log.append(line)
            m = re.search(r" on (http://\S+)", line)
            if m:
                return m.group(1)
        self.stop()
        raise RuntimeError(f"llmgym serve did not start: {''.join(self._log)[-2000:]}")

    def logs(self, max_bytes: int = 65536) -> str:
        while True:
            try:
                self._log.append(self._lines.get_nowait())
            except queue.Empty:
                break
        return "".join(self._log)[-max_bytes:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


@contextlib.contextmanager
def served(env_ids: Sequence[str]) -> Iterator[ServedProcess]:
    server = ServedProcess(env_ids)
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- provider
class _Subject:
    """OpenEnv's ``RunningSubject`` for a :class:`ServedProcess`."""

    def __init__(self, server: ServedProcess):
        self.server = server
        self.base_url = server.url

    def inspect(self) -> dict:
        return {"kind": "process", "pid": self.server.proc.pid, "argv": self.server.argv[3:]}

    def logs(self, max_bytes: int = 65536) -> str:
        return self.server.logs(max_bytes)

    def exec(self, argv: list[str], timeout_s: float):
        from openenv.validation.providers import UnsupportedCapability

        raise UnsupportedCapability("a llmgym serve process has no sandbox to exec in")

    def stop(self) -> None:
        self.server.stop()


class ServeProvider:
    """OpenEnv's ``ValidationProvider`` whose subject is the installed ``llmgym serve`` for ``env_id``.

    ``build`` builds nothing: the subject is this package as installed, named by a digest of the id, the llm-gym
    version and the package's ``openenv.yaml``. It declares ``image_build`` because OpenEnv's runner asks for it
    before any start, and nothing else: no ``network_policy`` (``runtime.network_policy`` SKIPs), no ``exec``.
    """

    name = "llmgym-serve-process"
    supported_network_modes = frozenset({"public"})

    def __init__(self, env_id: str):
        from openenv.validation import ProviderCapability

        self.env_id = env_id
        self.capabilities = frozenset({ProviderCapability.IMAGE_BUILD})

    def build(self, root: Path, execution: Any) -> str:
        from llm_gym.serve.manifest import llm_gym_version

        digest = hashlib.sha256()
        for part in (
            self.env_id,
            llm_gym_version(),
            (Path(root) / "openenv.yaml").read_text(encoding="utf-8"),
        ):
            digest.update(part.encode() + b"\0")
        return "sha256:" + digest.hexdigest()

    def start(self, spec: Any) -> _Subject:
        from openenv.validation.providers import StartupError

        try:
            # at least START_TIMEOUT_S: OpenEnv's 30 s default is short for a Python start on a loaded machine
            return _Subject(
                ServedProcess([self.env_id], timeout_s=max(spec.startup_timeout_s, START_TIMEOUT_S))
            )
        except RuntimeError as e:
            raise StartupError(str(e)[:4096]) from None


# ------------------------------------------------------------------------------------------------ levels
def _openenv_json(args: Sequence[str]) -> dict[str, Any]:
    """Run ``openenv validate ARGS --json`` and read its report (exit 0 pass/warn, 1 fail)."""
    out = subprocess.run(
        [*OPENENV, "validate", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        env={**os.environ, "NO_COLOR": "1"},
    )
    if out.returncode not in (0, 1):
        raise RuntimeError(f"openenv validate {' '.join(args)} exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout[out.stdout.index("{") :])


def url_level(env_ids: Sequence[str]) -> dict[str, Any]:
    """``openenv validate URL`` against ``llmgym serve --env ENV_IDS``: ``{"verdict", "checks"}``."""
    with served(env_ids) as server:
        report = _openenv_json([server.url])
    checks = {c["id"]: "pass" if c["passed"] else "fail" for c in report["criteria"]}
    return {"verdict": "pass" if report["passed"] else "fail", "checks": checks}


def package_levels(env_id: str, root: Path, levels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The package levels in ``levels`` for ``env_id`` (package folder ``root``): ``{level: {"verdict",
    "checks"}}``, ``checks`` mapping a check id to ``pass`` / ``fail`` / ``skip: reason`` / ``error: reason``.

    One ``run_validation`` at the highest level asked for (one server start); each lower level's verdict is the
    severity policy applied to the checks of that level and below, as a run with that ceiling gives it (OpenEnv's
    default policy: v1 for ``static``, v2 above)."""
    from openenv.validation import Lane, Level, apply_policy, load_policy, run_validation

    ceilings = {"static": Level.STATIC, "runtime": Level.RUNTIME, "semantic": Level.SEMANTIC}
    top = max(ceilings[lv] for lv in levels)
    provider = ServeProvider(env_id) if top > Level.STATIC else None
    report = run_validation(root, max_level=top, provider=provider)
    out = {}
    entries = load_policy("v2").entries_for_lane(Lane.LOCAL)  # v2 lists every local check id with its level
    for level in levels:
        policy = load_policy("v1" if level == "static" else "v2")
        results = [r for r in report.results if entries[r.check_id].level <= ceilings[level]]
        checks = {}
        for r in results:
            status = r.status.value
            checks[r.check_id] = status if status == "pass" else f"{status}: {'; '.join(r.evidence)[:160]}"
        out[level] = {"verdict": apply_policy(results, policy, Lane.LOCAL).value, "checks": checks}
    return out


def validate_family(env_ids: Sequence[str], levels: Sequence[str] = LEVELS) -> dict[str, dict[str, Any]]:
    """Every level in ``levels`` for one family: the URL probe on a server of all ``env_ids``, the package levels
    on the first id's package. ``{level: {"verdict", "checks", "env_id"}}``."""
    from llm_gym.serve.manifest import write_package

    out: dict[str, dict[str, Any]] = {}
    if "url" in levels:
        out["url"] = {"env_id": ", ".join(env_ids), **url_level(env_ids)}
    package = [lv for lv in levels if lv != "url"]
    if package:
        with tempfile.TemporaryDirectory(prefix="llmgym-openenv-") as tmp:
            root = write_package(Path(tmp) / "package", env_ids[0])
            for level, res in package_levels(env_ids[0], root, package).items():
                out[level] = {"env_id": env_ids[0], **res}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llm_gym.serve.validate",
        description="Run OpenEnv's validator (openenv validate) against llmgym serve, family by family.",
    )
    parser.add_argument(
        "--family", action="append", help="only these families (repeatable; default: all served)"
    )
    parser.add_argument("--level", action="append", choices=LEVELS, help="only these levels (default: all)")
    parser.add_argument("--json", action="store_true", help="print the verdicts and checks as JSON")
    parser.add_argument(
        "--write_package",
        metavar="DIR",
        help="only write the package folder of --env to DIR (for `openenv validate DIR --level static`)",
    )
    parser.add_argument("--env", help="the id of --write_package (a name such as Sokoban, or a full id)")
    args = parser.parse_args(argv)
    if args.write_package:
        from llm_gym.registration import resolve_env_id
        from llm_gym.serve.manifest import write_package

        if not args.env:
            parser.error("--write_package needs --env")
        print(write_package(args.write_package, resolve_env_id(args.env)))
        return 0
    families = served_families()
    unknown = sorted(set(args.family or ()) - set(families))
    if unknown:
        parser.error(f"unknown or unserved families {unknown}; served: {sorted(families)}")
    chosen = {f: families[f] for f in (args.family or families)}
    results = {f: validate_family(ids, args.level or LEVELS) for f, ids in chosen.items()}
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for family, levels in results.items():
            for level, res in levels.items():
                print(f"{family:11s} {level:9s} {res['verdict'].upper():5s} ({res['env_id']})")
                for check, status in res["checks"].items():
                    if status != "pass":
                        print(f"    {check}: {status}")
    worst = {res["verdict"] for levels in results.values() for res in levels.values()}
    return 1 if "fail" in worst else 0


if __name__ == "__main__":
    sys.exit(main())
