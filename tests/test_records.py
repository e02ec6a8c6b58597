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
    with pytest.raises(ValueError, match="bad.jsonl: bad episode record at line 2: "):
        read_records(path)


def test_unknown_turn_keys_are_ignored(tmp_path):
    path = tmp_path / "new.jsonl"
    path.write_text(
        '{"env_id": "x", "seed": 1, "initial_observation": "", '
        '"turns": [{"response": "r", "observation": "o", "reward": 0.5, "future_key": 1}]}\n'
    )
    (rec,) = read_records(path)
    assert rec.turns[0].reward == 0.5


def test_from_reset_is_the_one_record_builder():
    import gymnasium as gym

    import llm_gym  # noqa: F401

    env = gym.make("llmgym/FrozenLakeDeterministic-v0", render_mode="rgb_array", max_turns=3)
    obs, _ = env.reset(seed=4, options={"map": ["SF", "FG"]})
    kwargs = {"render_mode": "rgb_array", "max_turns": 3}
    options, meta = {"map": ["SF", "FG"]}, {"policy": "x"}
    rec = EpisodeRecord.from_reset(
        env,
        "llmgym/FrozenLakeDeterministic-v0",
        np.int64(4),
        obs,
        env_kwargs=kwargs,
        reset_options=options,
        meta=meta,
    )
    assert rec.env_kwargs == {"max_turns": 3}  # how it was shown is not part of the episode
    assert type(rec.seed) is int and rec.seed == 4
    assert rec.instructions == env.unwrapped.instructions and rec.instructions
    assert rec.initial_observation == obs and rec.turns == []
    # The record owns copies: later changes to the caller's mappings do not leak into it.
    kwargs["max_turns"], options["map"], meta["policy"] = 9, None, "y"
    assert (
        rec.env_kwargs == {"max_turns": 3}
        and rec.reset_options == {"map": ["SF", "FG"]}
        and rec.meta == {"policy": "x"}
    )
    assert EpisodeRecord.from_reset(env, "x", None, obs).seed is None
    env.close()


def test_every_record_site_builds_the_same_record():
    # Agent rollout, play and replay's record_episode must agree on everything but their own meta.
    from llm_gym.agent.records import record_episode
    from llm_gym.agent.rollout import rollout
    from llm_gym.core import format_response
    from llm_gym.render.play import PlaySession

    env_id, seed, moves = "llmgym/FrozenLakeDeterministic-v0", 3, ["Right", "Down"]
    kwargs = {"max_turns": 2}  # the episode ends after the two scripted responses
    session = PlaySession(env_id, seed=seed, env_kwargs=kwargs)
    for move in moves:
        session.send(move)
    played = session.record
    session.close()
    responses = [t.response for t in played.turns]
    assert responses == [session.response_for(m) for m in moves] and responses[0] != format_response(
        ["Right"], ""
    )

    scripted = iter(responses)
    (rolled,) = rollout(env_id, [seed], lambda batch: [next(scripted) for _ in batch], env_kwargs=kwargs)
    recorded = record_episode(env_id, responses, seed=seed, env_kwargs=kwargs)

    def core(rec: EpisodeRecord) -> dict:
        d = rec.to_dict()
        d.pop("meta")
        return d

    assert core(played) == core(rolled) == core(recorded)
    assert played.meta == {"policy": "human"} and rolled.meta == {"group": 0, "group_index": 0}
