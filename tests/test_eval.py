"""llmgym-eval: statistics, resume, errors, HF path (the OpenAI-compatible endpoint: test_endpoint.py)."""

import json
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llm_gym.trainer.evaluate import (
    EPISODES_FILE,
    SUMMARY_FILE,
    evaluate,
    format_table,
    main,
    pass_at_k,
    resolve_env_id,
    summarize_env,
    wilson_interval,
)
from llm_gym.trainer.policies import SamplingParams

from llm_gym.agent.records import read_records

GOOD = "<think>go right</think><answer>Right</answer>"
FP = {"model": "scripted", "endpoint": None, "temperature": 0.5, "top_p": 1.0, "max_new_tokens": 8}


# ------------------------------------------------------------------------------------------------ statistics
def test_wilson_known_values():
    lo, hi = wilson_interval(5, 10)
    assert math.isclose(lo, 0.2366, abs_tol=1e-4) and math.isclose(hi, 0.7634, abs_tol=1e-4)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and math.isclose(hi, 0.2775, abs_tol=1e-4)
    lo, hi = wilson_interval(10, 10)
    assert math.isclose(lo, 0.7225, abs_tol=1e-4) and hi == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    with pytest.raises(ValueError):
        wilson_interval(1, 2, z=0)


@given(n=st.integers(1, 500), data=st.data())
def test_wilson_contains_estimate_and_narrows(n, data):
    c = data.draw(st.integers(0, n))
    lo, hi = wilson_interval(c, n)
    assert 0.0 <= lo <= c / n <= hi <= 1.0
    lo4, hi4 = wilson_interval(4 * c, 4 * n)
    assert hi4 - lo4 <= hi - lo + 1e-12


def test_pass_at_k_known_values():
    assert math.isclose(pass_at_k(5, 2, 1), 0.4)
    assert math.isclose(pass_at_k(5, 2, 2), 0.7)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 4, 2) == 1.0
    assert pass_at_k(5, 0, 3) == 0.0
    with pytest.raises(ValueError, match="samples"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


@given(n=st.integers(1, 30), data=st.data())
def test_pass_at_k_properties(n, data):
    c = data.draw(st.integers(0, n))
    assert math.isclose(pass_at_k(n, c, 1), c / n)
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:]))
    assert values[-1] == (1.0 if c else 0.0)


def test_resolve_env_id():
    assert resolve_env_id("FrozenLake") == "llmgym/FrozenLake-v0"
    assert resolve_env_id("sokoban") == "llmgym/Sokoban-v0"
    assert resolve_env_id("llmgym/Bandit-v0") == "llmgym/Bandit-v0"
    assert resolve_env_id("FrozenLake8x8-v0") == "llmgym/FrozenLake8x8-v0"
    with pytest.raises(ValueError, match="choose a short name such as FrozenLake"):
        resolve_env_id("Pong")


# ------------------------------------------------------------------------------------------------ resume
class CountingPolicy:
    """Always moves right; counts the episodes it was asked to play on their first turn."""

    def __init__(self, max_episodes=None):
        self.first_turns = 0
        self.max_episodes = max_episodes

    def __call__(self, batch):
        new = sum(1 for chat in batch if len(chat) == 2)  # system + first state
        if self.max_episodes is not None and self.first_turns + new > self.max_episodes:
            raise KeyboardInterrupt("simulated interruption")
        self.first_turns += new
        return [GOOD] * len(batch)


def test_resume_skips_done_episodes(tmp_path):
    out = tmp_path / EPISODES_FILE
    env = ["llmgym/FrozenLakeDeterministic-v0"]
    interrupted = CountingPolicy(max_episodes=3)
    with pytest.raises(KeyboardInterrupt):
        evaluate(
            interrupted, env, [0, 1, 2], samples=2, output=out, fingerprint=FP, batch_size=2, progress=False
        )
    done_before = read_records(out)
    assert len(done_before) == 2  # the first batch of 2 was written; the second was interrupted
    with pytest.raises(ValueError, match="--resume"):
        evaluate(CountingPolicy(), env, [0, 1, 2], samples=2, output=out, fingerprint=FP, progress=False)
    policy = CountingPolicy()
    result = evaluate(
        policy,
        env,
        [0, 1, 2],
        samples=2,
        output=out,
        fingerprint=FP,
        resume=True,
        batch_size=2,
        progress=False,
    )
    assert policy.first_turns == 6 - len(done_before)
    assert result["episodes_resumed"] == len(done_before) and result["episodes_played"] == policy.first_turns
    records = read_records(out)
    keys = sorted((r.seed, r.meta["sample"]) for r in records)
    assert keys == [(s, k) for s in (0, 1, 2) for k in (0, 1)]
    assert result["per_env"][env[0]]["episodes"] == 6
    # The summary matches a fresh run of the same deterministic policy.
    fresh = evaluate(CountingPolicy(), env, [0, 1, 2], samples=2, output=tmp_path / "b.jsonl", fingerprint=FP)
    assert fresh["per_env"] == result["per_env"]


def test_resume_refuses_other_settings(tmp_path):
    out = tmp_path / EPISODES_FILE
    env = ["llmgym/Bandit-v0"]
    evaluate(CountingPolicy(), env, [0], output=out, fingerprint=FP, progress=False)
    with pytest.raises(ValueError, match="temperature"):
        evaluate(CountingPolicy(), env, [0], output=out, fingerprint={**FP, "temperature": 1.0}, resume=True)
    with pytest.raises(ValueError, match="env_kwargs"):
        evaluate(
            CountingPolicy(), env, [0], output=out, fingerprint=FP, env_kwargs={"max_turns": 2}, resume=True
        )
    assert (
        evaluate(CountingPolicy(), env, [0], output=out, fingerprint=FP, resume=True)["episodes_resumed"] == 1
    )


def test_default_seeds_are_validation_seeds_not_training_seeds():
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.evaluate import build_parser

    start = build_parser().parse_args(["--model", "m"]).eval_seed
    defaults = {f.name: f.default for f in LLMGymGRPOConfig.__dataclass_fields__.values()}
    assert start == defaults["eval_seed"] == 123 and start != defaults["train_seed"]


class ContextLengths:
    """Answers without tags (so episodes run to max_turns) and records each context's message count."""

    def __init__(self):
        self.lengths = []

    def __call__(self, batch):
        self.lengths += [len(chat) for chat in batch]
        return ["no tags"] * len(batch)


def test_history_window_limits_the_eval_context(tmp_path, capsys):
    from llm_gym.agent.chat import ChatFormat

    env, kw = ["llmgym/FrozenLakeDeterministic-v0"], {"max_turns": 4}
    full, windowed = ContextLengths(), ContextLengths()
    evaluate(full, env, [0], output=tmp_path / "a.jsonl", fingerprint=FP, env_kwargs=kw, progress=False)
    evaluate(
        windowed,
        env,
        [0],
        output=tmp_path / "b.jsonl",
        fingerprint=FP,
        env_kwargs=kw,
        chat=ChatFormat(history_window=1),
        progress=False,
    )
    assert len(full.lengths) == len(windowed.lengths) == 4
    assert max(windowed.lengths) < max(full.lengths)
    assert main(["--model", "x/y", "--history_window", "0", "--output_dir", str(tmp_path)]) == 2
    assert "--history_window" in capsys.readouterr().err
    # the old dashed spelling still parses (hidden, deprecated) and reaches the same check
    assert main(["--model", "x/y", "--history-window", "0", "-o", str(tmp_path)]) == 2
    assert "--history_window must be >= 1" in capsys.readouterr().err


def test_eval_flags_are_snake_case_with_hidden_dashed_aliases(capsys):
    from llm_gym.trainer.evaluate import build_parser

    parser = build_parser()
    help_text = parser.format_help()
    assert (
        "--num_eval_seeds" in help_text and "--num-eval-seeds" not in help_text and "exit codes" in help_text
    )
    new = parser.parse_args(["--model", "m", "--num_eval_seeds", "3", "--samples_per_seed", "2", "-o", "d"])
    old = parser.parse_args(
        ["--model", "m", "--num-eval-seeds", "3", "--samples-per-seed", "2", "--output-dir", "d"]
    )
    assert vars(new) == vars(old) and new.num_eval_seeds == 3 and new.output_dir == "d"


@pytest.mark.parametrize(
    "old, new, value",
    [
        ("--seed_start", "--eval_seed", "7"),
        ("--seed-start", "--eval_seed", "7"),
        ("--num_seeds", "--num_eval_seeds", "3"),
        ("--num-seeds", "--num_eval_seeds", "3"),
        ("--overwrite", "--overwrite_output_dir", None),
    ],
)
def test_old_eval_flag_names_warn_and_work(old, new, value, capsys):
    """The names llmgym-eval used before the shared options are deprecated aliases: same result, one line on
    stderr naming the new flag, hidden from --help."""
    from llm_gym.trainer.evaluate import build_parser

    parser = build_parser()
    given = [old] if value is None else [old, value]
    current = [new] if value is None else [new, value]
    via_old = parser.parse_args(["--model", "m", *given])
    err = capsys.readouterr().err
    assert f"llmgym-eval: {old} is deprecated" in err and f"use {new} " in err
    via_new = parser.parse_args(["--model", "m", *current])
    assert "deprecated" not in capsys.readouterr().err
    assert vars(via_old) == vars(via_new) != vars(parser.parse_args(["--model", "m"]))
    assert not re.search(re.escape(old) + r"\b(?![_-])", parser.format_help())


def test_deprecated_overwrite_still_excludes_resume(capsys):
    from llm_gym.trainer.evaluate import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "m", "--resume", "--overwrite"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_eval_turn_limits_are_env_kwargs_as_in_training(tmp_path, capsys):
    """--max_turns and the other limits of llmgym-train work in llmgym-eval too; --env_kwargs wins over them."""
    from llm_gym.trainer.evaluate import _check_args, build_parser

    parse = build_parser().parse_args
    _, kw, _ = _check_args(parse(["--model", "m", "--env", "Bandit", "--max_turns", "3", "--think", "false"]))
    assert kw == {"max_turns": 3, "think": False}
    _, kw, _ = _check_args(parse(["--model", "m", "--max_turns", "3", "--env_kwargs", '{"max_turns": 2}']))
    assert kw == {"max_turns": 2}
    assert main(["--model", "m", "--max_turns", "0", "-o", str(tmp_path)]) == 2
    assert "max_turns must be a positive integer" in capsys.readouterr().err


def test_summary_and_table():
    from llm_gym.agent.records import EpisodeRecord, TurnRecord

    def rec(seed, success):
        info = {"success": success, "action_is_valid": True, "action_is_effective": True}
        return EpisodeRecord("llmgym/X-v0", seed, "", turns=[TurnRecord("r", "o", float(success), info=info)])

    records = [rec(0, True), rec(0, False), rec(1, False), rec(1, False)]
    s = summarize_env(records, ks=[1, 2, 3])
    assert s["success_rate"] == 0.25 and s["seeds"] == 2 and s["samples_per_seed"] == 2
    assert math.isclose(s["pass@1"], 0.25) and math.isclose(s["pass@2"], 0.5)
    assert "pass@3" not in s  # needs 3 samples per seed
    assert s["valid_action_rate"] == 1.0 and s["mean_turns"] == 1.0
    table = format_table({"llmgym/X-v0": s})
    assert "X-v0" in table and "pass@2" in table and "0.250" in table


# ------------------------------------------------------------------------------------------------ CLI
# The endpoint (OpenAIPolicy against a fake server) is tested in test_endpoint.py.
def test_cli_fails_early_with_clear_messages(tmp_path, capsys):
    base = ["--env", "FrozenLake", "--num-seeds", "1", "--output-dir", str(tmp_path), "--no-progress"]
    assert main(["--model", str(tmp_path / "missing_model"), *base]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--model", "x/y", "--env", "Pong", "--output-dir", str(tmp_path)]) == 2
    assert "unknown environment" in capsys.readouterr().err
    assert main(["--model", "x/y", "--k", "3", "--output-dir", str(tmp_path)]) == 2
    assert "--k" in capsys.readouterr().err
    assert not (tmp_path / EPISODES_FILE).exists()


def test_sampling_params_validation():
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=0)


# ------------------------------------------------------------------------------------------------ HF model
def test_hf_policy_batched_matches_single(tiny_dir):
    from llm_gym.trainer.policies import HFPolicy

    policy = HFPolicy.from_pretrained(
        tiny_dir, SamplingParams(temperature=0.0, max_new_tokens=6), device="cpu"
    )
    chats = [
        [{"role": "system", "content": "You play FrozenLake."}, {"role": "user", "content": "State: P _ G"}],
        [{"role": "user", "content": "Turn 1"}],
    ]
    batched = policy(chats)
    assert len(batched) == 2 and all(isinstance(t, str) for t in batched)
    assert batched == [policy([c])[0] for c in chats]  # left padding does not change greedy replies
    assert policy([]) == []


def test_hf_eval_on_tiny_model(tiny_dir, tmp_path, capsys):
    out_dir = tmp_path / "ev"
    args = ["--model", tiny_dir, "--env", "FrozenLake", "--num-eval-seeds", "2", "--max-new-tokens", "8"]
    args += ["--output-dir", str(out_dir), "--no-progress", "--device", "cpu"]
    assert main(args) == 0
    summary = json.loads((out_dir / SUMMARY_FILE).read_text())
    fl = summary["envs"]["llmgym/FrozenLake-v0"]
    assert fl["episodes"] == 2 and 0.0 <= fl["success_ci"][0] <= fl["success_ci"][1] <= 1.0
    records = read_records(out_dir / EPISODES_FILE)
    assert sorted(r.seed for r in records) == [123, 124]  # RAGEN validation seeds, not training seeds
    assert all(r.meta["eval"]["model"] == tiny_dir for r in records)
    assert main(args) == 2  # the file exists: refuse without --resume / --overwrite_output_dir
    assert main([*args, "--resume"]) == 0
    assert len(read_records(out_dir / EPISODES_FILE)) == 2  # nothing replayed
