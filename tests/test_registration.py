import subprocess
import sys

import gymnasium as gym
import pytest

import llm_gym


def test_every_table_id_is_registered():
    ids = llm_gym.list_envs()
    assert len(ids) == len(set(ids))
    for env_id in ids:
        assert env_id.startswith("llmgym/") and env_id in gym.registry


def test_registration_happens_on_import_in_a_fresh_process():
    code = "import gymnasium as gym, llm_gym; print(gym.make('llmgym/FrozenLake-v0').reset(seed=0)[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "P" in out.stdout or "√" in out.stdout


def test_unknown_id_is_a_clear_error():
    with pytest.raises(gym.error.Error, match="FrozenLak"):
        gym.make("llmgym/FrozenLak-v0")


def test_variant_by_kwargs_matches_variant_by_id():
    a = gym.make("llmgym/FrozenLakeDeterministic-v0")
    b = gym.make("llmgym/FrozenLake-v0", success_rate=1.0)
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]
    assert a.unwrapped.success_rate == b.unwrapped.success_rate == 1.0


def test_torch_is_not_imported():
    code = "import sys, gymnasium as gym, llm_gym; gym.make('llmgym/Bandit-v0').reset(seed=0); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_env_error_is_short_and_leads_with_the_suggestion():
    from llm_gym.registration import resolve_env_id

    with pytest.raises(ValueError) as info:
        resolve_env_id("Sokobn")
    text = str(info.value)
    assert text.startswith("unknown environment 'Sokobn' (did you mean 'Sokoban'")
    assert len(text) < 300 and "llmgym/" not in text  # one name per family, not all 24 ids twice
    for family in ("FrozenLake", "Bandit", "Sokoban", "Countdown", "MetaMathQA"):
        assert family in text
