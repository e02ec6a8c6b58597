"""Format demonstrations that cannot become the policy: the solver's move for the example's own state, several
examples with different answers, a placeholder that is no legal action."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from llm_gym.agent.chat import EXAMPLE_SEED, ChatFormat, Conversation, example_exchange
from llm_gym.agent.demonstrations import PLACEHOLDER_ACTION, SEVERAL
from llm_gym.agent.export import expert_reply
from llm_gym.registration import make_env

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    (
        "llmgym/CoordFrozenLake-v0",
        {"success_rate": 1.0, "size": 3, "max_actions_per_turn": 1, "think": False},
    ),
    ("llmgym/FrozenLakeDeterministic-v0", {}),
    ("llmgym/Sokoban-v0", {}),
    ("llmgym/Bandit-v0", {"think": False}),
    ("llmgym/Countdown-v0", {}),
]


def _answers(env, kind):
    msgs = example_exchange(env, ChatFormat(one_shot=True, demonstration=kind))
    assert [m["role"] for m in msgs] == ["user", "assistant"] * (len(msgs) // 2)
    return msgs


@pytest.mark.parametrize("env_id,kwargs", CASES)
def test_solver_demonstration_answers_its_own_state_with_the_solvers_move(env_id, kwargs):
    env = make_env(env_id, kwargs)
    (user, answer) = _answers(env, "solver")
    demo = make_env(env_id, kwargs)
    for seed in range(EXAMPLE_SEED, EXAMPLE_SEED + 200):  # the first solvable example state
        obs, _ = demo.reset(seed=seed)
        if (want := expert_reply(demo)) is not None:
            break
    assert answer["content"] == want and obs in user["content"]
    _, _, _, _, info = demo.step(answer["content"])
    assert info["action_is_valid"]  # a legal answer, and the right one, for that state only


@pytest.mark.parametrize("env_id,kwargs", CASES)
def test_several_demonstrations_all_answer_differently(env_id, kwargs):
    msgs = _answers(make_env(env_id, kwargs), "several")
    answers = [m["content"] for m in msgs if m["role"] == "assistant"]
    states = [m["content"] for m in msgs if m["role"] == "user"]
    assert len(answers) == SEVERAL and len(set(answers)) == SEVERAL and len(set(states)) == SEVERAL


@pytest.mark.parametrize("env_id,kwargs", CASES)
def test_placeholder_demonstration_is_no_legal_action(env_id, kwargs):
    env = make_env(env_id, kwargs)
    (_, answer) = _answers(env, "placeholder")
    env.reset(seed=3)
    _, _, _, _, info = env.step(answer["content"])
    # Countdown's example expression uses other numbers: well-formed, never right
    if env_id.startswith("llmgym/Countdown"):
        assert info["answer_error"] and not info["success"]
    else:
        assert not info["action_is_valid"]
    names = getattr(env.unwrapped, "action_names", None)
    if names:
        assert f"<answer>{PLACEHOLDER_ACTION}" in answer["content"]


def test_the_original_demonstration_is_the_default_and_the_conversation_puts_it_first():
    env = make_env(*CASES[0])
    assert ChatFormat().demonstration == "action"
    obs, _ = env.reset(seed=5)
    conv = Conversation(env, ChatFormat(one_shot=True, demonstration="several"))
    conv.add_observation(obs)
    roles = [m["role"] for m in conv.messages()]
    assert roles == ["system", *["user", "assistant"] * SEVERAL, "user"]
    with pytest.raises(ValueError, match="demonstration must be one of"):
        ChatFormat(demonstration="clever")


def test_demonstration_settings_reach_llmgym_eval_and_the_run_file(tmp_path):
    pytest.importorskip("trl")
    from llm_gym.trainer.evaluate import build_parser, chat_settings
    from llm_gym.trainer.output import RUN_FILE

    (tmp_path / RUN_FILE).write_text(json.dumps({"demonstration": "solver", "include_instructions": False}))
    a = build_parser().parse_args(["--model", str(tmp_path)])
    chat = chat_settings(a)
    assert chat["demonstration"] == "solver" and chat["include_instructions"] is False
    a = build_parser().parse_args(["--model", str(tmp_path), "--demonstration", "placeholder"])
    assert chat_settings(a)["demonstration"] == "placeholder"


def test_probe_quick_mode_prints_a_table_and_writes_only_where_told(tmp_path, capsys):
    pytest.importorskip("trl")
    spec = importlib.util.spec_from_file_location(
        "demonstration_probe", ROOT / "benchmarks" / "demonstration_probe.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["demonstration_probe"] = mod
    spec.loader.exec_module(mod)
    out = tmp_path / "probe.json"
    res = mod.main(
        ["--quick", "--envs", "FrozenLake", "--demonstrations", "none", "several", "--out", str(out)]
    )
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(res)) and set(saved["envs"]["FrozenLake"]["kinds"]) == {
        "none",
        "several",
    }
    assert saved["seeds"] == [5000, 5001] and "| FrozenLake | several |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="below the held-out seeds"):
        mod.main(["--quick", "--seed", "199999"])


def test_a_family_without_an_expert_shows_its_own_example_answer():
    from tests.test_family_knowledge import _Free  # a free-text env that overrides none of the family hooks

    env = _Free(max_turns=1)
    for kind in ("solver", "several"):
        (_, answer) = example_exchange(env, ChatFormat(one_shot=True, demonstration=kind))
        assert answer["content"] == env.example_response()
