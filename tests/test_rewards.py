import math

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401
from llm_gym.core import RewardSpec


def test_overrides_and_errors():
    spec = RewardSpec.of(("goal", 1.0, "g"), ("step", -0.1, "s"))
    assert spec.with_overrides({"goal": 2}).as_dict() == {"goal": 2.0, "step": -0.1}
    with pytest.raises(ValueError, match="valid names: goal, step"):
        spec.with_overrides({"gaol": 1.0})
    for bad in (math.nan, math.inf, "x"):
        with pytest.raises(ValueError, match="goal"):
            spec.with_overrides({"goal": bad})
    with pytest.raises(ValueError, match="duplicate"):
        RewardSpec.of(("a", 1.0, ""), ("a", 2.0, ""))


def test_make_kwargs_override_and_unknown_name():
    env = gym.make("llmgym/FrozenLakeDeterministic-v0", rewards={"goal": 5.0, "format_penalty": -1.0})
    assert env.unwrapped.reward_spec["goal"] == 5.0
    env.reset(seed=0)
    _, r, *_, info = env.step("no tags")
    assert r == -1.0 and info["reward_components"]["format_penalty"] == -1.0
    with pytest.raises(ValueError, match="valid names: goal, hole, step, format_penalty"):
        gym.make("llmgym/FrozenLake-v0", rewards={"bogus": 1.0})


def test_markdown_table_lists_every_component():
    table = gym.make("llmgym/Bandit-v0").unwrapped.reward_spec.markdown_table()
    for name in ("low_risk", "high_risk", "format_penalty"):
        assert f"`{name}`" in table
