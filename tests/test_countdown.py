"""CountdownEnv: generation, answer checking, rewards, data mode, determinism, fuzzing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.envs import task_data
from llm_gym.envs.countdown.arith import Reachable, evaluate
from llm_gym.envs.countdown.env import CountdownEnv, check_answer, generate_puzzle

COUNTDOWN_IDS = ["llmgym/Countdown-v0", "llmgym/Countdown4-v0", "llmgym/CountdownAtMostOnce-v0"]


def answer(text: str, think: bool = True) -> str:
    return f"<think>ok</think><answer>{text}</answer>" if think else f"<answer>{text}</answer>"


@pytest.mark.parametrize("env_id", COUNTDOWN_IDS)
def test_check_env(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped)
    env.close()


def test_spec_and_contract():
    env = CountdownEnv()
    assert env.action_names is None and env.action_sep is None
    assert env.max_actions_per_turn == 1
    assert env.reward_spec.as_dict() == {"correct": 1.0, "format_score": 0.1, "format_penalty": -0.1}
    obs, info = env.reset(seed=3)
    assert obs == f"Target: {env.target}, nums: {env.nums}"
    assert info["solution"] and info["target"] == env.target and info["nums"] == env.nums
    assert env.card() == {"title": "Countdown", "question": obs, "answer": "", "verdict": ""}
    assert "exactly once" in env.instructions and "<answer>" in env.instructions


@pytest.mark.parametrize("allow_unused", [False, True])
def test_reference_solutions_reach_target(allow_unused):
    env = CountdownEnv(allow_unused=allow_unused)
    seeds = range(300) if not allow_unused else range(100)
    for seed in seeds:
        _, info = env.reset(seed=seed)
        assert 3 <= len(env.nums) <= 4 and all(1 <= n <= 99 for n in env.nums)
        assert 10 <= env.target <= 100
        verdict = check_answer(info["solution"], env.nums, env.target, allow_unused)
        assert verdict.kind == "correct", (seed, env.nums, env.target, info["solution"], verdict)


def test_generation_configurable_and_always_ends():
    rng = np.random.default_rng(0)
    nums, target, sol = generate_puzzle(rng, (2, 2), (5, 9), (20, 30))
    assert len(nums) == 2 and all(5 <= n <= 9 for n in nums) and 20 <= target <= 30
    assert evaluate(sol).value == target
    # A range the numbers can never reach is refused before drawing (it used to return a target outside it).
    start = time.perf_counter()
    with pytest.raises(ValueError, match="unreachable"):
        generate_puzzle(rng, (2, 2), (1, 3), (10**6, 10**6 + 1))
    with pytest.raises(ValueError, match="unreachable"):
        CountdownEnv(num_count=(2, 2), number_range=(1, 3), target_range=(10**6, 10**6 + 1))
    with pytest.raises(ValueError, match="unreachable"):  # without "-" nothing is negative
        CountdownEnv(operators="+*", target_range=(-50, -10))
    # Reachable in principle but not hit by any draw within the budget: a ValueError, never an out-of-range target.
    with pytest.raises(ValueError, match="no puzzle with a target in"):
        generate_puzzle(rng, (2, 2), (2, 2), (5, 9))
    assert time.perf_counter() - start < 1.0


def test_reachable_bounds_enclose_every_reachable_value():
    from llm_gym.envs.countdown.env import reachable_bounds

    rng = np.random.default_rng(1)
    for operators in ("+-*/", "+-", "+*/", "*/"):
        for k in (1, 2, 3, 4):
            nums = [int(x) for x in rng.integers(0, 12, size=k)]
            low, high = reachable_bounds((k, k), (0, 11), operators)
            values = Reachable(nums, operators).values(allow_unused=True)
            assert all(low <= v <= high for v in values), (operators, nums)


def test_generation_with_huge_numbers_is_bounded_in_work(monkeypatch):
    # Five numbers up to 10**6 rarely reach 10..100: each draw computes ~34,000 values (~0.3 s). The work budget
    # ends the search after a few draws (it took ~14 s per reset) with a clear error, or finds a puzzle. The work
    # is counted (values computed per draw), not timed: a wall-clock bound failed on a loaded machine.
    import llm_gym.envs.countdown.env as countdown_env

    works: list[int] = []

    class Counted(Reachable):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            works.append(sum(len(t) for t in self.table))

    monkeypatch.setattr(countdown_env, "Reachable", Counted)
    env = CountdownEnv(num_count=(5, 5), number_range=(0, 10**6))
    start = time.perf_counter()
    try:
        env.reset(seed=0)
        assert 10 <= env.target <= 100
    except ValueError as e:
        assert "no puzzle with a target in" in str(e)
    # a new draw starts only while the budget is not spent: every draw but the last fits in it
    assert works and sum(works[:-1]) < countdown_env.GENERATION_WORK_MAX, works
    assert len(works) < 20  # the budget, not max_tries, ended the search (20 draws were ~14 s)
    assert time.perf_counter() - start < 60  # a hang guard only


def test_rewards():
    env = CountdownEnv()
    env.reset(seed=0, options={"nums": [6, 4, 5], "target": 50})
    obs, reward, term, trunc, info = env.step(answer("(6+4)*5"))
    assert (reward, term, trunc, info["success"]) == (1.0, True, False, True)
    assert info["reward_components"]["correct"] == 1.0 and info["answer_error"] is None
    assert obs.splitlines()[1].startswith("Your answer scores 1")
    assert env.card()["verdict"] == "correct"

    env.reset(options={"nums": [6, 4, 5], "target": 50})
    obs, reward, term, trunc, info = env.step(answer("6*4+5"))
    assert (reward, term, trunc, info["success"]) == (0.1, True, False, False)
    assert info["answer_value"] == "29" and "29, not 50" in obs
    assert env.card()["verdict"] == "incorrect (0.1)"

    env.reset(options={"nums": [6, 4, 5], "target": 50})
    _, reward, term, _, info = env.step(answer("(6+4)*5*1"))
    assert (reward, term) == (0.0, True) and "exactly once" in info["answer_error"]

    env.reset(options={"nums": [6, 4, 5], "target": 50})
    _, reward, term, _, info = env.step(answer("(6+4)"))
    assert reward == 0.0 and info["answer_error"]


def test_missing_tags_cost_format_penalty_and_keep_the_puzzle():
    env = CountdownEnv(max_turns=2)
    obs0, _ = env.reset(seed=1)
    obs, reward, term, trunc, info = env.step("(1+2)*3")
    assert (reward, term, trunc, info["action_is_valid"]) == (-0.1, False, False, False)
    assert obs == obs0
    _, reward, term, trunc, _ = env.step("no tags again")
    assert (reward, term, trunc) == (-0.1, False, True)


def test_equals_suffix():
    nums, target = [6, 4, 5], 50
    assert check_answer("(6+4)*5 = 50", nums, target).kind == "correct"
    assert check_answer("(6+4)*5=50", nums, target).kind == "correct"
    # The stated value is ignored: the expression is what counts.
    assert check_answer("6*4+5 = 50", nums, target).kind == "wrong_value"
    assert check_answer("(6+4)*5 = 5*10", nums, target).kind == "invalid"
    assert check_answer("(6+4)*5 = 50 = 50", nums, target).kind == "invalid"
    assert check_answer("50 = (6+4)*5", nums, target).kind == "invalid"


def test_allow_unused():
    nums, target = [6, 4, 5, 7], 50
    assert check_answer("(6+4)*5", nums, target).kind == "invalid"
    assert check_answer("(6+4)*5", nums, target, allow_unused=True).kind == "correct"
    assert check_answer("(6+6)*5", nums, target, allow_unused=True).kind == "invalid"
    env = gym.make("llmgym/CountdownAtMostOnce-v0")
    env.reset(options={"nums": [6, 4, 5, 7], "target": 50})
    assert env.step(answer("(6+4)*5"))[1] == 1.0


@pytest.mark.parametrize(
    "hostile",
    [
        "6**4",
        "6^4",
        "1/0",
        "(6-6)/(4-4)+5",
        "__import__('os').system('echo hi')",
        "6.0*4+5",
        "\u0666*4+5",
        "9" * 5000,
        "(" * 5000 + "6" + ")" * 5000,
        "-" * 5000 + "6",
        "6 * 4 + 5 # comment",
        "six times four",
        "6*4+5\n= 29\n= 30",
    ],
)
def test_hostile_answers_score_zero_fast(hostile):
    env = CountdownEnv()
    env.reset(options={"nums": [6, 4, 5], "target": 50})
    start = time.perf_counter()
    _, reward, term, trunc, info = env.step(answer(hostile))
    assert time.perf_counter() - start < 0.1
    assert (reward, term, trunc) == (0.0, True, False)
    assert info["answer_error"]
    assert env.observation_space.contains(env._observation())


def test_rewards_override():
    env = gym.make("llmgym/Countdown-v0", rewards={"format_score": 0.0, "correct": 2.0})
    env.reset(options={"nums": [6, 4, 5], "target": 50})
    assert env.step(answer("6*4+5"))[1] == 0.0
    env.reset(options={"nums": [6, 4, 5], "target": 50})
    assert env.step(answer("5*(4+6)"))[1] == 2.0


def test_bad_arguments():
    with pytest.raises(ValueError):
        CountdownEnv(num_count=(3, 9))
    with pytest.raises(ValueError):
        CountdownEnv(num_count=(4, 3))
    with pytest.raises(ValueError):
        CountdownEnv(number_range=(-1, 5))
    with pytest.raises(ValueError):
        CountdownEnv(max_actions_per_turn=2)
    env = CountdownEnv()
    with pytest.raises(ValueError):
        env.reset(options={"nums": [1, 2.5], "target": 3})
    with pytest.raises(ValueError):
        env.reset(options={"nums": [1, 2], "target": "3"})


def test_unsolvable_given_puzzle_has_no_solution():
    env = CountdownEnv()
    _, info = env.reset(options={"nums": [1, 1, 1, 1], "target": 24})
    assert info["solution"] is None


def test_episode_over_after_answer():
    env = CountdownEnv()
    env.reset(seed=0)
    env.step(answer("1"))
    _, reward, term, trunc, info = env.step(answer("1"))
    assert reward == 0.0 and term and not trunc and info["error"]


# ------------------------------------------------------------------------------------------- data mode
@pytest.fixture()
def task_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"target": 50, "nums": [6, 4, 5]},
        {"target": 24, "nums": [3, 3, 8, 8]},
        {"target": 98, "nums": [44, 19, 35]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    yield path, rows
    task_data.clear_cache()


def test_data_mode_jsonl(task_file):
    path, rows = task_file
    env = CountdownEnv(dataset=str(path))
    seen = set()
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        row = rows[info["index"]]
        assert (env.nums, env.target) == (row["nums"], row["target"])
        assert check_answer(info["solution"], env.nums, env.target).kind == "correct"
        seen.add(info["index"])
    assert seen == {0, 1, 2}
    _, info = env.reset(options={"index": 1})
    assert env.target == 24
    with pytest.raises(ValueError):
        env.reset(options={"index": 3})


def test_data_mode_parquet_and_json(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"target": [50], "nums": [[6, 4, 5]]}), tmp_path / "t.parquet")
    (tmp_path / "t.json").write_text(json.dumps([{"target": 24, "nums": [3, 3, 8, 8]}]))
    try:
        env = CountdownEnv(dataset=tmp_path / "t.parquet")
        env.reset(seed=0)
        assert (env.nums, env.target) == ([6, 4, 5], 50)
        env = CountdownEnv(dataset=str(tmp_path / "t.json"))
        env.reset(seed=0)
        assert (env.nums, env.target) == ([3, 3, 8, 8], 24)
    finally:
        task_data.clear_cache()


def test_data_mode_bad_files(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        CountdownEnv(dataset=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"target": 5}\n')
    with pytest.raises(ValueError, match="nums"):
        CountdownEnv(dataset=str(bad))
    worse = tmp_path / "worse.jsonl"
    worse.write_text('{"target": 5, "nums": [1, -2]}\n')
    env = CountdownEnv(dataset=str(worse))
    with pytest.raises(ValueError, match="non-negative"):
        env.reset(seed=0)
    task_data.clear_cache()


def test_hub_dataset_offline_error(tmp_path):
    code = textwrap.dedent(
        """
        from llm_gym.envs.countdown.env import CountdownEnv, RAGEN_DATASET
        try:
            CountdownEnv(dataset=RAGEN_DATASET)
        except RuntimeError as e:
            print("ERROR:", e)
        else:
            print("LOADED")
        """
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "ERROR:" in out.stdout, out.stdout + out.stderr
    assert "Jiayi-Pan/Countdown-Tasks-3to4" in out.stdout and "path/to/tasks.jsonl" in out.stdout


# ----------------------------------------------------------------------------------------- determinism
_DETERMINISM_SCRIPT = """
import gymnasium as gym, llm_gym
for env_id in ["llmgym/Countdown-v0", "llmgym/CountdownAtMostOnce-v0"]:
    env = gym.make(env_id)
    for seed in range(25):
        obs, info = env.reset(seed=seed)
        print(obs, info["solution"])
"""


def test_determinism_across_processes():
    outs = []
    for hashseed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        res = subprocess.run(
            [sys.executable, "-c", _DETERMINISM_SCRIPT], env=env, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr
        outs.append(res.stdout)
    assert outs[0] == outs[1] and outs[0].count("Target:") == 50


def test_same_seed_same_puzzle_in_process():
    a, b = CountdownEnv(), CountdownEnv()
    for seed in (0, 7, 123):
        assert a.reset(seed=seed) == b.reset(seed=seed)


# -------------------------------------------------------------------------------------------- fuzzing
_PIECES = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "6",
        "4",
        "5",
        "+",
        "*",
        "(",
        ")",
        "/",
        "-",
        "=",
        " ",
        "50",
        "x",
        "**",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=200), st.lists(_PIECES, max_size=40).map("".join)))
def test_step_fuzz(text):
    env = CountdownEnv()
    env.reset(options={"nums": [6, 4, 5], "target": 50})
    obs, reward, term, trunc, info = env.step(text)
    assert reward in (1.0, 0.1, 0.0, -0.1)
    assert sum(info["reward_components"].values()) == pytest.approx(reward)
    assert not (term and trunc)
    assert term == info["action_is_valid"]
    assert info["success"] == (reward == 1.0)
    assert env.observation_space.contains(obs)


@pytest.mark.slow
@pytest.mark.parametrize(("num_count", "allow_unused"), [((2, 4), False), ((3, 4), True), ((5, 5), False)])
def test_reference_solutions_many_seeds(num_count, allow_unused):
    env = CountdownEnv(num_count=num_count, allow_unused=allow_unused)
    for seed in range(1000 if num_count[1] < 5 else 30):
        _, info = env.reset(seed=seed)
        assert check_answer(info["solution"], env.nums, env.target, allow_unused).kind == "correct", seed


@pytest.mark.slow
def test_benchmark_quick_run():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run(
        [sys.executable, os.path.join(root, "benchmarks", "countdown.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "scores agree on 300/300" in res.stdout and res.stdout.count("  ratio ") == 2


@pytest.mark.parametrize(
    "nums, target, answer, reward",
    [
        ([2, 3, 5], 10, "2+3=5", 0.1),  # RAGEN's check_format reads 5 after '=' as a number: format score
        ([2, 3], 5, "2 + 3 = 5", 0.0),  # [2, 3, 5] are not the given numbers
        ([2, 3, 5], 10, "2+3+5", 1.0),
        ([2, 3, 5], 10, "(2+3)*5", 0.1),
        ([2, 3, 5], 10, "2+3", 0.0),  # RAGEN has no allow_unused
        ([2, 3, 5], 13, "2**3+5", 0.1),  # eval would take it; our parser does not: format score
    ],
)
def test_ragen_parse_mode_scores_as_ragens_compute_reward(nums, target, answer, reward):
    env = gym.make("llmgym/Countdown-v0", parse_mode="ragen").unwrapped
    env.reset(seed=0, options={"nums": nums, "target": target})
    assert env.step(f"<think>t</think><answer>{answer}</answer>")[1] == pytest.approx(reward)


@given(st.text(alphabet="0123456789+-*/()= .", max_size=40))
@settings(max_examples=300, deadline=None)
def test_ragen_check_agrees_with_ragens_rule_on_integer_expressions(answer):
    import re
    import warnings

    from llm_gym.envs.countdown.env import check_answer_ragen

    nums, target = [2, 3, 5], 10
    # RAGEN's compute_reward (ragen/env/countdown/env.py), with eval limited to what both accept.
    found = sorted(int(n) for n in re.findall(r"\d+", answer))
    verdict = check_answer_ragen(answer, nums, target)
    if found != sorted(nums):
        assert verdict.kind == "invalid"
        return
    if "**" in answer or "//" in answer or "." in answer:
        return  # Python-only syntax: scored differently on purpose (documented)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = eval(answer, {"__builtins__": None}, {})  # noqa: S307 (test oracle on digits and operators)
        right = abs(value - target) < 1e-5
    except Exception:  # noqa: BLE001
        right = False
    assert verdict.kind == ("correct" if right else "wrong_value"), (answer, verdict)
