"""The environment contract (docs/getting-started.md), checked on every registered id."""

import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llm_gym
from tests._envs import ALL_IDS, make_kwargs


def make_kwargs_ids() -> set[str]:
    return {i for i in ALL_IDS if make_kwargs(i)}


REQUIRED_INFO = {
    "success",
    "action_is_valid",
    "action_is_effective",
    "actions",
    "reward_components",
    "turn",
    "error",
}


#: What Gymnasium's own env suite (``tests/envs/utils.py``'s ``try_make_env``) skips instead of failing on
GYMNASIUM_SKIPS = (ImportError, gym.error.DependencyNotInstalled, gym.error.MissingArgument)


@pytest.mark.parametrize("env_id", sorted(i for i in gym.registry if i.startswith("llmgym/")))
def test_every_registered_id_builds_with_its_defaults_or_says_what_it_needs(env_id):
    """Gymnasium's env suite makes every registered id with no kwargs; an id that cannot must raise one of
    the errors it skips, with a message naming the missing arguments, never a TypeError."""
    try:
        env = gym.make(env_id, disable_env_checker=True)
    except gym.error.MissingArgument as e:
        assert env_id not in llm_gym.list_envs()  # list_envs() lists only ids a user can make offline
        assert "url=" in str(e) and "env_id=" in str(e)
        return
    except GYMNASIUM_SKIPS as e:  # a hub dataset by default: offline it needs the bundled sample
        assert "dataset" in str(e) and env_id in make_kwargs_ids()
        return
    env.reset(seed=0)
    env.close()
    assert env_id in llm_gym.list_envs()


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_check_env_is_clean(env_id):
    env = gym.make(env_id, **make_kwargs(env_id))
    check_env(env.unwrapped)
    env.close()


def _responses(env, n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append("no tags at all")
            continue
        try:
            out.append(env.unwrapped.sample_valid_action(rng))
        except NotImplementedError:
            out.append("<think>guess</think><answer>1 + 2</answer>")
    return out


EPISODE_SCRIPT = """
import json, sys, gymnasium as gym, numpy as np
import llm_gym
from tests._envs import make_kwargs
from tests.test_env_contract import _responses
env_id, seed = sys.argv[1], int(sys.argv[2])
env = gym.make(env_id, **make_kwargs(env_id))
obs, info = env.reset(seed=seed)
trace = [obs, json.dumps(info, sort_keys=True, default=str)]
for response in _responses(env, 6, seed):
    obs, r, term, trunc, info = env.step(response)
    trace += [obs, r, term, trunc, json.dumps(info, sort_keys=True, default=str)]
    if term or trunc:
        break
print(json.dumps(trace))
"""


def _episode_in_subprocess(env_id: str, seed: int, hashseed: str) -> list:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    out = subprocess.run(
        [sys.executable, "-c", EPISODE_SCRIPT, env_id, str(seed)],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(__file__)),
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_same_seed_same_episode_across_processes(env_id):
    a = _episode_in_subprocess(env_id, 11, "1")
    b = _episode_in_subprocess(env_id, 11, "2")
    assert a == b


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_different_seeds_give_different_starts(env_id):
    env = gym.make(env_id, **make_kwargs(env_id))
    starts = {env.reset(seed=s)[0] for s in range(8)}
    assert len(starts) >= 3


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_make_vec_group_has_identical_starts(env_id):
    envs = gym.make_vec(env_id, num_envs=4, vectorization_mode="sync", **make_kwargs(env_id))
    obs, _ = envs.reset(seed=[5] * 4)
    assert len(set(obs)) == 1
    envs.close()


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_info_contract_and_components_sum(env_id):
    env = gym.make(env_id, **make_kwargs(env_id))
    _, info = env.reset(seed=3)
    assert REQUIRED_INFO <= set(info)
    for response in _responses(env, 6, 3):
        _, r, term, trunc, info = env.step(response)
        assert REQUIRED_INFO <= set(info)
        assert set(info["reward_components"]) == set(env.unwrapped.reward_spec.names)
        assert r == pytest.approx(sum(info["reward_components"].values()), abs=1e-12)
        assert not (term and trunc)
        if term or trunc:
            break


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_instructions_describe_the_format(env_id):
    env = gym.make(env_id, **make_kwargs(env_id))
    text = env.unwrapped.instructions
    assert "<answer>" in text and len(text) > 40


@pytest.mark.parametrize("env_id", ALL_IDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.one_of(
        st.text(max_size=200),
        st.lists(
            st.sampled_from(
                ["<think>", "</think>", "<answer>", "</answer>", "||", "Up", "left", "x", " ", "\x00"]
            ),
            max_size=30,
        ).map("".join),
        st.just(""),
        st.just("x" * 20000),
    )
)
def test_any_text_never_raises_and_invalid_keeps_state(env_id, text):
    env = gym.make(env_id, **make_kwargs(env_id))
    before, _ = env.reset(seed=1)
    obs, r, term, trunc, info = env.step(text)
    assert isinstance(obs, str) and isinstance(r, float)
    if not info["action_is_valid"]:
        assert obs == before and info["actions"] == []
        assert r == pytest.approx(env.unwrapped.reward_spec["format_penalty"])
