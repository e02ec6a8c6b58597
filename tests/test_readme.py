"""README.md stays true to the code: ids, reward tables, commands."""

import re
from pathlib import Path

import gymnasium as gym
import pytest

import llm_gym
from tests._envs import make_kwargs

tomllib = pytest.importorskip("tomllib" if __import__("sys").version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("env_id", llm_gym.list_envs())
def test_every_id_is_in_the_environment_table(env_id):
    assert f"| `{env_id}` |" in README


@pytest.mark.parametrize(
    "env_id",
    [
        "llmgym/FrozenLake-v0",
        "llmgym/Bandit-v0",
        "llmgym/Sokoban-v0",
        "llmgym/Countdown-v0",
        "llmgym/MetaMathQA-v0",
    ],
)
def test_reward_tables_match_the_declared_specs(env_id):
    spec = gym.make(env_id, **make_kwargs(env_id)).unwrapped.reward_spec
    for c in spec.components:
        rows = re.findall(rf"^\| `{re.escape(c.name)}` \| ([^|]+) \|", README, flags=re.M)
        assert rows, f"README has no reward-table row for {c.name!r} of {env_id}"
        assert any(float(r.strip().split()[0]) == pytest.approx(c.value) for r in rows), (c.name, rows)


def test_test_command_is_what_ci_runs():
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh" in ci and "python -m pytest -q" in ci


def test_documented_console_scripts_are_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name in ("llmgym", "llmgym-train", "llmgym-eval", "llmgym-collapse-report"):
        assert name in scripts and f"{name} " in README
