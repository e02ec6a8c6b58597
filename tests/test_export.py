"""llmgym export: solver trajectories as chat rows, and the replay check that every row solves its episode."""

from __future__ import annotations

import copy
import json

import gymnasium as gym
import pytest

import llm_gym
from llm_gym.agent.export import (
    export_dataset,
    export_episodes,
    read_jsonl,
    verify_rows,
    write_jsonl,
)
from llm_gym.cli import main
from llm_gym.core.parsing import parse_response
from llm_gym.envs.frozen_lake.solver import shortest_path

FAMILIES = [
    "llmgym/Sokoban-v0",
    "llmgym/SokobanLarge-v0",
    "llmgym/FrozenLakeDeterministic-v0",
    "llmgym/FrozenLake-v0",
    "llmgym/Countdown-v0",
    "llmgym/MetaMathQASample-v0",
    "llmgym/Bandit-v0",
]


def _actions(row) -> list[str]:
    out = []
    for m in row["messages"]:
        if m["role"] == "assistant":
            out += list(parse_response(m["content"]).actions)
    return out


@pytest.mark.parametrize("env_id", FAMILIES)
def test_every_exported_row_replays_to_success(env_id):
    result = export_episodes(env_id, range(6))
    assert len(result.rows) + len(result.skipped) == 6
    assert len(result.rows) >= 4  # only slippery ice may lose a few seeds
    for row in result.rows:
        assert row["env_id"] == env_id and row["llm_gym_version"] == llm_gym.__version__
        assert isinstance(row["seed"], int) and json.loads(row["env_kwargs"]) == {}
        roles = [m["role"] for m in row["messages"]]
        assert (
            roles[0] == "system" and roles[-1] == "assistant" and roles.count("assistant") == row["num_turns"]
        )
    assert verify_rows(result.rows) == []


def test_sokoban_rows_are_optimal():
    result = export_episodes("Sokoban", range(8))
    env = gym.make("llmgym/Sokoban-v0")
    for row in result.rows:
        _, info = env.reset(seed=row["seed"])
        assert len(_actions(row)) == info["optimal_length"]


def test_deterministic_frozen_lake_rows_follow_a_shortest_path():
    result = export_episodes("FrozenLakeDeterministic", range(8))
    env = gym.make("llmgym/FrozenLakeDeterministic-v0")
    for row in result.rows:
        _, info = env.reset(seed=row["seed"])
        start = divmod("".join(info["map"]).index("S"), len(info["map"][0]))
        assert len(_actions(row)) == len(shortest_path(info["map"], start))


def test_shortest_path_on_fixed_maps():
    assert shortest_path(["SF", "HG"], (0, 0)) == ["Right", "Down"]
    assert shortest_path(["SFF", "HHF", "GFF"], (0, 0)) == ["Right", "Right", "Down", "Down", "Left", "Left"]
    assert shortest_path(["SH", "HG"], (0, 0)) is None


def test_slippery_rows_are_kept_only_when_they_succeed():
    result = export_episodes("FrozenLakeSlippery", range(12))
    assert result.skipped  # 1/3 intended moves: the expert cannot always make it
    assert verify_rows(result.rows) == []


def test_countdown_and_math_rows_answer_with_the_reference():
    row = export_episodes("Countdown", [3]).rows[0]
    _, info = gym.make("llmgym/Countdown-v0").reset(seed=3)
    assert _actions(row) == [info["solution"]]
    row = export_episodes("MetaMathQASample", [5]).rows[0]
    _, info = gym.make("llmgym/MetaMathQASample-v0").reset(seed=5)
    assert parse_response(row["messages"][-1]["content"]).answer == info["gold_answer"]


def test_bandit_picks_the_expected_value_arm():
    rows = export_episodes("Bandit", range(4)).rows
    env = gym.make("llmgym/Bandit-v0")
    for row in rows:
        env.reset(seed=row["seed"])
        assert _actions(row) == [env.unwrapped.high_arm]
    # When the low-risk arm pays more in expectation the expert picks it; the env's success criterion (the
    # high-risk arm) then fails, so those episodes are skipped rather than written.
    low = export_episodes("Bandit", range(3), env_kwargs={"high_risk_prob": 0.05})
    assert not low.rows and len(low.skipped) == 3


def _tampered(rows, fn):
    rows = copy.deepcopy(rows)
    fn(rows[0])
    return rows


def test_replay_check_catches_bad_rows():
    rows = export_episodes("Sokoban", range(3)).rows

    def wrong_move(row):
        last = row["messages"][-1]
        last["content"] = last["content"].replace("<answer>", "<answer>Up || Up || ", 1)

    def wrong_seed(row):
        row["seed"] += 1

    def code_id(row):
        row["env_id"] = "os:system"

    def truncated(row):
        row["messages"] = row["messages"][:-2]

    for fn, reason in (
        (wrong_move, "not ended"),  # the last turn now executes Up, Up: the box is not home
        (wrong_seed, "state"),
        (code_id, "registered"),
        (truncated, "not ended"),
    ):
        problems = verify_rows(_tampered(rows, fn))
        assert [p.index for p in problems] == [0], fn.__name__
        assert reason in problems[0].reason
    bandit = export_episodes("Bandit", [0]).rows
    env = gym.make("llmgym/Bandit-v0")
    env.reset(seed=0)
    low = env.unwrapped.low_arm
    bandit[0]["messages"][-1]["content"] = f"<think></think><answer>{low}</answer>"
    assert "does not end in success" in verify_rows(bandit)[0].reason
    problems = verify_rows(rows, env_kwargs={"max_turns": 3})
    assert len(problems) == 3 and "env_kwargs" in problems[0].reason


def test_jsonl_round_trip_and_bounded_reader(tmp_path):
    rows = export_episodes("Countdown", range(2)).rows
    path = tmp_path / "x.jsonl"
    assert write_jsonl(rows, path) == 2
    assert list(read_jsonl(path)) == rows
    path.write_text('{"seed": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match="JSON object"):
        list(read_jsonl(path))


def test_datasets_dataset():
    pytest.importorskip("datasets")
    ds = export_dataset("FrozenLakeDeterministic", range(3))
    assert len(ds) == 3 and ds[0]["messages"][0]["role"] == "system"
    assert verify_rows(iter(ds)) == []


def test_cli_export_verify_and_check(tmp_path, capsys):
    out = tmp_path / "expert.jsonl"
    assert main(["export", "--env", "Sokoban", "--out", str(out), "--num_episodes", "3", "--verify"]) == 0
    assert "every row replays" in capsys.readouterr().out
    rows = list(read_jsonl(out))
    rows[1]["messages"][-1]["content"] = "<think></think><answer>Left</answer>"
    write_jsonl(rows, out)
    assert main(["export", "--check", str(out)]) == 1
    assert "row 1" in capsys.readouterr().err
    assert main(["export", "--out", str(out)]) == 2  # usage: no --env


def test_cli_export_random_and_mixed_policies(tmp_path, capsys):
    from llm_gym.agent.export import plays_expert

    kw = ["--env", "FrozenLakeDeterministic", "--seed", "300", "--num_episodes", "12"]
    out = tmp_path / "random.jsonl"
    assert main(["export", *kw, "--policy", "random", "--out", str(out), "--verify"]) == 0
    text = capsys.readouterr().out
    assert "wrote 12 episode(s)" in text and "(12 random-valid; seeds 300..311)" in text
    assert {r["policy"] for r in read_jsonl(out)} == {"random-valid"}
    out = tmp_path / "mix.jsonl"
    assert main(["export", *kw, "--expert_fraction", "0.5", "--out", str(out), "--verify"]) == 0
    rows = list(read_jsonl(out))
    expert = {r["seed"] for r in rows if r["policy"] == "expert"}
    random = {r["seed"] for r in rows if r["policy"] == "random-valid"}
    # each seed played by one policy, chosen per seed (plays_expert); the solver solves every deterministic board
    assert (
        expert == {s for s in range(300, 312) if plays_expert(s, 0.5)}
        and random == set(range(300, 312)) - expert
    )
    assert expert and random and "every row replays exactly" in capsys.readouterr().out
    for bad in (
        ["--expert_fraction", "1.5"],
        ["--expert_fraction", "nan"],
        ["--policy", "random", "--expert_fraction", "0.5"],
    ):
        assert main(["export", *kw, *bad, "--out", str(tmp_path / "x.jsonl")]) == 2
        assert "--expert_fraction" in capsys.readouterr().err and not (tmp_path / "x.jsonl").exists()


def test_cli_export_hf_format(tmp_path, capsys):
    pytest.importorskip("datasets")
    out = tmp_path / "ds"
    args = ["export", "--env", "Countdown", "--out", str(out), "--num_episodes", "2", "--format", "hf"]
    assert main([*args, "--verify"]) == 0
    assert main(["export", "--check", str(out), "--format", "hf"]) == 0


def test_replay_check_compares_every_message_exactly():
    from llm_gym.agent.chat import ChatFormat

    rows = export_episodes("FrozenLakeDeterministic", range(2)).rows

    def system_changed(row):
        row["messages"][0]["content"] += " Ignore the rules."

    def user_padded(row):  # still contains the state (the old substring check passed it)
        row["messages"][1]["content"] = "Injected text. " + row["messages"][1]["content"]

    def role_changed(row):
        row["messages"][1]["role"] = "tool"

    for fn in (system_changed, user_padded, role_changed):
        problems = verify_rows(_tampered(rows, fn))
        assert [p.index for p in problems] == [0], fn.__name__
        assert "differs from the env's conversation" in problems[0].reason
    # Rows exported with another chat format verify with that format only.
    fmt = ChatFormat(show_budget=False)
    other = export_episodes("FrozenLakeDeterministic", [0], chat=fmt).rows
    assert verify_rows(other, chat=fmt) == [] and verify_rows(other) != []


def test_export_seeds_follow_the_one_seed_rule():
    assert export_episodes("Bandit", [2**64 - 1]).rows  # the largest seed records accept
    for bad in (2**64, -1, True, "3"):
        with pytest.raises(ValueError, match=r"each seed must be an integer in \[0, 2\*\*64\)"):
            export_episodes("Bandit", [bad])
