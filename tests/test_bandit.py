import gymnasium as gym
import numpy as np
import pytest

import llm_gym  # noqa: F401
from llm_gym.envs.bandit.env import TEST_PAIRS, TRAIN_PAIRS


def answer(name: str) -> str:
    return f"<think>hmm</think><answer>{name}</answer>"


def test_payoffs_and_success():
    env = gym.make("llmgym/Bandit-v0")
    highs, lows = [], []
    for seed in range(400):
        _, info = env.reset(seed=seed)
        high = info["high_risk_arm"]
        low = [a for a in info["arms"] if a != high][0]
        if seed % 2:
            obs, r, term, trunc, info = env.step(answer(high.upper()))
            highs.append(r)
            assert info["success"] and term and not trunc and obs.startswith(high)
        else:
            _, r, term, _, info = env.step(answer(f" {low}. "))
            lows.append(r)
            assert not info["success"] and term
    assert set(lows) == {0.1}
    assert set(highs) <= {0.0, 1.0} and 0.15 < np.mean(highs) < 0.35


def test_arm_order_is_randomised_and_pairs_come_from_the_split():
    env = gym.make("llmgym/Bandit-v0")
    firsts = set()
    for seed in range(40):
        _, info = env.reset(seed=seed)
        pair = tuple(sorted(info["arms"]))
        assert pair in {tuple(sorted(p)) for p in TRAIN_PAIRS}
        firsts.add(info["arms"][0] == info["high_risk_arm"])
    assert firsts == {True, False}
    held = gym.make("llmgym/BanditHeldOut-v0")
    _, info = held.reset(seed=0)
    assert tuple(sorted(info["arms"])) in {tuple(sorted(p)) for p in TEST_PAIRS}


def test_invalid_answer_costs_penalty_and_ends_single_turn_episode():
    env = gym.make("llmgym/Bandit-v0")
    obs, _ = env.reset(seed=0)
    obs2, r, term, trunc, info = env.step(answer("Dragon"))
    assert obs2 == obs and r == pytest.approx(-0.1) and term and not trunc and not info["success"]


def test_reward_overrides_and_custom_pairs():
    env = gym.make(
        "llmgym/Bandit-v0", rewards={"low_risk": 0.15}, arm_pairs=[("Phoenix", "Dragon")], max_turns=2
    )
    env.reset(seed=0)
    _, r, term, _, _ = env.step("junk")
    assert r == pytest.approx(-0.1) and not term  # a second answer is allowed
    assert env.step(answer("phoenix"))[1] == 0.15


def test_card_for_renderer():
    env = gym.make("llmgym/Bandit-v0").unwrapped
    env.reset(seed=1)
    assert env.card()["verdict"] == "" and env.card()["answer"] == ""
    env.step(answer(env.high_arm))
    card = env.card()
    assert card["answer"] == env.high_arm and "high-risk" in card["verdict"]


@pytest.mark.parametrize("kwargs", [{"split": "val"}, {"arm_pairs": [("A", "a")]}, {"high_risk_prob": 1.5}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        gym.make("llmgym/Bandit-v0", **kwargs)


def test_custom_names_stay_inside_the_observation_space():
    env = gym.make("llmgym/Bandit-v0", arm_pairs=[("Sûr", "Risqué" * 500)]).unwrapped
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space
    obs, *_ = env.step(answer("sûr"))
    assert obs in env.observation_space
