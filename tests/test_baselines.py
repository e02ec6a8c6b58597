"""Random valid-action baseline, solver optimum and Wilson intervals (llm_gym.agent.baselines)."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_gym.agent.baselines import (
    NoBaseline,
    baseline_success,
    constant_action_success,
    fits_limits,
    format_baseline,
    optimum_solves,
    random_valid_policy,
    wilson_interval,
)
from llm_gym.agent.rollout import make_env
from llm_gym.core.parsing import parse_response
from llm_gym.envs.countdown.env import check_answer

SEEDS = list(range(500, 532))


def test_wilson_known_values():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and math.isclose(hi, 0.2775, abs_tol=1e-4)
    lo, hi = wilson_interval(5, 10)
    assert math.isclose(lo, 0.2366, abs_tol=1e-4) and math.isclose(hi, 0.7634, abs_tol=1e-4)
    lo, hi = wilson_interval(81, 263)  # Wikipedia-style check against a direct computation
    p, n, z = 81 / 263, 263, 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    assert math.isclose((lo + hi) / 2, centre, rel_tol=1e-12)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_trainer_eval_uses_the_same_wilson():
    from llm_gym.trainer.evaluate import wilson_interval as eval_wilson

    assert eval_wilson(3, 17) == wilson_interval(3, 17)


@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 2))
def test_random_actions_are_always_valid(seed, k):
    env = make_env("llmgym/FrozenLake-v0", {"think": False})
    env.reset(seed=seed % 1000)
    resp = random_valid_policy(env, np.random.default_rng(seed), actions_per_turn=k)
    parsed = parse_response(resp, think=False, max_actions=2)
    assert parsed.error is None and len(parsed.actions) == k
    _, _, _, _, info = env.step(resp)
    assert info["action_is_valid"]


def test_actions_per_turn_above_the_env_limit_is_refused():
    env = make_env("llmgym/FrozenLake-v0", {"max_actions_per_turn": 1})
    env.reset(seed=0)
    with pytest.raises(ValueError, match="actions_per_turn"):
        random_valid_policy(env, np.random.default_rng(0), actions_per_turn=2)


@given(seed=st.integers(0, 10_000))
def test_countdown_random_expression_uses_each_number_once(seed):
    env = make_env("llmgym/Countdown-v0", {"think": False})
    env.reset(seed=seed % 500)
    resp = random_valid_policy(env, np.random.default_rng(seed))
    answer = parse_response(resp, think=False, max_actions=1, sep=None).answer
    verdict = check_answer(answer, env.unwrapped.nums, env.unwrapped.target)
    # a wrong value or a division by zero is fine; a number used twice or left out is not
    assert verdict.kind in ("correct", "wrong_value") or "zero" in (verdict.error or "")


def test_bandit_random_arm_is_one_of_the_shown_arms_and_near_half():
    b = baseline_success("llmgym/Bandit-v0", range(1000, 1400))
    r = b["random"]
    assert r["n"] == 400 and r["ci"][0] < 0.5 < r["ci"][1]
    assert b["optimum"]["rate"] == 1.0


def test_free_text_env_has_no_random_baseline():
    env = make_env("llmgym/MetaMathQASample-v0")
    env.reset(seed=0)
    with pytest.raises(NoBaseline):
        random_valid_policy(env, np.random.default_rng(0))
    b = baseline_success("llmgym/MetaMathQASample-v0", [0, 1])
    assert b["random"] is None and "meaningless" in b["reason"]
    assert format_baseline(b) == "no random baseline"


def test_baseline_is_deterministic_and_order_independent():
    kw = {"success_rate": 1.0}
    a = baseline_success("llmgym/FrozenLake-v0", SEEDS, kw, 3, max_actions_per_turn=1, rng_seed=7)
    b = baseline_success("llmgym/FrozenLake-v0", SEEDS[::-1], kw, 3, max_actions_per_turn=1, rng_seed=7)
    assert a == b
    c = baseline_success("llmgym/FrozenLake-v0", SEEDS, kw, 3, max_actions_per_turn=1, rng_seed=8)
    assert c["optimum"] == a["optimum"]  # the optimum does not depend on the policy's draws


def test_more_turns_never_lower_the_optimum_and_random_stays_below_it():
    kw = {"success_rate": 1.0, "size": 3}
    short = baseline_success("llmgym/FrozenLake-v0", SEEDS, kw, 2, max_actions_per_turn=1)
    long = baseline_success("llmgym/FrozenLake-v0", SEEDS, kw, 6, max_actions_per_turn=1)
    assert short["optimum"]["rate"] <= long["optimum"]["rate"]
    for b in (short, long):
        assert b["random"]["successes"] <= b["optimum"]["successes"]
    # 2 single-action turns cannot cross a 3x3 map (S and G are at least 2 apart); 6 turns can
    assert short["optimum"]["rate"] < long["optimum"]["rate"]


def test_frozen_lake_optimum_by_hand():
    env = make_env("llmgym/FrozenLake-v0", {"success_rate": 1.0, "max_turns": 2, "max_actions_per_turn": 1})
    env.reset(seed=0)
    assert optimum_solves(env, {"map": ["SG", "FF"]}) is True
    assert optimum_solves(env, {"map": ["SH", "FG"]}) is True  # two moves around the hole
    assert optimum_solves(env, {"map": ["SH", "HG"]}) is False  # no path
    slippery = make_env("llmgym/FrozenLake-v0")
    slippery.reset(seed=0)
    assert optimum_solves(slippery, {"map": ["SG", "FF"]}) is None


def test_sokoban_optimum_counts_only_plans_within_the_limits():
    assert fits_limits(4, max_turns=2, max_actions_per_turn=2, max_actions=10)
    assert not fits_limits(5, max_turns=2, max_actions_per_turn=2, max_actions=10)
    assert not fits_limits(5, max_turns=5, max_actions_per_turn=2, max_actions=4)
    assert not fits_limits(None, 5, 2, 10)
    b = baseline_success("llmgym/Sokoban-v0", SEEDS[:8], {"think": False}, 2)
    env = make_env("llmgym/Sokoban-v0", {"max_turns": 2})
    lengths = [env.reset(seed=s)[1]["optimal_length"] for s in SEEDS[:8]]
    assert b["optimum"]["successes"] == sum(L is not None and L <= 4 for L in lengths)


def test_episode_outcomes_separates_format_from_task():
    from llm_gym.agent.records import EpisodeRecord, TurnRecord

    def rec(valid_flags, success):
        turns = [
            TurnRecord("r", "o", 0.0, info={"action_is_valid": v, "success": success}) for v in valid_flags
        ]
        return EpisodeRecord("llmgym/Bandit-v0", 0, "obs", turns=turns)

    recs = [
        rec([True], True),
        rec([True], False),
        rec([False], False),
        rec([False, True], True),
        rec([], False),
    ]
    from llm_gym.agent.baselines import episode_outcomes

    o = episode_outcomes(recs)
    assert [r.success for r in recs] == [True, False, False, True, False]
    assert o["episodes"] == 5 and o["successes"] == 2
    assert o["valid_episodes"] == 2 and o["valid_successes"] == 1  # the half-valid success is not counted
    assert math.isclose(o["valid_action_rate"], (1 + 1 + 0 + 0.5 + 0) / 5)


def test_evaluation_report_groups_eval_rounds_and_runs_the_baseline():
    from llm_gym.agent.baselines import evaluation_report, format_outcomes
    from llm_gym.agent.records import EpisodeRecord, TurnRecord

    def rec(step, ok, seed):
        t = TurnRecord("r", "o", 0.0, info={"action_is_valid": True, "success": ok})
        return EpisodeRecord("llmgym/Bandit-v0", seed, "obs", turns=[t], meta={"mode": "eval", "step": step})

    recs = [rec(10, True, 0), rec(0, False, 0), rec(10, True, 1), rec(0, True, 1)]
    rep = evaluation_report("llmgym/Bandit-v0", [0, 1, 2, 3], {"think": False}, recs)
    assert [e["step"] for e in rep["evals"]] == [0, 10]
    assert rep["evals"][0]["success"]["successes"] == 1 and rep["evals"][1]["success"]["successes"] == 2
    assert rep["baseline"]["random"]["n"] == 4
    line = format_outcomes(rep["evals"][1])
    assert line.startswith("success 1.000 [") and "success among valid 1.00" in line


def test_an_evaluation_repeated_at_one_step_counts_each_episode_once():
    """The periodic evaluation falling on max_steps and the final one record the same step: the report's n is
    the seeds x samples, not twice that, and the later evaluation's episodes are the ones counted."""
    from llm_gym.agent.baselines import evaluation_report
    from llm_gym.agent.records import EpisodeRecord, TurnRecord

    def rec(seed, sample, ok):
        t = TurnRecord("r", "o", 0.0, info={"action_is_valid": True, "success": ok})
        meta = {"mode": "eval", "step": 40, "group_index": sample}
        return EpisodeRecord("llmgym/Bandit-v0", seed, "obs", turns=[t], meta=meta)

    periodic = [rec(seed, k, False) for seed in range(8) for k in range(2)]
    final = [rec(seed, k, seed < 6) for seed in range(8) for k in range(2)]
    rep = evaluation_report("llmgym/Bandit-v0", list(range(8)), {"think": False}, periodic + final, samples=2)
    (only,) = rep["evals"]
    assert only["success"]["n"] == 16 and only["success"]["successes"] == 12


def test_llmgym_eval_reports_the_baseline_and_success_among_valid(tmp_path, capsys):
    pytest.importorskip("trl")
    import json

    from llm_gym.trainer.evaluate import SUMMARY_FILE, main

    from tests._tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "ev"
    args = ["--model", tiny, "--env", "Bandit", "--num_eval_seeds", "6", "--max_new_tokens", "4"]
    assert main([*args, "--output_dir", str(out), "--no-progress", "--device", "cpu"]) == 0
    table = capsys.readouterr().out
    assert "random valid" in table and "succ|valid" in table
    env = json.loads((out / SUMMARY_FILE).read_text())["envs"]["llmgym/Bandit-v0"]
    expected = baseline_success("llmgym/Bandit-v0", range(123, 129), {})
    assert env["baseline"] == json.loads(json.dumps(expected))
    assert env["valid"]["n"] == 6 and env["success_given_valid"]["n"] == env["valid"]["successes"]


def test_constant_action_policies_match_a_walk_by_hand():
    """ "Always answer a": the walk from S in one direction on the seed's map (walls stop it, a hole ends it),
    within 3 single-action turns; no constant policy beats the optimum; Bandit has none."""
    kw = {"success_rate": 1.0, "size": 3}
    got = constant_action_success("llmgym/CoordFrozenLake-v0", SEEDS, kw, 3, max_actions_per_turn=1)
    assert list(got) == ["Left", "Down", "Right", "Up"]
    step = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
    env = make_env("llmgym/CoordFrozenLake-v0", kw)
    for name, (dr, dc) in step.items():
        wins = 0
        for seed in SEEDS:
            grid = env.reset(seed=seed)[1]["map"]
            r, c = next((i, row.index("S")) for i, row in enumerate(grid) if "S" in row)
            for _ in range(3):
                if 0 <= r + dr < len(grid) and 0 <= c + dc < len(grid[0]):
                    r, c = r + dr, c + dc
                if grid[r][c] in "HG":
                    break
            wins += grid[r][c] == "G"
        assert got[name]["successes"] == wins and got[name]["n"] == len(SEEDS)
    optimum = baseline_success("llmgym/CoordFrozenLake-v0", SEEDS, kw, 3, max_actions_per_turn=1)["optimum"]
    assert 0 < max(v["successes"] for v in got.values()) <= optimum["successes"]
    with pytest.raises(NoBaseline):
        constant_action_success("llmgym/Bandit-v0", SEEDS[:2])


def test_constant_policy_fills_the_per_turn_limit_like_the_random_policy():
    """With 2 actions a turn, "always Right" plays Right twice a turn: 1 turn of 2 equals 2 turns of 1."""
    kw = {"success_rate": 1.0, "size": 3}
    two = constant_action_success("llmgym/FrozenLake-v0", SEEDS, kw, 1, max_actions_per_turn=2, max_actions=2)
    one = constant_action_success("llmgym/FrozenLake-v0", SEEDS, kw, 2, max_actions_per_turn=1, max_actions=2)
    assert two == one and max(v["successes"] for v in two.values()) > 0
    half = constant_action_success(
        "llmgym/FrozenLake-v0", SEEDS, kw, 1, max_actions_per_turn=2, max_actions=2, actions_per_turn=1
    )
    assert all(h["successes"] <= t["successes"] for h, t in zip(half.values(), two.values()))
    with pytest.raises(ValueError, match="per-turn limit"):
        constant_action_success(
            "llmgym/FrozenLake-v0", SEEDS[:1], kw, 1, max_actions_per_turn=2, actions_per_turn=3
        )
