"""RAGEN's protocol as named options: parsing and valid-subset execution, dynamics seeds, FrozenLake id,
Countdown data rules, MetaMathQA strict grading, and the chat style (fixture rendered by RAGEN's formatting)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llm_gym  # noqa: F401
from llm_gym.agent.chat import ChatFormat, Conversation
from llm_gym.core.parsing import RAGEN_SPECIAL_TOKENS, parse_ragen_response
from llm_gym.envs.countdown.arith import plus_minus_solvable
from llm_gym.envs.metamathqa.math_check import is_equivalent
from llm_gym.envs.task_data import DatasetUnavailableError

# RAGEN's own pattern (ragen/llm_agent/ctx_manager.py, _parse_response): the specification parse_ragen_response
# must agree with.
_RAGEN_RE = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_PIECES = [
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "<THINK>",
    " ",
    "\n",
    "\t",
    "||",
    "Up",
    "x",
    "<|im_end|>",
]


def _ragen_reference(text: str):
    m = _RAGEN_RE.search(text)
    if m is None:
        return None
    think, answer = m.group(1), m.group(2)
    for token in RAGEN_SPECIAL_TOKENS:
        answer = answer.replace(token, "").strip()
        think = think.replace(token, "").strip()
    return think, answer, [a.strip() for a in answer.split("||") if a.strip()]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES) | st.text(max_size=3), max_size=14).map("".join))
def test_ragen_parser_agrees_with_ragens_regex(text):
    ref = _ragen_reference(text)
    got = parse_ragen_response(text)
    if ref is None:
        assert not got.ok
    else:
        think, answer, actions = ref
        assert (got.think, got.answer) == (think, answer)
        assert got.ok == bool(actions) and list(got.actions) == actions


def test_ragen_parser_is_case_sensitive_and_strict_between_blocks():
    assert parse_ragen_response("<think>a</think>\n <answer>Up</answer>").actions == ("Up",)
    assert not parse_ragen_response("<THINK>a</THINK><ANSWER>Up</ANSWER>").ok
    assert not parse_ragen_response("<think>a</think> so: <answer>Up</answer>").ok
    assert (
        parse_ragen_response("<answer>Up || Left || Down</answer>", think=False, max_actions=2).dropped == 1
    )


def test_ragen_parser_is_linear_on_hostile_text():
    text = "<think>" + "</think>x" * 100_000  # quadratic for a backtracking lazy regex
    assert not parse_ragen_response(text).ok


def test_valid_subset_execution_in_ragen_mode_only():
    reply = "<think>t</think><answer>Up || Jump</answer>"
    ragen = gym.make("llmgym/Sokoban-v0", parse_mode="ragen")
    ragen.reset(seed=0)
    _, reward, _, _, info = ragen.step(reply)
    assert info["actions"] == ["Up"] and not info["action_is_valid"]
    assert info["reward_components"]["format_penalty"] == pytest.approx(-0.1)
    ours = gym.make("llmgym/Sokoban-v0")
    ours.reset(seed=0)
    _, _, _, _, info = ours.step(reply)
    assert info["actions"] == [] and not info["action_is_valid"]
    with pytest.raises(ValueError, match="parse_mode"):
        gym.make("llmgym/Sokoban-v0", parse_mode="strict")


# --------------------------------------------------------------------------------------- dynamics seeds
def _bandit_payouts(dynamics: bool, seed: int) -> tuple[set, list[float]]:
    env = gym.make("llmgym/Bandit-v0").unwrapped
    starts, payouts = set(), []
    for member in range(16):
        opts = {"dynamics_seed": member} if dynamics else None
        obs, _ = env.reset(seed=seed, options=opts)
        starts.add(obs)
        _, reward, *_ = env.step(f"<think>t</think><answer>{env.high_arm}</answer>")
        payouts.append(reward)
    return starts, payouts


def test_dynamics_seed_gives_group_members_their_own_bandit_payouts():
    differing = 0
    for seed in range(20):
        starts, payouts = _bandit_payouts(True, seed)
        assert len(starts) == 1  # every member starts from the same state
        differing += len(set(payouts)) > 1
        shared_starts, shared = _bandit_payouts(False, seed)
        assert len(set(shared)) == 1 and shared_starts == starts
    assert differing >= 15  # P(16 equal payouts) = 0.25**16 + 0.75**16, about 1%


def test_dynamics_seed_gives_frozen_lake_members_their_own_slips_and_is_reproducible():
    env = gym.make("llmgym/FrozenLake-v0").unwrapped

    def trace(member):
        obs, _ = env.reset(seed=5, options={"dynamics_seed": member})
        seq = [obs]
        for _ in range(4):
            seq.append(env.step("<think>t</think><answer>Down || Right</answer>")[0])
        return seq

    traces = [trace(m) for m in range(8)]
    assert len({t[0] for t in traces}) == 1 and len({tuple(t) for t in traces}) > 1
    assert trace(3) == trace(3)  # same seed and options, same episode
    with pytest.raises(ValueError, match="dynamics_seed"):
        env.reset(seed=0, options={"dynamics_seed": -1})


def test_coord_frozen_lake_deterministic_id():
    env = gym.make("llmgym/CoordFrozenLakeDeterministic-v0").unwrapped
    assert env.success_rate == 1.0 and env.observation_format == "grid_coord"
    assert gym.make("llmgym/CoordFrozenLake-v0").unwrapped.success_rate == 0.8


# ------------------------------------------------------------------------------------------- Countdown
@given(st.lists(st.integers(0, 30), min_size=1, max_size=5), st.integers(-100, 100))
def test_plus_minus_solvable_matches_brute_force(nums, target):
    from itertools import product

    brute = any(
        sum(s * n for s, n in zip(signs, nums)) == target for signs in product((1, -1), repeat=len(nums))
    )
    assert plus_minus_solvable(nums, target) == brute


def test_generated_plus_minus_puzzles_are_all_plus_minus_solvable():
    env = gym.make("llmgym/Countdown-v0", operators="+-").unwrapped
    counts = set()
    for seed in range(60):
        env.reset(seed=seed)
        counts.add(len(env.nums))
        assert plus_minus_solvable(env.nums, env.target) and 10 <= env.target <= 100
    assert counts == {3, 4}


def test_ragen_data_rules_on_a_local_file(tmp_path):
    rows = [
        {"target": 10, "nums": [3, 7, 1]},  # not +/- solvable
        {"target": 5, "nums": [2, 3]},
        {"target": 6, "nums": [1, 2, 3]},
        {"target": 4, "nums": [1, 5]},  # beyond max_rows
    ]
    path = tmp_path / "cd.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = gym.make(
        "llmgym/Countdown-v0",
        dataset=str(path),
        operators="+-",
        max_rows=3,
        index_by="seed",
        parse_mode="ragen",
    ).unwrapped
    shown = [env.reset(seed=s)[0] for s in range(4)]
    assert shown == ["Target: 5, nums: [2, 3]", "Target: 6, nums: [1, 2, 3]"] * 2
    env.reset(seed=0)
    _, reward, *_ = env.step("<think>t</think><answer>2 + 3 = 5</answer>")
    assert reward == 0.0  # RAGEN rejects "="
    ours = gym.make("llmgym/Countdown-v0", dataset=str(path)).unwrapped
    ours.reset(options={"index": 1})
    assert ours.step("<think>t</think><answer>2 + 3 = 5</answer>")[1] == 1.0


def _ragen_executed(reply: str, max_actions_per_turn: int) -> list[str]:
    # RAGEN with a one-action budget: _parse_response's split and cap (ctx_manager.py:196-221), no action lookup
    # (es_manager.py:384-394), then valid_actions[:actions_left] with one action left (es_manager.py:231-232).
    ref = _ragen_reference(reply)
    return [] if ref is None else ref[2][:max_actions_per_turn][:1]


_SPLIT_ENVS = [
    (gym.make("llmgym/Countdown-v0", parse_mode="ragen", action_sep="||").unwrapped, 1),
    (gym.make("llmgym/MetaMathQASample-v0", parse_mode="ragen", action_sep="||", strict=True).unwrapped, 2),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["2", "3", " + ", " ", "||", "|", "9", "x"]), max_size=8).map("".join))
def test_answer_envs_execute_only_the_first_part_before_the_separator(answer):
    # N11: RAGEN splits every answer on "||"; Countdown (max_actions_per_turn 1, config/_4_countdown.yaml:14) and
    # MetamathQA (2, config/base.yaml:140) then run only the first part, their budget being one action.
    reply = f"<think>t</think><answer>{answer}</answer>"
    for env, per_turn in _SPLIT_ENVS:
        env.reset(seed=0, options={"nums": [2, 3], "target": 5} if per_turn == 1 else None)
        info = env.step(reply)[4]
        expected = _ragen_executed(reply, per_turn)
        assert info["actions"] == expected, (type(env).__name__, answer)
        assert info["action_is_valid"] == bool(expected)


def test_answer_separator_is_a_named_choice_and_the_default_is_unchanged():
    reply = "<think>t</think><answer>2 + 3 || 9</answer>"
    split = gym.make("llmgym/Countdown-v0", parse_mode="ragen", action_sep="||").unwrapped
    split.reset(seed=0, options={"nums": [2, 3], "target": 5})
    _, reward, term, _, info = split.step(reply)
    assert (reward, term, info["actions"], info["dropped_actions"]) == (1.0, True, ["2 + 3"], 1)
    whole = gym.make("llmgym/Countdown-v0", parse_mode="ragen").unwrapped
    whole.reset(seed=0, options={"nums": [2, 3], "target": 5})
    _, reward, _, _, info = whole.step(reply)
    assert reward == 0.0 and info["actions"] == ["2 + 3 || 9"]  # 9 is not a given number
    math = gym.make("llmgym/MetaMathQASample-v0", strict=True, action_sep="||").unwrapped
    _, info = math.reset(seed=0)
    assert math.step(f"<think>t</think><answer>{info['gold_answer']} || 0</answer>")[1] == 1.0
    for bad in ("", " ", 3):
        with pytest.raises(ValueError, match="action_sep"):
            gym.make("llmgym/Countdown-v0", action_sep=bad)


def test_ragen_dataset_offline_is_a_clear_error():
    with pytest.raises(DatasetUnavailableError, match="Countdown-Tasks-3to4"):
        gym.make("llmgym/Countdown-v0", dataset="ragen")
    with pytest.raises(ValueError, match="fixes"):
        gym.make("llmgym/Countdown-v0", dataset="ragen", operators="+-*/")


# ----------------------------------------------------------------------------------------- MetaMathQA
def _ragen_check(answer: str, gold: str) -> bool:
    # ragen/env/metamathqa/env.py, _check_answer (the gold answer is stripped when it is extracted)
    gold = gold.strip()
    norm = re.sub(r"\s+", "", answer.strip().lower())
    return bool(gold) and norm == re.sub(r"\s+", "", gold.lower())


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=20), st.text(max_size=20))
def test_strict_grading_equals_ragens_rule(answer, gold):
    assert is_equivalent(answer, gold, strict=True) == _ragen_check(answer, gold)
    assert is_equivalent(gold + " \n", gold, strict=True) == _ragen_check(gold + " \n", gold)


def test_metamathqa_ragen_turn_limit_allows_format_retries():
    env = gym.make("llmgym/MetaMathQASample-v0", strict=True, max_turns=5)
    _, info = env.reset(seed=0)
    for _ in range(4):
        _, _, term, trunc, _ = env.step("no tags")
        assert not (term or trunc)
    _, reward, term, _, _ = env.step(f"<think>t</think><answer>{info['gold_answer']}</answer>")
    assert term and reward == 1.0


# ---------------------------------------------------------------------------------------------- chat
_FIXTURE = Path(__file__).parent / "data" / "ragen_chat.json"


_CHAT_CASES = sorted(k for k in json.loads(_FIXTURE.read_text(encoding="utf-8")) if k != "coord_end_states")


def test_the_chat_fixture_covers_every_ragen2_task_and_its_quirks():
    # Written by tests/ragen_chat_fixture.py from RAGEN's config/envs.yaml and a transcription of its prompt code.
    assert {"coord_sokoban", "coord_frozen_lake", "countdown", "metamathqa", "sokoban_new_vocab"} <= set(
        _CHAT_CASES
    )
    cases = json.loads(_FIXTURE.read_text(encoding="utf-8"))
    legend = "\nThe meaning of each symbol in the state is:\n#: wall, _: empty"
    # RAGEN's merge quirk: the legend in coordinate mode, and the default symbols for the remapped vocabulary
    assert legend in cases["coord_sokoban"]["messages"][0]["content"]
    assert legend in cases["sokoban_new_vocab"]["messages"][0]["content"]
    assert "W" in cases["sokoban_new_vocab"]["messages"][1]["content"]
    assert "P: player, _: empty, O: hole" in cases["coord_frozen_lake"]["messages"][0]["content"]
    assert (
        cases["metamathqa"]["messages"][0]["content"]
        == "You're a helpful assistant. You are solving Math problems. "
    )


@pytest.mark.parametrize("name", _CHAT_CASES)
def test_ragen_chat_style_renders_ragens_text(name):
    # The fixture holds the prompt RAGEN's prompt code (ctx_manager.py) builds after these states and replies.
    case = json.loads(_FIXTURE.read_text(encoding="utf-8"))[name]
    env = gym.make(case["env_id"], parse_mode="ragen")
    fmt = ChatFormat(style="ragen")
    conv = Conversation(env, fmt)
    obs, _ = env.reset(seed=case["seed"])
    conv.add_observation(obs)
    for reply in case["replies"]:
        conv.add_reply(reply)
        obs, reward, _, _, info = env.step(reply)
        conv.add_observation(obs, reward=reward, info=info)
    assert conv.messages() == case["messages"]
    assert fmt.generation_prefix == case["generation_suffix"] == "<think>"
    assert ChatFormat().generation_prefix == ""


@pytest.mark.parametrize("case", json.loads(_FIXTURE.read_text(encoding="utf-8"))["coord_end_states"])
def test_ragen_coordinate_text_of_end_states(case):
    # Player on the goal / in a hole, a box on a target: RAGEN's format_coordinate_render output for the state.
    env = gym.make(case["env_id"])
    obs, _ = env.reset(seed=0, options=case["options"])
    for reply in case["replies"]:
        obs, *_ = env.step(f"<think>x</think><answer>{reply}</answer>")
    assert obs == case["observation"]
    assert env.observation_space.contains(obs)


@pytest.mark.parametrize("env_id", ["llmgym/CoordSokoban-v0", "llmgym/CoordFrozenLakeDeterministic-v0"])
def test_observation_style_is_a_named_choice_and_the_default_is_unchanged(env_id):
    ours = gym.make(env_id).reset(seed=5)[0]
    ragen = gym.make(env_id, observation_style="ragen").reset(seed=5)[0]
    assert ours.startswith("Coordinates:\nBoard: ") and "\nGrid Map:\n" in ours
    assert ragen.startswith("Coordinates: \nBoard size: ") and "\nGrid Map: \n" in ragen
    assert ours.split("Grid Map:\n")[1] == ragen.split("Grid Map: \n")[1]  # same state, same grid
    grid_id = env_id.replace("Coord", "")
    assert gym.make(grid_id, observation_style="ragen").reset(seed=5)[0] == gym.make(grid_id).reset(seed=5)[0]
    with pytest.raises(ValueError, match="observation_style"):
        gym.make(env_id, observation_style="RAGEN")


def test_ragen_coord_ids():
    for version, generator in (("v0", "llmgym"), ("v1", "ragen")):
        fl = gym.make(f"llmgym/RagenCoordFrozenLake-{version}").unwrapped
        assert (fl.observation_format, fl.observation_style, fl.success_rate) == ("grid_coord", "ragen", 1.0)
        assert fl.generator == generator
    sk = gym.make("llmgym/RagenCoordSokoban-v0").unwrapped
    assert (sk.observation_format, sk.observation_style) == ("grid_coord", "ragen")


# ------------------------------------------------------------------------------------- FrozenLake maps
def _ragen_frozen_lake_map(seed: int, size: int = 4, p: float = 0.9) -> list[str]:
    """Transcription of RAGEN's ``generate_random_map`` and ``is_valid`` (``ragen/env/frozen_lake/utils.py:71-106``
    at 20daedc), seeded as RAGEN's env seeds it on ``reset(seed)`` (``map_seed = seed``, ``env.py:35-38``)."""
    from gymnasium.utils import seeding

    def is_valid(board, max_size):
        frontier, discovered = [], set()
        start_r, start_c = np.where(np.array(board) == "S")
        frontier.append((start_r[0], start_c[0]))
        while frontier:
            r, c = frontier.pop()
            if (r, c) not in discovered:
                discovered.add((r, c))
                for dr, dc in [(1, 0), (0, 1), (-1, 0), (0, -1)]:
                    r_new, c_new = r + dr, c + dc
                    if 0 <= r_new < max_size and 0 <= c_new < max_size:
                        if board[r_new][c_new] == "G":
                            return True
                        if board[r_new][c_new] != "H":
                            frontier.append((r_new, c_new))
        return False

    np_random, _ = seeding.np_random(seed)
    while True:
        board = np_random.choice(["F", "H"], (size, size), p=[p, 1 - p])
        start_r, start_c = np_random.integers(size, size=2)
        goal_r, goal_c = np_random.integers(size, size=2)
        if (start_r, start_c) != (goal_r, goal_c):
            board[start_r][start_c], board[goal_r][goal_c] = "S", "G"
            if is_valid(board, size):
                break
    return ["".join(row) for row in board]


def test_ragen_generator_gives_ragens_512_validation_maps():
    # RAGEN-2 validates on seeds 123.. (config/base.yaml:10, 165-170; es_manager.py:131): 512 FrozenLake maps.
    v1 = gym.make("llmgym/RagenCoordFrozenLake-v1").unwrapped
    v0 = gym.make("llmgym/RagenCoordFrozenLake-v0").unwrapped
    same_v0 = 0
    for seed in range(123, 123 + 512):
        ragen = _ragen_frozen_lake_map(seed)
        _, info = v1.reset(seed=seed)
        assert info["map"] == ragen, seed
        same_v0 += v0.reset(seed=seed)[1]["map"] == ragen
    assert same_v0 < 50  # llm-gym's own draw gives other maps from the same seeds (v0 is kept as it was)
    # the player starts on RAGEN's start cell, and the RAGEN draw is only used where asked for
    assert "".join(ragen)[v1.player[0] * 4 + v1.player[1]] == "S"
    assert gym.make("llmgym/FrozenLake-v0").unwrapped.generator == "llmgym"
