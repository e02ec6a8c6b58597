"""Run Gymnasium's own environment test suite over every registered ``llmgym/`` id.

Gymnasium's ``tests/envs/test_envs.py`` (env checker with no unexpected warning, passive checker, 50-step
determinism, pickling) and ``tests/envs/test_rendering.py`` (every render mode but ``human``) are not in its wheel.
Give a checkout of the Gymnasium version installed here (``git clone https://github.com/Farama-Foundation/Gymnasium``,
then the commit of that version); this script copies those two files unchanged into a temporary folder, with a
``tests/envs/utils.py`` of its own in place of theirs: theirs selects the ids whose entry point is in
``gymnasium.envs``, ours every id under ``llmgym/``, made as theirs makes them (``spec.make()`` with no kwargs,
an id raising ``ImportError``, ``DependencyNotInstalled`` or ``MissingArgument`` skipped with a warning, as theirs
does: ``llmgym/Remote-v0`` needs ``url=``, MetaMathQA's default data is a hub data set). Nothing is vendored.

    OMP_NUM_THREADS=1 python scripts/gymnasium_suite.py --gymnasium_src ~/src/Gymnasium [-- PYTEST ARGS]

``tests/test_gymnasium_suite.py`` runs the same checks per id with Gymnasium's checkers, without the checkout.
Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE_FILES = ("tests/envs/test_envs.py", "tests/envs/test_rendering.py")

UTILS = '''"""Every registered llmgym/ id, made as Gymnasium's own tests/envs/utils.py makes its ids (written by
llm-gym's scripts/gymnasium_suite.py in place of that file)."""

import gymnasium as gym
import llm_gym  # noqa: F401 (registers the ids)
from gymnasium import logger
from gymnasium.envs.registration import EnvSpec

SKIPPED = {}


def try_make_env(env_spec: EnvSpec):
    try:
        return env_spec.make(disable_env_checker=True).unwrapped
    except (ImportError, AttributeError, gym.error.DependencyNotInstalled, gym.error.MissingArgument) as e:
        SKIPPED[env_spec.id] = f"{type(e).__name__}: {e}"
        logger.warn(f"Not testing {env_spec.id} due to error: {e}")
    return None


ids = sorted(i for i in gym.envs.registry if i.startswith("llmgym/"))
all_testing_initialised_envs = [env for env in (try_make_env(gym.spec(i)) for i in ids) if env is not None]
all_testing_env_specs = [env.spec for env in all_testing_initialised_envs]
mujoco_testing_env_specs = []
gym_testing_env_specs = all_testing_env_specs
'''

CONFTEST = """def pytest_terminal_summary(terminalreporter):
    from tests.envs.utils import SKIPPED, ids

    terminalreporter.write_line(f"llmgym ids: {len(ids)}; skipped at make, as Gymnasium's suite skips them:")
    for env_id, why in SKIPPED.items():
        terminalreporter.write_line(f"  {env_id}: {why[:160]}")
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gymnasium_src", required=True, help="a Gymnasium checkout of the installed version")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = ap.parse_args(argv)
    src = Path(args.gymnasium_src)
    missing = [f for f in SUITE_FILES if not (src / f).is_file()]
    if missing:
        print(
            f"gymnasium_suite: {src} has no {', '.join(missing)}: give a Gymnasium checkout", file=sys.stderr
        )
        return 2
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="llmgym_gym_suite_") as tmp:
        envs = Path(tmp, "tests", "envs")
        envs.mkdir(parents=True)
        for f in ("tests/__init__.py", "tests/envs/__init__.py"):
            Path(tmp, f).write_text("")
        for f in SUITE_FILES:
            shutil.copyfile(src / f, Path(tmp, f))
        (envs / "utils.py").write_text(UTILS)
        Path(tmp, "conftest.py").write_text(CONFTEST)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "SDL_VIDEODRIVER": "dummy",
            "SDL_AUDIODRIVER": "dummy",
            "PYTHONPATH": os.pathsep.join([tmp, str(root), os.environ.get("PYTHONPATH", "")]),
        }
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "tests/envs",
            *args.pytest_args,
        ]
        return subprocess.run(cmd, cwd=tmp, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
