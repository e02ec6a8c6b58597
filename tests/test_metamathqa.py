"""MetaMathQAEnv: data sources, answer checking, retries, offline behaviour, determinism, fuzzing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.core import AnyText
from llm_gym.envs import task_data
from llm_gym.envs.metamathqa.env import INCORRECT_TEXT, SAMPLE_PATH, MetaMathQAEnv
from llm_gym.envs.metamathqa.math_check import extract_gold


def answer(text: str) -> str:
    return f"<think>ok</think><answer>{text}</answer>"


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("llmgym/MetaMathQA-v0", {"dataset": "sample"}),
        ("llmgym/MetaMathQASample-v0", {}),
        ("llmgym/MetaMathQA-v0", {"dataset": "sample", "max_attempts": 3}),
    ],
)
def test_check_env(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    check_env(env.unwrapped)
    assert isinstance(env.observation_space, AnyText)
    env.close()


def test_sample_file_schema_and_gold_answers():
    rows = [json.loads(line) for line in SAMPLE_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) >= 30
    golds = []
    for row in rows:
        assert set(row) == {"query", "response", "type"}
        assert row["response"].rstrip().splitlines()[-1].startswith("The answer is: ")
        golds.append(extract_gold(row["response"]))
    assert all(golds)
    # The sample covers the answer spellings the checker must handle.
    assert any("\\frac" in g for g in golds) and any("," in g for g in golds)
    assert any(g.startswith("-") for g in golds) and any("." in g for g in golds)


def test_every_sample_item_accepts_its_gold_answer():
    env = MetaMathQAEnv(dataset="sample")
    for i in range(len(env.data)):
        _, info = env.reset(options={"index": i})
        gold = info["gold_answer"]
        obs, reward, term, trunc, step_info = env.step(answer(f"\\boxed{{{gold}}}"))
        assert (obs, reward, term, trunc, step_info["success"]) == ("Correct!", 1.0, True, False, True), gold
        env.reset(options={"index": i})
        assert env.step(answer(gold))[1] == 1.0


def test_numeric_equivalence_in_env():
    env = MetaMathQAEnv(dataset="sample")
    golds = {extract_gold(env.data[i]["response"]): i for i in range(len(env.data))}
    for gold, pred in [
        ("\\frac{1}{2}", "0.5"),
        ("1,200", "1200"),
        ("-3", "-3.0"),
        ("7.5", "15/2"),
        ("84", "84 dollars"),
    ]:
        env.reset(options={"index": golds[gold]})
        assert env.step(answer(pred))[1] == 1.0, (gold, pred)
        strict = MetaMathQAEnv(dataset="sample", strict=True)
        strict.reset(options={"index": golds[gold]})
        assert strict.step(answer(pred))[1] == 0.0, (gold, pred)


def test_single_attempt_default():
    env = MetaMathQAEnv(dataset="sample")
    obs0, info = env.reset(seed=0)
    assert obs0 == env.question and "gold_answer" in info
    assert env.card() == {"title": "MetaMathQA", "question": obs0, "answer": "", "verdict": ""}
    obs, reward, term, trunc, info = env.step(answer("definitely wrong"))
    assert (obs, reward, term, trunc, info["success"]) == (INCORRECT_TEXT, 0.0, True, False, False)
    assert env.card()["verdict"] == "incorrect (attempt 1/1)"
    assert env.max_turns == 5 and env.max_actions == 1


def test_retries_halve_the_reward():
    env = gym.make("llmgym/MetaMathQA-v0", dataset="sample", max_attempts=3)
    _, info = env.reset(seed=4)
    gold = info["gold_answer"]
    _, reward, term, trunc, info = env.step(answer("wrong"))
    assert (reward, term, trunc, info["attempts"]) == (0.0, False, False, 1)
    # A response without tags uses a turn but not an attempt.
    _, reward, term, trunc, info = env.step("no tags")
    assert (reward, term, trunc, info["attempts"], info["action_is_valid"]) == (-0.1, False, False, 1, False)
    _, reward, term, trunc, info = env.step(answer("wrong again"))
    assert (reward, term, info["attempts"]) == (0.0, False, 2)
    obs, reward, term, trunc, info = env.step(answer(gold))
    assert (obs, reward, term, trunc, info["success"]) == ("Correct!", 0.25, True, False, True)
    assert info["reward_components"]["correct"] == 0.25
    assert env.unwrapped.card()["verdict"] == "correct (0.25)"


def test_running_out_of_attempts_terminates():
    env = MetaMathQAEnv(dataset="sample", max_attempts=2, rewards={"incorrect": -0.5})
    env.reset(seed=1)
    assert env.step(answer("wrong"))[1:4] == (-0.5, False, False)
    _, reward, term, trunc, info = env.step(answer("wrong"))
    assert (reward, term, trunc, info["success"]) == (-0.5, True, False, False)


def test_turn_limit_truncates():
    env = MetaMathQAEnv(dataset="sample", max_attempts=3, max_turns=2)
    env.reset(seed=1)
    env.step("no tags")
    _, _, term, trunc, _ = env.step(answer("wrong"))
    assert (term, trunc) == (False, True)


def test_bad_arguments():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            MetaMathQAEnv(dataset="sample", max_attempts=bad)
    with pytest.raises(ValueError):
        MetaMathQAEnv(dataset="sample", max_actions=3)
    env = MetaMathQAEnv(dataset="sample")
    with pytest.raises(ValueError):
        env.reset(options={"index": len(env.data)})


# ------------------------------------------------------------------------------------------- data files
ROWS = [
    {
        "query": "What is 1+1? Réponds en chiffres ✓ 数学",
        "response": "1+1=2.\nThe answer is: 2",
        "type": "GSM_AnsAug",
    },
    {"query": "Half of 1?", "response": "The answer is: \\frac{1}{2}", "type": "MATH_AnsAug"},
]


@pytest.fixture(autouse=True)
def _fresh_cache():
    yield
    task_data.clear_cache()


def test_local_jsonl(tmp_path):
    path = tmp_path / "mini.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in ROWS), encoding="utf-8")
    env = MetaMathQAEnv(dataset=str(path))
    obs, info = env.reset(options={"index": 0})
    assert obs == ROWS[0]["query"] and env.observation_space.contains(obs)
    assert info["type"] == "GSM_AnsAug"
    assert env.step(answer("2"))[1] == 1.0
    # One load per process: a second env shares the records.
    assert MetaMathQAEnv(dataset=str(path)).data is env.data


def test_local_json_and_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "mini.json").write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "mini.parquet")
    for name in ("mini.json", "mini.parquet"):
        env = MetaMathQAEnv(dataset=tmp_path / name)
        env.reset(options={"index": 1})
        assert env.step(answer("0.5"))[1] == 1.0, name


def test_local_file_errors(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        MetaMathQAEnv(dataset=str(tmp_path / "nope.jsonl"))
    (tmp_path / "fields.jsonl").write_text(json.dumps({"question": "q", "answer": "1"}))
    with pytest.raises(ValueError, match="query"):
        MetaMathQAEnv(dataset=str(tmp_path / "fields.jsonl"))
    (tmp_path / "broken.jsonl").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        MetaMathQAEnv(dataset=str(tmp_path / "broken.jsonl"))
    (tmp_path / "nomarker.jsonl").write_text(json.dumps({"query": "q", "response": "just 4", "type": "x"}))
    env = MetaMathQAEnv(dataset=str(tmp_path / "nomarker.jsonl"))
    with pytest.raises(ValueError, match="The answer is"):
        env.reset(seed=0)


def test_local_files_are_read_with_bounds(tmp_path, monkeypatch):
    from llm_gym import _jsonl

    # Every data file is read through the one bounded JSONL reader (or a bounded read for .json).
    monkeypatch.setattr(task_data, "MAX_FILE_BYTES", 10_000)
    monkeypatch.setattr(task_data, "MAX_JSON_FILE_BYTES", 10_000)
    monkeypatch.setattr(_jsonl, "MAX_LINE_BYTES", 5_000)
    row = json.dumps(ROWS[0])
    (tmp_path / "big.jsonl").write_text("\n".join([row] * (20_000 // len(row))))
    with pytest.raises(ValueError, match="big.jsonl: file larger than 10,000 bytes"):
        MetaMathQAEnv(dataset=str(tmp_path / "big.jsonl"))
    (tmp_path / "big.json").write_text(json.dumps(ROWS * (20_000 // len(row))))
    with pytest.raises(ValueError, match="big.json: file larger than 10,000 bytes"):
        MetaMathQAEnv(dataset=str(tmp_path / "big.json"))
    (tmp_path / "long.jsonl").write_text(json.dumps({**ROWS[0], "query": "q" * 6_000}))
    with pytest.raises(ValueError, match="long.jsonl:1: line longer than 5,000 bytes"):
        MetaMathQAEnv(dataset=str(tmp_path / "long.jsonl"))
    (tmp_path / "digits.jsonl").write_text('{"query": "q", "response": "x", "n": ' + "9" * 4400 + "}")
    with pytest.raises(ValueError, match="digits.jsonl:1: invalid JSON value"):
        MetaMathQAEnv(dataset=str(tmp_path / "digits.jsonl"))


def test_hub_id_offline_error_names_both_ways_out(tmp_path):
    code = textwrap.dedent(
        """
        import gymnasium as gym, llm_gym
        try:
            gym.make("llmgym/MetaMathQA-v0")
        except RuntimeError as e:
            print("ERROR:", e)
        else:
            print("LOADED")
        """
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "ERROR:" in out.stdout, out.stdout + out.stderr
    assert "meta-math/MetaMathQA" in out.stdout
    assert "dataset='path/to/file.jsonl'" in out.stdout and "dataset='sample'" in out.stdout


# ----------------------------------------------------------------------------------------- determinism
_SCRIPT = """
import gymnasium as gym, llm_gym
env = gym.make("llmgym/MetaMathQASample-v0")
for seed in range(30):
    obs, info = env.reset(seed=seed)
    print(info["index"], info["gold_answer"])
"""


def test_determinism_across_processes():
    outs = []
    for hashseed in ("1", "98765"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        res = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr
        outs.append(res.stdout)
    assert outs[0] == outs[1]
    assert len(set(outs[0].splitlines())) > 10  # seeds do pick different items


# -------------------------------------------------------------------------------------------- fuzzing
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(max_size=120), st.text(max_size=20).map(answer)), min_size=1, max_size=4))
def test_step_fuzz(responses):
    env = MetaMathQAEnv(dataset="sample", max_attempts=2)
    env.reset(seed=0)
    for text in responses:
        obs, reward, term, trunc, info = env.step(text)
        assert reward in (1.0, 0.5, 0.0, -0.1)
        assert sum(info["reward_components"].values()) == pytest.approx(reward)
        assert not (term and trunc)
        assert env.observation_space.contains(obs)
        if term or trunc:
            break
