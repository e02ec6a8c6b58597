import json

import numpy as np
import pytest

from llm_gym.agent.records import EpisodeRecord, TurnRecord, read_records, write_records


def test_roundtrip(tmp_path):
    rec = EpisodeRecord(
        env_id="llmgym/Bandit-v0",
        seed=3,
        initial_observation="arms",
        env_kwargs={"split": "test"},
        turns=[
            TurnRecord(
                response="<answer>A</answer>",
                observation="A: 1 points",
                reward=1.0,
                actions=["A"],
                info={"success": True, "pos": (1, np.int64(2)), "x": float("nan")},
            )
        ],
        meta={"step": 4},
    )
    path = tmp_path / "ep.jsonl"
    assert write_records(path, [rec, rec]) == 2
    back = read_records(path)
    assert len(back) == 2 and back[0].turns[0].info["pos"] == [1, 2] and back[0].turns[0].info["x"] == "nan"
    assert back[0].success and back[0].total_reward == 1.0 and back[0].meta == {"step": 4}
    line = json.loads(path.read_text().splitlines()[0])
    assert line["success"] is True and line["version"] == 1


def test_bad_line_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"env_id": "x", "seed": 1, "initial_observation": ""}\n{"nope": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_records(path)


def test_unknown_turn_keys_are_ignored(tmp_path):
    path = tmp_path / "new.jsonl"
    path.write_text(
        '{"env_id": "x", "seed": 1, "initial_observation": "", '
        '"turns": [{"response": "r", "observation": "o", "reward": 0.5, "future_key": 1}]}\n'
    )
    (rec,) = read_records(path)
    assert rec.turns[0].reward == 0.5
