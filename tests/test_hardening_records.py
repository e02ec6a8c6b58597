"""Episode records are untrusted input: one validation with a clear error, and replay never runs code, reads
files named by a record, or hangs on a record's sizes (issue 16, items 1, 11, 12, 14)."""

from __future__ import annotations

import json
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.agent.records import EpisodeRecord, RecordError, read_records, record_episode, write_records
from llm_gym.render.replay import replay_env_args, replay_episode, verify_episode

GOOD = {"env_id": "llmgym/FrozenLakeDeterministic-v0", "seed": 3, "initial_observation": "x", "turns": []}


def _write_lines(path, *lines: bytes) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


# --------------------------------------------------------------------------------- item 12: one validation
@pytest.mark.parametrize(
    "change, why",
    [
        ({"turns": [1]}, r"turns\[0\] must be an object"),
        ({"env_id": 5}, "env_id must be a string"),
        ({"seed": "7"}, "seed must be an integer or null"),
        ({"seed": True}, "seed must be an integer or null"),
        ({"seed": -1}, "seed must be null or an integer in"),
        ({"seed": 2**70}, "seed must be null or an integer in"),
        ({"env_kwargs": [1, 2]}, "env_kwargs must be an object"),
        ({"version": -5}, "version must be an integer >= 1"),
        ({"version": "1"}, "version must be an integer"),
        ({"version": 99}, "newer than this llm-gym"),
        ({"reset_options": "x"}, "reset_options must be an object or null"),
        (
            {"turns": [{"response": 1, "observation": "", "reward": 0}]},
            r"turns\[0\].response must be a string",
        ),
        (
            {"turns": [{"response": "", "observation": "", "reward": "x"}]},
            r"turns\[0\].reward must be a number",
        ),
        ({"turns": [{"response": "", "observation": ""}]}, r"missing turns\[0\].reward"),
        (
            {"turns": [{"response": "", "observation": "", "reward": 0, "terminated": 1}]},
            "terminated must be",
        ),
        ({"turns": [{"response": "", "observation": "", "reward": 0, "actions": [1]}]}, "list of strings"),
    ],
)
def test_malformed_record_is_one_clear_error_naming_the_line(tmp_path, change, why):
    path = tmp_path / "ep.jsonl"
    _write_lines(path, json.dumps(GOOD).encode(), json.dumps({**GOOD, **change}).encode())
    with pytest.raises(ValueError, match=f"ep.jsonl: bad episode record at line 2: .*{why}"):
        read_records(path)


def test_nonfinite_rewards_as_written_read_back():
    rec = EpisodeRecord.from_dict(
        {**GOOD, "turns": [{"response": "a", "observation": "b", "reward": "nan", "reward_components": {}}]}
    )
    assert rec.turns[0].reward != rec.turns[0].reward  # NaN


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20,
)
record_like = st.fixed_dictionaries(
    {},
    optional={
        k: json_values
        for k in (
            "env_id",
            "seed",
            "initial_observation",
            "env_kwargs",
            "reset_options",
            "turns",
            "meta",
            "version",
        )
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, record_like))
def test_arbitrary_json_gives_a_record_or_the_clear_error(value):
    try:
        rec = EpisodeRecord.from_dict(value)
    except RecordError as e:
        assert str(e).startswith("bad episode record: ")
    else:
        assert isinstance(rec.env_id, str) and isinstance(rec.turns, list)


# --------------------------------------------------------------------------- item 14: bytes of the file
def test_bom_is_accepted_and_invalid_utf8_and_deep_json_name_file_and_line(tmp_path):
    path = tmp_path / "ep.jsonl"
    _write_lines(path, b"\xef\xbb\xbf" + json.dumps(GOOD).encode())
    assert read_records(path)[0].seed == 3
    _write_lines(path, json.dumps(GOOD).encode(), b'{"env_id": "\xff"}')
    with pytest.raises(ValueError, match="ep.jsonl: bad episode record at line 2: not valid UTF-8"):
        read_records(path)
    _write_lines(path, b"[" * 100_000)
    with pytest.raises(ValueError, match="at line 1: JSON nested too deeply"):
        read_records(path)


# ---------------------------------------------------------------------------------- item 11: surrogates
def test_lone_surrogates_are_written_and_read_back_exactly(tmp_path):
    rec = record_episode(
        "llmgym/FrozenLakeDeterministic-v0", ["<think>\ud800</think><answer>Left\udfff</answer>"], seed=0
    )
    path = tmp_path / "ep.jsonl"
    assert write_records(path, [rec]) == 1  # used to raise UnicodeEncodeError
    back = read_records(path)[0]
    assert back.turns[0].response == rec.turns[0].response
    assert verify_episode(back) is None


# --------------------------------------------------------------------------- item 1: replay runs no code
def test_module_prefixed_env_id_is_refused_without_importing(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    (tmp_path / "evilmod_hardening.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rec = EpisodeRecord.from_dict({**GOOD, "env_id": "evilmod_hardening:llmgym/Sokoban-v0"})
    for replay in (replay_episode, verify_episode):
        with pytest.raises(ValueError, match="not an llm-gym id"):
            replay(rec)
    assert not marker.exists() and "evilmod_hardening" not in sys.modules


def test_other_registered_gymnasium_ids_are_refused():
    with pytest.raises(ValueError, match="not an llm-gym id"):
        replay_env_args(EpisodeRecord.from_dict({**GOOD, "env_id": "CartPole-v1"}))


@pytest.mark.parametrize("path", ["/dev/zero", "../../etc/passwd", "/etc/passwd"])
def test_file_kwargs_from_a_record_are_refused_without_reading(path):
    rec = EpisodeRecord.from_dict(
        {**GOOD, "env_id": "llmgym/SokobanFile-v0", "env_kwargs": {"level_file": path}}
    )
    start = time.perf_counter()
    with pytest.raises(ValueError, match="file paths are not taken from a record") as err:
        verify_episode(rec)
    assert time.perf_counter() - start < 2
    assert "root" not in str(err.value)  # nothing of the file's content


def _user_level_file_record(tmp_path):
    """A copy of the bundled Sokoban sample in ``tmp_path`` and a one-turn record played on it (seed 1)."""
    from llm_gym.envs.sokoban.level import sample_path

    level_file = tmp_path / "levels.xsb"
    level_file.write_text(sample_path().read_text())
    rec = record_episode(
        "llmgym/SokobanFile-v0",
        ["<think>.</think><answer>Up</answer>"],
        seed=1,
        env_kwargs={"level_file": str(level_file)},
    )
    return level_file, rec


def test_file_kwargs_given_by_the_user_are_used(tmp_path):
    level_file, rec = _user_level_file_record(tmp_path)
    with pytest.raises(ValueError, match="file paths are not taken"):
        verify_episode(rec)
    assert verify_episode(rec, env_kwargs={"level_file": str(level_file)}) is None
    # the bundled sample is not a path and replays from the record alone
    sample = record_episode("llmgym/SokobanFile-v0", ["<think>.</think><answer>Up</answer>"], seed=1)
    assert verify_episode(sample) is None


def test_unknown_and_oversized_kwargs_are_refused_quickly():
    for kwargs, why in (
        ({"bogus": 1}, "which takes only"),
        ({"dim_room": [3000, 3000]}, "at most 100x100"),
        ({"size": 10_000}, "size must be an integer in"),
        ({"think": "false"}, "think must be True or False"),
        ({"p": None}, "p \\(frozen probability\\) must be a number"),
    ):
        env_id = "llmgym/Sokoban-v0" if "dim_room" in kwargs else "llmgym/FrozenLake-v0"
        rec = EpisodeRecord.from_dict({**GOOD, "env_id": env_id, "env_kwargs": kwargs})
        start = time.perf_counter()
        with pytest.raises(ValueError, match=why):
            verify_episode(rec)
        assert time.perf_counter() - start < 2


def test_cli_render_refuses_a_record_file_path_and_accepts_the_users(tmp_path, capsys):
    pytest.importorskip("pygame")
    pytest.importorskip("imageio")
    from llm_gym.cli import main

    level_file, rec = _user_level_file_record(tmp_path)
    path = tmp_path / "ep.jsonl"
    write_records(path, [rec])
    out = tmp_path / "ep.gif"
    assert main(["render", str(path), "--out", str(out)]) in (1, 2)  # an error exit (runtime or usage)
    assert "file paths are not taken from a record" in capsys.readouterr().err and not out.exists()
    kwargs = json.dumps({"level_file": str(level_file)})
    assert main(["render", str(path), "--out", str(out), "--env_kwargs", kwargs]) == 0
    assert out.stat().st_size > 0


# ------------------------------------------------------------ review: untrusted input never ends in a traceback
def test_huge_integer_seed_is_a_record_error_naming_file_and_line(tmp_path):
    from llm_gym.agent.export import read_jsonl

    path = tmp_path / "ep.jsonl"
    # json.loads raises a plain ValueError (not JSONDecodeError) past Python's 4,300-digit int limit.
    _write_lines(path, json.dumps(GOOD).encode(), b'{"env_id": "x", "seed": ' + b"9" * 5000 + b"}")
    with pytest.raises(RecordError, match="ep.jsonl: bad episode record at line 2: .*digits") as info:
        read_records(path)
    assert len(str(info.value)) < 400  # the 5,000 digits are not echoed
    with pytest.raises(ValueError, match="ep.jsonl:2: .*digits"):
        list(read_jsonl(path))


def test_record_line_over_the_cap_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    from llm_gym import _jsonl
    from llm_gym.agent.export import read_jsonl

    monkeypatch.setattr(_jsonl, "MAX_LINE_BYTES", 4096)
    path = tmp_path / "ep.jsonl"
    _write_lines(path, json.dumps(GOOD).encode(), b'{"env_id": "' + b"x" * 100_000 + b'"}')
    with pytest.raises(RecordError, match="at line 2: line longer than 4,096 bytes"):
        read_records(path)
    with pytest.raises(ValueError, match="ep.jsonl:2: line longer than 4,096 bytes"):
        list(read_jsonl(path))


def test_record_line_of_40_mb_is_a_quick_record_error(tmp_path):
    path = tmp_path / "ep.jsonl"
    path.write_bytes(b'{"env_id": "' + b"x" * 40_000_000 + b'"}\n')
    start = time.perf_counter()
    with pytest.raises(RecordError, match="line longer than"):
        read_records(path)
    assert time.perf_counter() - start < 2  # was ~5 s and ~130 MB: the whole line was decoded and parsed


def test_env_failing_at_reset_with_runtime_error_is_a_value_error(monkeypatch):
    from llm_gym.envs.sokoban import env as sokoban_env

    def broken(*args, **kwargs):
        raise RuntimeError("generator gave up")

    monkeypatch.setattr(sokoban_env, "generate_level", broken)
    rec = EpisodeRecord.from_dict({**GOOD, "env_id": "llmgym/Sokoban-v0"})
    with pytest.raises(ValueError, match="cannot reset llmgym/Sokoban-v0 .*generator gave up"):
        replay_episode(rec, draw=False)


def test_unavailable_hub_dataset_is_a_value_error_for_replay(monkeypatch):
    from llm_gym.envs import task_data

    assert issubclass(task_data.DatasetUnavailableError, ValueError)
    assert issubclass(task_data.DatasetUnavailableError, RuntimeError)  # callers that caught it still do

    def offline(name, split, hint):
        raise task_data.DatasetUnavailableError(f"could not load the dataset {name!r}")

    monkeypatch.setattr(task_data, "_load_hub", offline)
    # a record may name the hub data set where it is the id's own default (MetaMathQA-v0's), not elsewhere
    rec = EpisodeRecord.from_dict(
        {**GOOD, "env_id": "llmgym/MetaMathQA-v0", "env_kwargs": {"dataset": "meta-math/MetaMathQA"}}
    )
    with pytest.raises(ValueError, match="could not load the dataset"):
        replay_episode(rec, draw=False)
    rec = EpisodeRecord.from_dict({**rec.to_dict(), "env_id": "llmgym/MetaMathQASample-v0"})
    with pytest.raises(ValueError, match="file paths are not taken from a record"):
        replay_episode(rec, draw=False)


def test_cli_render_reports_env_errors_without_traceback(tmp_path, capsys, monkeypatch):
    from llm_gym.cli import main
    from llm_gym.envs.sokoban import env as sokoban_env

    def broken(*args, **kwargs):
        raise RuntimeError("generator gave up")

    monkeypatch.setattr(sokoban_env, "generate_level", broken)
    path = tmp_path / "ep.jsonl"
    _write_lines(path, json.dumps({**GOOD, "env_id": "llmgym/Sokoban-v0"}).encode())
    assert main(["render", str(path), "--out", str(tmp_path / "ep.gif")]) in (1, 2)
    err = capsys.readouterr().err
    assert "generator gave up" in err and "Traceback" not in err
