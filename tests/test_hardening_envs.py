"""Bounded work on any input: hostile LLM text, env sizes, level and data files (issue 16, items 6, 7, 8, 11, 14)."""

from __future__ import annotations

import json
import time
import tracemalloc

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llm_gym  # noqa: F401
from llm_gym.core.parsing import RESPONSE_MAX_LENGTH, parse_response
from llm_gym.envs.metamathqa.math_check import is_equivalent
from llm_gym.envs.sokoban.level import LEVEL_MAX_SIDE, MAX_LEVELS, load_levels, parse_level, parse_levels
from llm_gym.envs.task_data import clear_cache, load_records

# One id per env class (each parses responses its own way after the shared parser).
ENV_IDS = [
    "llmgym/FrozenLake-v0",
    "llmgym/Sokoban-v0",
    "llmgym/Bandit-v0",
    "llmgym/Countdown-v0",
    "llmgym/MetaMathQASample-v0",
    "llmgym/MetaMathQARetry-v0",
]


@pytest.fixture(scope="module")
def envs():
    out = {}
    for env_id in ENV_IDS:
        kwargs = {"dataset": "sample"} if env_id == "llmgym/MetaMathQARetry-v0" else {}
        env = gym.make(env_id, **kwargs).unwrapped
        out[env_id] = env
    yield out
    for env in out.values():
        env.close()


def _hostile(n: int) -> dict[str, str]:
    """Responses of about ``n`` characters that cost most in the old parser and checkers."""
    return {
        "plain": "x" * n,
        "tags": "<" * n,
        "non_ascii": "é" * n,
        "pipes_in_answer": "<think>a</think><answer>" + "|" * n + "</answer>",
        "long_answer": "<think>a</think><answer>" + "1 " * (n // 2) + "</answer>",
        "long_think": "<think>" + "a" * n + "</think><answer>Left</answer>",
    }


def _cost(env, text: str) -> tuple[float, int]:
    env.reset(seed=0)
    tracemalloc.start()
    start = time.perf_counter()
    out = env.step(text)
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert isinstance(out[0], str) and out[4]["action_is_valid"] in (True, False)
    return elapsed, peak


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_huge_response_costs_bounded_time_and_memory(envs, env_id):
    # 20 MB of each kind (the 100 MB behaves the same: text over the cap is refused from its length).
    for kind, text in _hostile(20_000_000).items():
        elapsed, peak = _cost(envs[env_id], text)
        assert elapsed < 0.5, (kind, elapsed)
        assert peak < 50 * 2**20, (kind, peak)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_response_at_the_cap_costs_bounded_time_and_memory(envs, env_id):
    for kind, text in _hostile(RESPONSE_MAX_LENGTH - 64).items():
        assert len(text) <= RESPONSE_MAX_LENGTH
        elapsed, peak = _cost(envs[env_id], text)
        assert elapsed < 0.5, (kind, elapsed)
        assert peak < 50 * 2**20, (kind, peak)


def test_over_long_response_is_a_format_error():
    parsed = parse_response("<think>a</think><answer>Up</answer>" + " " * RESPONSE_MAX_LENGTH)
    assert not parsed.ok and "longer than" in parsed.error
    assert parse_response("<THINK>a</Think><ANSWER>Up</answer>").actions == ("Up",)
    # ASCII-only case folding: the Kelvin sign is not a k
    assert not parse_response("<thin\u212a>a</think><answer>Up</answer>").ok


def test_math_check_caps_before_normalising(monkeypatch):
    # The work is measured (the length of every text the normalisers see), not timed: a wall-clock bound failed
    # on a loaded machine. Without the cap they saw all 50,000,002 characters (seconds and gigabytes).
    from llm_gym.envs.metamathqa import math_check

    seen: list[int] = []
    for name in ("normalize_strict", "clean_answer"):
        real = getattr(math_check, name)
        monkeypatch.setattr(math_check, name, lambda text, _real=real: seen.append(len(text)) or _real(text))
    pred = " " * 50_000_000 + "42"
    start = time.perf_counter()
    assert is_equivalent(pred, "42")
    assert not is_equivalent("7" + " " * 50_000_000, "7 ")
    assert seen and max(seen) <= math_check.MAX_INPUT, max(seen)
    assert time.perf_counter() - start < 30  # a hang guard only


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=300), env_index=st.integers(0, len(ENV_IDS) - 1))
def test_any_text_never_raises_in_step(envs, text, env_index):
    env = envs[ENV_IDS[env_index]]
    env.reset(seed=1)
    for wrapped in (text, f"<think>{text}</think><answer>{text}</answer>"):
        obs, reward, terminated, truncated, info = env.step(wrapped)
        assert obs in env.observation_space and np.isfinite(reward)
        if terminated or truncated:
            env.reset(seed=1)


# ------------------------------------------------------------------------------- item 8 and 14: arguments
@pytest.mark.parametrize(
    "env_id, kwargs, why",
    [
        ("llmgym/FrozenLake-v0", {"size": 10_000}, "size must be an integer in"),
        ("llmgym/Sokoban-v0", {"dim_room": (3000, 3000)}, "at most 100x100"),
        ("llmgym/Sokoban-v0", {"solver_max_states": 10**12}, "solver_max_states must be"),
        ("llmgym/Countdown-v0", {"number_range": (1, 10**30)}, "number_range must satisfy"),
        ("llmgym/Countdown-v0", {"target_range": (0, 10**30)}, "target_range must satisfy"),
        ("llmgym/Countdown-v0", {"num_count": (3, 50)}, "num_count must satisfy"),
        ("llmgym/Countdown-v0", {"number_range": "19"}, "must be a pair"),
        ("llmgym/Bandit-v0", {"arm_pairs": [("", "b")]}, "non-empty"),
        ("llmgym/Bandit-v0", {"arm_pairs": [("a\nb", "c")]}, "printable"),
        ("llmgym/Bandit-v0", {"arm_pairs": [("a", "b")] * 5000}, "at most 1000"),
        ("llmgym/Bandit-v0", {"arm_pairs": "ab"}, "arm_pairs must be"),
        ("llmgym/FrozenLake-v0", {"think": "false"}, "think must be True or False"),
        ("llmgym/FrozenLake-v0", {"rewards": {"goal": 1e308}}, "finite number in"),
    ],
)
def test_sizes_and_types_are_checked_at_construction(env_id, kwargs, why):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=why):
        gym.make(env_id, **kwargs)
    assert time.perf_counter() - start < 1


@pytest.mark.parametrize(
    "options, why",
    [
        ({"map": None}, "map must be a list"),
        ({"map": "SFFG"}, "map must be a list"),
        ({"map": ["SG"] * 100}, "at most"),
    ],
)
def test_frozen_lake_map_option_is_checked(options, why):
    env = gym.make("llmgym/FrozenLake-v0", size=8)
    with pytest.raises(ValueError, match=why):
        env.reset(seed=0, options=options)
    obs, _ = env.reset(seed=0, options={"map": ["SF", "HG"]})
    assert obs.count("\n") == 1


def test_countdown_options_bounded():
    env = gym.make("llmgym/Countdown-v0")
    with pytest.raises(ValueError, match="nums must be a list of 1 to 64"):
        env.reset(options={"nums": list(range(1000)), "target": 5})
    with pytest.raises(ValueError, match="target must be an integer in"):
        env.reset(options={"nums": [1, 2], "target": 10**40})


# ----------------------------------------------------------------------------------------- item 6: XSB
def test_far_apart_cells_do_not_allocate_the_empty_space():
    text = "#" + " " * 2000 + "#\n" + "\n".join(["#"] * 2003)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=f"at most {LEVEL_MAX_SIDE}x{LEVEL_MAX_SIDE}"):
        parse_level(text)
    assert time.perf_counter() - start < 0.5


def test_level_count_is_bounded():
    one = "#####\n#@$.#\n#####\n\n"
    start = time.perf_counter()
    with pytest.raises(ValueError, match=f"more than {MAX_LEVELS} levels"):
        parse_levels(one * (MAX_LEVELS + 1))
    assert time.perf_counter() - start < 5


def test_indentation_is_cropped_and_columns_in_errors_stay_true():
    level = parse_level("      #####\n      #@$.#\n      #####")
    assert (level.height, level.width, level.player) == (3, 5, (1, 1))
    with pytest.raises(ValueError, match="line 2, column 9: unknown character"):
        parse_level("      #####\n      #@x.#\n      #####")


def test_level_file_reads_are_bounded(tmp_path):
    start = time.perf_counter()
    with pytest.raises(ValueError, match="larger than"):
        load_levels("/dev/zero")
    assert time.perf_counter() - start < 2
    path = tmp_path / "bom.xsb"
    path.write_bytes(b"\xef\xbb\xbf#####\n#@$.#\n#####\n")
    assert load_levels(path)[0].num_boxes == 1
    path.write_bytes(b"#####\n#@$.#\n###\xff#\n")
    with pytest.raises(ValueError, match="bom.xsb.*not valid UTF-8"):
        load_levels(path)


# ----------------------------------------------------------------------------------- items 11, 14: data
ROW = {"query": "What is 1+1?", "response": "It is 2. The answer is: 2", "type": "x"}


def test_data_files_bom_utf8_depth_and_surrogates(tmp_path):
    clear_cache()
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(ROW).encode() + b"\n")
    assert load_records(path, fields=("query",))[0]["query"] == ROW["query"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(ROW).encode() + b'\n{"query": "\xff"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid UTF-8"):
        load_records(bad, fields=("query",))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="deep.json: JSON nested too deeply"):
        load_records(deep, fields=("query",))
    sur = tmp_path / "sur.jsonl"
    sur.write_text(json.dumps({**ROW, "query": "x\ud800y"}) + "\n")  # json.dumps writes the \ud800 escape
    env = gym.make("llmgym/MetaMathQA-v0", dataset=str(sur))
    obs, _ = env.reset(seed=0)
    assert obs == "x\ufffdy"
    obs.encode("utf-8")  # a tokenizer (or any UTF-8 writer) can take it
    clear_cache()


def test_refused_reset_leaves_the_env_as_it_was_and_failed_reset_needs_a_new_one():
    env = gym.make("llmgym/FrozenLakeSlippery-v0").unwrapped
    env.reset(seed=1)
    env.step("<think>.</think><answer>Right</answer>")
    state = env.np_random.bit_generator.state
    turn = env.turns_left
    for bad in ({"dynamics_seed": -1}, {"dynamics_seed": "3"}):
        with pytest.raises(ValueError, match="dynamics_seed"):
            env.reset(seed=5, options=bad)
        # Checked before reseeding: the stream and the episode are untouched and the episode goes on.
        assert env.np_random.bit_generator.state == state and env.turns_left == turn
    env.step("<think>.</think><answer>Down</answer>")
    # A reset that fails while setting up the game leaves no half-reset episode to step.
    sokoban = gym.make("llmgym/Sokoban-v0").unwrapped
    sokoban.reset(seed=0)
    with pytest.raises(ValueError):
        sokoban.reset(seed=1, options={"level": "#####\n#@ .#\n#####"})  # no box
    with pytest.raises(gym.error.ResetNeeded):
        sokoban.step("<think>.</think><answer>Up</answer>")
