"""Hardening, round two (issue 24): one regression test per defect of the second reliability probe, each its
reproduction at a small size (a lowered cap where the real one is large; real-size checks are marked slow).

N1/N10 output files never follow links; N2 records always fit their reader; N4/N5/N11/N12/N13 ``llmgym export``
costs and trust; N6/N7/N8 chat templates and model files are untrusted; N9 records read one at a time; N14 data
files bounded in rows; N15-N17 messages and round trips; D17-D19 leftovers; the "not counted" notes; benchmarks
never write into docs/; no deprecation noise from our calls. (N3, resume at max_steps and an atomic final/, is
in ``test_hardening_output.py``, next to the trained run it reuses.)
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import time
import tokenize
import tracemalloc
import warnings
from pathlib import Path

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym import _jsonl, safe_io
from llm_gym.agent import records as records_mod
from llm_gym.agent.records import (
    EpisodeRecord,
    RecordFile,
    TurnRecord,
    read_records,
    record_episode,
    write_records,
)
from llm_gym.cli import main as llmgym
from llm_gym.core.parsing import RESPONSE_MAX_LENGTH
from llm_gym.render.replay import verify_episode
from llm_gym.safe_io import LOCK_FILE, OutputLock, UnsafeOutputError, append_text

REPO = Path(__file__).resolve().parents[1]
FL = "llmgym/FrozenLakeDeterministic-v0"


def _record(i: int, text: str = "") -> EpisodeRecord:
    rec = EpisodeRecord(env_id="llmgym/Bandit-v0", seed=i, initial_observation=f"obs {i}{text}")
    rec.turns.append(TurnRecord("<answer>A</answer>", "done", 1.0, terminated=True, info={"success": True}))
    return rec


# ------------------------------------------------------------------------------------ N1, N10: never follow links
def test_n1_a_planted_lock_link_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).symlink_to("../victim.txt")
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        OutputLock(run).acquire()
    assert victim.read_text() == "precious\n"
    (run / LOCK_FILE).unlink()
    os.link(victim, run / LOCK_FILE)  # a hard link to the user's file is refused too
    with pytest.raises(UnsafeOutputError, match="hard links"):
        OutputLock(run).acquire()
    assert victim.read_text() == "precious\n"
    (run / LOCK_FILE).unlink()
    os.mkfifo(run / LOCK_FILE)  # nor does a FIFO block the run
    with pytest.raises(UnsafeOutputError, match="not a regular file"):
        OutputLock(run).acquire()


def test_n1_train_and_eval_refuse_a_linked_lock_in_one_line(tiny_dir, tmp_path, capsys, monkeypatch):
    import llm_gym.trainer.cli as train_cli
    import llm_gym.trainer.evaluate as ev

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).symlink_to(victim)
    monkeypatch.setattr(ev, "make_policy", lambda a: pytest.fail("the model must not load"))
    assert (
        ev.main(["--model", "m", "--env", "Bandit", "--num_eval_seeds", "1", "-o", str(run), "--no_progress"])
        == 1
    )
    monkeypatch.setattr(train_cli, "run", lambda *a: pytest.fail("the model must not load"))
    assert (
        train_cli.main(["--env", "Bandit", "--model", str(tiny_dir), "-o", str(run), "--max_steps", "1"]) == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("refusing to write through a symbolic link" in e for e in err)
    assert victim.read_text() == "precious\n"


def test_n10_records_are_never_appended_or_cut_through_a_link(tmp_path):
    other = tmp_path / "OTHER.jsonl"
    write_records(other, [_record(0)])
    other.write_bytes(other.read_bytes() + b'{"env_id": "llmgym/Ban')  # a torn last line
    before = other.read_bytes()
    out = tmp_path / "out"
    out.mkdir()
    (out / "episodes.jsonl").symlink_to(other)
    with pytest.raises(UnsafeOutputError):
        records_mod.repair_torn_tail(out / "episodes.jsonl")
    with pytest.raises(UnsafeOutputError):
        write_records(out / "episodes.jsonl", [_record(1)])
    (out / "dangling.jsonl").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafeOutputError):  # a dangling link is no better: it would create its target
        append_text(out / "dangling.jsonl", "x\n")
    assert other.read_bytes() == before and not (tmp_path / "nowhere").exists()


def test_n10_eval_resume_refuses_a_linked_records_file(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    import llm_gym.trainer.evaluate as ev

    good = "<think>x</think><answer>Right</answer>"
    monkeypatch.setattr(ev, "make_policy", lambda a: (lambda batch: [good] * len(batch), "scripted"))
    args = [
        "--model",
        "scripted",
        "--env",
        "FrozenLakeDeterministic",
        "--num_eval_seeds",
        "2",
        "--no_progress",
    ]
    assert ev.main([*args, "-o", str(tmp_path / "first")]) == 0
    other = tmp_path / "OTHER.jsonl"
    shutil.copy(tmp_path / "first" / "episodes.jsonl", other)
    other.write_bytes(other.read_bytes() + b'{"env_id": "llmgym/Fro')
    before = other.read_bytes()
    out = tmp_path / "out"
    out.mkdir()
    (out / "episodes.jsonl").symlink_to(other)
    assert ev.main([*args, "-o", str(out), "--resume"]) == 1
    err = capsys.readouterr().err.strip()
    assert "symbolic link" in err and len(err.splitlines()) == 1
    assert other.read_bytes() == before


def test_n1_train_resume_refuses_a_linked_records_file(tmp_path):
    from types import SimpleNamespace

    from llm_gym.trainer.output import reconcile_after_resume

    other = tmp_path / "OTHER.jsonl"
    write_records(other, [_record(0)])
    before = other.read_bytes()
    out = tmp_path / "run"
    out.mkdir()
    (out / "episodes.jsonl").symlink_to(other)
    config = SimpleNamespace(
        output_dir=str(out), episode_records="episodes.jsonl", collapse_report=None, max_steps=4
    )
    with pytest.raises(UnsafeOutputError):
        reconcile_after_resume(config, 1, log=lambda m: None)
    assert other.read_bytes() == before


# ------------------------------------------------------------------------- N2: records always fit their reader
def test_n2_an_overlong_reply_is_stored_cut_and_replays_exactly(tmp_path):
    # the env refuses a reply over RESPONSE_MAX_LENGTH by its length alone, so the first RESPONSE_MAX_LENGTH + 1
    # characters replay the same
    rec = record_episode(FL, ["x" * (2 * RESPONSE_MAX_LENGTH), "<answer>Up</answer>"], seed=1)
    path = tmp_path / "e.jsonl"
    write_records(path, [rec])
    back = read_records(path)[0]
    assert len(back.turns[0].response) < RESPONSE_MAX_LENGTH + 100 and back.meta["cut"] == 1
    assert back.turns[0].response.endswith("[cut by llm-gym: the original had 2,000,000 characters]")
    assert verify_episode(back) is None
    assert rec.turns[0].response == "x" * (2 * RESPONSE_MAX_LENGTH)  # the record in memory is unchanged


@pytest.mark.parametrize("text", ["x", "é", "\u2603", "\ud800", "\U0001f600", "\x01"])
def test_n2_a_record_line_never_exceeds_the_readers_cap(tmp_path, monkeypatch, text):
    monkeypatch.setattr(_jsonl, "MAX_LINE_BYTES", 20_000)
    replies = [text * 9_000, "<answer>Up</answer>" + text * 9_000, text * 3_000]
    rec = record_episode(FL, replies, seed=1, env_kwargs={"max_turns": 5})
    rec.turns[0].info["note"] = text * 5_000
    path = tmp_path / "e.jsonl"
    write_records(path, [rec, rec])
    assert all(len(line) <= 20_000 for line in path.read_bytes().splitlines(keepends=True))
    back = read_records(path)  # the reader accepts what the writer wrote
    assert len(back) == 2 and back[0].meta["cut"] >= 1
    assert "cut by llm-gym" in back[0].turns[0].response


def test_n2_render_and_view_say_that_a_mismatch_may_come_from_the_cut(tmp_path, monkeypatch, capsys):
    from llm_gym.render.viewer import load_episode

    monkeypatch.setattr(_jsonl, "MAX_LINE_BYTES", 20_000)
    rec = record_episode(FL, ["<think>" + "y" * 9_000 + "</think><answer>Right</answer>"] * 3, seed=1)
    path = tmp_path / "e.jsonl"
    write_records(path, [rec])
    back = read_records(path)[0]
    assert back.meta["cut"] >= 1 and verify_episode(back) is not None  # the cut lost the answers
    # the cut texts end in a note, but render and view show only their start: the mismatch says so itself
    assert llmgym(["render", str(path), "--out", str(tmp_path / "e.gif")]) == 0
    assert "llm-gym cut" in capsys.readouterr().err
    episode = load_episode(back)
    assert "replay mismatch" in episode.problem and "llm-gym cut" in episode.problem
    episode.close()
    assert "llm-gym cut" not in (load_episode(rec).problem or "")  # an uncut record: no note


def test_n2_a_record_that_cannot_fit_is_refused_by_the_writer(tmp_path, monkeypatch):
    monkeypatch.setattr(_jsonl, "MAX_LINE_BYTES", 2_000)
    rec = _record(0)
    rec.env_kwargs = {"levels": ["#" * 50] * 100}  # not a text a record may cut
    with pytest.raises(ValueError, match="more than the 2,000 bytes"):
        write_records(tmp_path / "e.jsonl", [rec])
    assert not (tmp_path / "e.jsonl").exists()


@pytest.mark.slow
def test_n2_real_size_seven_megabyte_replies_render_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import llm_gym.trainer.evaluate as ev

    reply = "<think>" + "y" * (7 * 2**20) + "</think><answer>Up</answer>"
    monkeypatch.setattr(ev, "make_policy", lambda a: (lambda batch: [reply] * len(batch), "scripted"))
    args = [
        "--model",
        "scripted",
        "--env",
        "FrozenLake",
        "--env_kwargs",
        '{"max_turns": 5}',
        "--num_eval_seeds",
        "1",
    ]
    out = tmp_path / "out"
    assert ev.main([*args, "-o", str(out), "--no_progress"]) == 0
    assert max(len(line) for line in (out / "episodes.jsonl").open("rb")) <= _jsonl.MAX_LINE_BYTES
    assert ev.main([*args, "-o", str(out), "--no_progress", "--resume"]) == 0
    assert verify_episode(read_records(out / "episodes.jsonl")[0]) is None


# ----------------------------------------------------------------------------------- N4, N5, N11-N13: export
def test_n4_export_check_counts_failures_in_constant_memory(tmp_path, capsys):
    from llm_gym.agent.export import verify_rows

    tracemalloc.start()
    problems = verify_rows(({} for _ in range(20_000)), keep=20)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert problems.failed == 20_000 and len(problems) == 20
    assert peak < 2_000_000  # was ~900 bytes kept per failing row (2.77 GB for 3M rows)
    path = tmp_path / "x.jsonl"
    path.write_text("{}\n" * 3_000)
    assert llmgym(["export", "--check", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 21 and err[-1].endswith("3000 row(s) failed the replay check")


def test_n5_a_failed_hub_load_is_paid_once_per_process(tmp_path, monkeypatch, capsys):
    from llm_gym.envs import task_data

    calls = []

    def offline(name, split, hint):
        calls.append(name)
        raise task_data.DatasetUnavailableError(f"could not load the dataset {name!r} (offline)")

    task_data.clear_cache()
    monkeypatch.setattr(task_data, "_load_hub", offline)
    row = {
        "env_id": "llmgym/MetaMathQA-v0",
        "seed": 1,
        "env_kwargs": "{}",
        "messages": [{"role": "assistant", "content": "<answer>2</answer>"}],
    }
    path = tmp_path / "x_mm_hub.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for _ in range(3)))
    try:
        assert llmgym(["export", "--check", str(path)]) == 1
        assert len(calls) == 1  # was one ~24 s offline wait per row
        assert "remembered from an earlier attempt" in capsys.readouterr().err
    finally:
        task_data.clear_cache()


def test_n11_an_hf_export_cannot_name_files_outside_its_folder(tmp_path, capsys):
    pytest.importorskip("datasets")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET:x:0:0\n")
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "dataset_info.json").write_text("{}")
    for name in ("../secret.txt", str(secret), "..", "sub/x.arrow"):
        (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": name}]}))
        assert llmgym(["export", "--check", str(folder), "--format", "hf"]) == 1
        err = capsys.readouterr().err
        assert "not a file name inside the folder" in err and "TOPS" not in err, name
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data.arrow"}]}))
    (folder / "data.arrow").symlink_to(secret)
    assert llmgym(["export", "--check", str(folder), "--format", "hf"]) == 1
    assert "not a regular file" in capsys.readouterr().err


def test_n12_a_huge_seed_is_shown_shortened(tmp_path, capsys):
    path = tmp_path / "x_seedhuge_str.jsonl"
    path.write_text(json.dumps({"env_id": FL, "seed": "S" * 2_000_000}) + "\n")
    assert llmgym(["export", "--check", str(path)]) == 1
    assert len(capsys.readouterr().err) < 2_000  # was the 20 MB seed, twice


def test_n13_export_streams_seeds_and_rows(tmp_path, capsys, monkeypatch):
    from llm_gym.agent.export import iter_export

    def seeds():  # 10^12 seeds; one that lists them all before the first episode fails here, not by memory
        for s in range(10**12):
            assert s < 1_000, "the seeds were drawn ahead of the episodes"
            yield s

    start = time.perf_counter()
    seed, row, _ = next(iter_export("Bandit", seeds()))
    assert seed == 0 and row is not None and time.perf_counter() - start < 5
    # --format hf holds every row: the bound (1,000,000) is checked before any episode is played; shown with a
    # bound of 10, so that an export without the check finishes (and fails here) instead of filling memory
    import llm_gym.cli as cli

    assert cli.MAX_HF_EPISODES == 1_000_000
    monkeypatch.setattr(cli, "MAX_HF_EPISODES", 10)
    argv = [
        "export",
        "--env",
        "Bandit",
        "--out",
        str(tmp_path / "h"),
        "--format",
        "hf",
        "--num_episodes",
        "11",
    ]
    assert llmgym(argv) == 2
    assert "at most 10 episodes" in capsys.readouterr().err and not (tmp_path / "h").exists()


# ------------------------------------------------------------------------ N6, N7, N8: untrusted chat templates
RAISING = {
    "system role": "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}",
    "undefined": "{{ messages.nope.deeper }}",
    "zero division": "{{ 1 / 0 }}",
    "recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "sandbox": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
}


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("transformers")
    from tests._tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.mark.parametrize("name", sorted(RAISING))
def test_n6_a_raising_template_is_a_verdict(tok, name):
    from llm_gym.trainer.chat_templates import check_template

    tok2 = _with_template(tok, RAISING[name])
    check = check_template(tok2)
    verdict = check.lines()[-1]
    assert not check.ok and verdict.startswith("verdict: NOT USABLE: the template raised"), verdict
    if name == "system role":
        assert "TemplateError: System role not supported" in verdict


def _with_template(tok, template):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = template
    return t


def test_n6_every_exception_becomes_a_chat_template_error():
    from llm_gym.agent.templates import TemplateRenderError, render_chat_template

    class Broken:
        def __init__(self, exc):
            self.exc = exc

        def apply_chat_template(self, *a, **k):
            raise self.exc

    for exc in (MemoryError(), RecursionError("deep"), AttributeError("pad"), KeyError("role")):
        with pytest.raises(TemplateRenderError, match=f"raised {type(exc).__name__}"):
            render_chat_template(Broken(exc), [{"role": "user", "content": "x"}], add_generation_prompt=True)


def test_n6_check_template_train_and_eval_say_one_line(tiny_dir, tmp_path, capsys, monkeypatch):
    import llm_gym.trainer.cli as train_cli
    import llm_gym.trainer.evaluate as ev

    model = tmp_path / "M"
    shutil.copytree(tiny_dir, model)
    (model / "chat_template.jinja").write_text(
        RAISING["system role"] + "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    assert llmgym(["check-template", str(model)]) == 1
    out = capsys.readouterr().out
    assert "verdict: NOT USABLE: the template raised TemplateError: System role not supported" in out
    argv = ["--env", "Bandit", "--model", str(model), "-o", str(tmp_path / "run"), "--max_steps", "1"]
    assert train_cli.main([*argv, "--report_to", "none"]) == 2
    err = capsys.readouterr().err
    ours = [
        line for line in err.splitlines() if line.startswith("llmgym-train")
    ]  # besides transformers' bars
    assert len(ours) == 1 and "System role not supported" in ours[0] and "Traceback" not in err
    assert (
        ev.main(
            [
                "--model",
                str(model),
                "--env",
                "Bandit",
                "--num_eval_seeds",
                "1",
                "-o",
                str(tmp_path / "ev"),
                "--no_progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("llmgym-eval")]
    assert len(ours) == 1 and "System role not supported" in ours[0] and "Traceback" not in err
    # a tokenizer_config.json key that clashes with a tokenizer method
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "pad": "x"}))
    assert llmgym(["check-template", str(model)]) == 2
    err = capsys.readouterr().err.strip()
    assert "AttributeError" in err and len(err.splitlines()) == 1


def test_n7_a_looping_template_ends_at_the_deadline(tok, monkeypatch, tmp_path, capsys):
    from llm_gym.trainer.chat_templates import check_template

    from llm_gym.agent import templates

    monkeypatch.setattr(templates, "TEMPLATE_DEADLINE_S", 0.5)
    # 10^8 iterations (seconds, far over the 0.5 s deadline): without a deadline the renders finish and the
    # verdict below fails the test; 10^10 hung it for hours
    loop = "{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
    start = time.perf_counter()
    check = check_template(_with_template(tok, loop))
    assert time.perf_counter() - start < 5  # was: never returned
    assert "did not finish rendering within 0.5 s" in check.lines()[-1] and not check.ok
    # the watchdog never fires after a render that finished in time
    ok = _with_template(tok, "{% for m in messages %}{{ m.content }}{% endfor %}")
    for _ in range(50):
        templates.render_chat_template(
            ok, [{"role": "user", "content": "x"}], add_generation_prompt=True, deadline_s=0.01
        )
    time.sleep(0.05)


def test_n8_template_and_tokenizer_files_are_bounded(tiny_dir, tmp_path, capsys, monkeypatch):
    from llm_gym.trainer import models

    assert llmgym(["check-template", str(tiny_dir), "--chat_template", "/dev/zero"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    big = tmp_path / "big.jinja"
    big.write_text("x" * (models.MAX_TEMPLATE_BYTES + 1))
    assert llmgym(["check-template", str(tiny_dir), "--chat_template", str(big)]) == 2
    assert "more than the 1,048,576-byte limit" in capsys.readouterr().err
    model = tmp_path / "M"
    shutil.copytree(tiny_dir, model)
    monkeypatch.setitem(models.MODEL_FILE_LIMITS, "tokenizer.json", 1_000)  # the real bound is 64 MiB
    assert llmgym(["check-template", str(model)]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json is" in err and "more than the 1,000-byte limit" in err
    with pytest.raises(models.ModelError, match="tokenizer.json"):
        models.load_tokenizer(str(model))
    with pytest.raises(models.ModelError, match="tokenizer.json"):
        models.check_model(str(model))


# ------------------------------------------------------------------------------ N9: one record at a time
def test_n9_render_and_view_hold_one_record_not_the_file(tmp_path):
    path = tmp_path / "big.jsonl"
    write_records(path, [_record(i, " " + "z" * 200_000) for i in range(40)])  # 8 MB
    tracemalloc.start()
    records = RecordFile(path)
    first, last = records[0], records[-1]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(records) == 40 and first.seed == 0 and last.seed == 39
    assert peak < 3_000_000  # a few records' worth, not 8 MB
    assert [r.seed for r in records[1:3]] == [1, 2]
    with pytest.raises(IndexError):
        records[40]
    from llm_gym.render.viewer import ViewerState

    state = ViewerState(records, loader=lambda rec: rec)
    assert state.records is records and state.record.seed == 0  # the viewer keeps the file, not a list


def test_n9_render_picks_the_episode_from_a_streamed_file(tmp_path, capsys):
    pytest.importorskip("imageio")
    path = tmp_path / "ep.jsonl"
    write_records(path, [record_episode(FL, ["<answer>Up</answer>"], seed=s) for s in range(3)])
    assert llmgym(["render", str(path), "--out", str(tmp_path / "o.gif"), "--episode", "-1"]) == 0
    assert "episode 2" in capsys.readouterr().out


def test_n9_eval_resume_keeps_no_texts(tmp_path):
    pytest.importorskip("transformers")
    from llm_gym.trainer.evaluate import _light

    rec = record_episode(FL, ["<answer>Up</answer>" + "q" * 10_000], seed=1)
    light = _light(rec)
    assert light.success == rec.success and light.total_reward == rec.total_reward
    assert len(json.dumps(light.to_dict())) < 2_000


def test_n9_render_reads_only_the_episode_it_shows(tmp_path, capsys):
    # the command, not only RecordFile: render picks one episode of a file it never holds whole
    pytest.importorskip("imageio")
    path = tmp_path / "big.jsonl"
    padded = [record_episode(FL, ["<answer>Up</answer>"], seed=s) for s in range(30)]
    for rec in padded:
        rec.instructions = "z" * 1_000_000
    write_records(path, padded)  # 30 MB
    tracemalloc.start()
    assert llmgym(["render", str(path), "--out", str(tmp_path / "o.gif"), "--episode", "7"]) == 0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "episode 7" in capsys.readouterr().out and peak < 12_000_000, peak  # was the whole file


def test_n9_eval_keeps_no_texts_for_its_summary(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import llm_gym.trainer.evaluate as ev

    reply = "<think>" + "q" * 10_000 + "</think><answer>Right</answer>"
    monkeypatch.setattr(ev, "make_policy", lambda a: (lambda batch: [reply] * len(batch), "scripted"))
    seen = []
    real = ev.summarize_env
    monkeypatch.setattr(
        ev, "summarize_env", lambda records, *a, **k: seen.extend(records) or real(records, *a, **k)
    )
    args = [
        "--model",
        "scripted",
        "--env",
        "FrozenLakeDeterministic",
        "--no_progress",
        "-o",
        str(tmp_path / "o"),
    ]
    assert ev.main([*args, "--num_eval_seeds", "2"]) == 0
    assert ev.main([*args, "--num_eval_seeds", "3", "--resume"]) == 0  # two resumed, one played
    assert len(seen) == 5 and all(t.response == "" for r in seen for t in r.turns)


# ----------------------------------------------------------------------------- N14: data files bounded in rows
def test_n14_data_files_keep_few_rows_and_fields(tmp_path, monkeypatch):
    from llm_gym.envs import task_data

    task_data.clear_cache()
    monkeypatch.setattr(task_data, "MAX_ROWS", 100)
    row = {"query": "What is 1+1?", "response": "The answer is: 2", "extra": "e" * 1_000, "type": "t"}
    path = tmp_path / "mm.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for _ in range(100)))
    env = gym.make("llmgym/MetaMathQA-v0", dataset=str(path))
    assert set(env.unwrapped.data[0]) == {"query", "response", "type"}  # extra fields are not kept
    env.reset(seed=0)
    path.write_text(path.read_text() + json.dumps(row) + "\n")
    task_data.clear_cache()
    with pytest.raises(ValueError, match="more than 100 records"):
        gym.make("llmgym/MetaMathQA-v0", dataset=str(path))
    task_data.clear_cache()


# -------------------------------------------------------------------------- N15, N16, N17: messages, round trips
def test_n15_a_malformed_endpoint_reply_says_so(tmp_path):
    pytest.importorskip("openai")
    from llm_gym.trainer.policies import EndpointError, OpenAIPolicy

    from tests.test_endpoint import MODELS, FakeServer

    def raw(body: bytes) -> bytes:
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % len(body)
            + body
        )

    bodies = [
        b'{"id": "x", "choices": [ {"message": ',
        b"not json",
        json.dumps({"choices": [{"message": {"content": "a"}}]})[:-1].encode()
        + b', "usage": {"completion_tokens": '
        + b"9" * 5000
        + b"}}",
    ]
    for body in bodies:
        server = FakeServer(lambda r, b=body: MODELS if r["method"] == "GET" else raw(b), lifetime=10)
        try:
            with pytest.raises(EndpointError, match="malformed|not an OpenAI") as e:
                OpenAIPolicy(server.url, "served-model", retries=0)([[{"role": "user", "content": "hi"}]])
            assert server.url in str(e.value)  # says whose reply was bad, not bare parser text
        finally:
            server.close()


def test_n16_render_names_the_users_path_not_a_temp_file(tmp_path, capsys):
    path = tmp_path / "good.jsonl"
    write_records(path, [record_episode(FL, ["<answer>Up</answer>"], seed=1)])
    assert llmgym(["render", str(path), "--out", str(tmp_path / "o.txt")]) == 2
    err = capsys.readouterr().err
    assert "o.txt" in err and ".tmp-" not in err


def test_n16_an_unwritable_output_names_the_target(tmp_path):
    target = tmp_path / "ro" / "o.gif"
    target.parent.mkdir()
    target.parent.chmod(0o500)
    try:
        if os.access(target.parent, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(OSError) as e, safe_io.atomic_path(target):
            pass
        assert e.value.filename == str(target)
    finally:
        target.parent.chmod(0o700)


def test_n17_an_adjacent_surrogate_pair_reads_back_as_its_character(tmp_path):
    # JSON has one spelling for both: the documented exception to "reads back to the same strings"
    path = tmp_path / "e.jsonl"
    rec = _record(0, "\ud800\udc00 and \ud800 alone and \udfff\ud83d")
    write_records(path, [rec])
    back = read_records(path)[0].initial_observation
    assert back == "obs 0\U00010000 and \ud800 alone and \udfff\ud83d"


# ------------------------------------------------------------------------------------------ D17, D18, D19
def test_d17_play_with_a_negative_seed_is_a_usage_error(capsys):
    assert llmgym(["play", "--env", "FrozenLake", "--seed", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--seed must be an integer in [0, 2**64)" in err and len(err.splitlines()) == 1


def test_d17_eval_checks_env_kwargs_before_the_model_loads(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    import llm_gym.trainer.evaluate as ev

    monkeypatch.setattr(ev, "make_policy", lambda a: pytest.fail("the model must not load"))
    args = ["--model", "m", "--env", "Bandit", "--env_kwargs", '{"bogus": 1}', "-o", str(tmp_path / "o")]
    assert ev.main(args) == 2
    assert "bogus" in capsys.readouterr().err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("p", ["0.5", True, None, [0.5]])
def test_d18_frozen_lake_takes_numbers_only(p):
    with pytest.raises(ValueError, match="p \\(frozen probability\\) must be a number"):
        gym.make("llmgym/FrozenLake-v0", p=p)


def test_d18_level_file_of_a_wrong_type_and_an_index_without_data():
    with pytest.raises(ValueError, match="level_file must be a path"):
        gym.make("llmgym/SokobanFile-v0", level_file=5)
    env = gym.make("llmgym/Countdown-v0")
    with pytest.raises(ValueError, match="options\\['index'\\] picks a data-set item"):
        env.reset(seed=0, options={"index": 5})


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"step": "abc"}', '{"step": 1}'], "numeric 'step'"),
        (["[" * 100_000 + "]" * 100_000], "nested too deeply"),
        (['{"step": true}'], "numeric 'step'"),
    ],
)
def test_d19_collapse_report_input_is_one_line(tmp_path, capsys, lines, message):
    pytest.importorskip("matplotlib")
    from llm_gym.trainer.collapse_report import main

    path = tmp_path / "collapse.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    assert main([str(path), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_d19_collapse_report_lines_are_read_with_a_cap(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from llm_gym.trainer import collapse_report

    monkeypatch.setattr(collapse_report, "MAX_ROW_BYTES", 1_000)
    path = tmp_path / "collapse.jsonl"
    path.write_text(json.dumps({"step": 1, "x": "y" * 5_000}) + "\n")
    assert collapse_report.main([str(path)]) == 2
    assert "line longer than 1,000 bytes" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- the "not counted" notes
def test_the_api_key_is_redacted_in_any_case_and_percent_encoded():
    pytest.importorskip("openai")
    from llm_gym.trainer.policies import _redactor

    redact = _redactor("sk-Secret/123")
    for echoed in ("sk-Secret/123", "SK-SECRET/123", "sk-secret%2F123", "sk-Secret%2f123"):
        assert redact(f"bearer {echoed}!") == "bearer ***!", echoed


def test_a_failed_first_append_leaves_no_empty_file(tmp_path, monkeypatch):
    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def __getattr__(self, name):
            return getattr(self.f, name)

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    real = safe_io._append_file
    monkeypatch.setattr(safe_io, "_append_file", lambda p: Full(real(p)))
    with pytest.raises(OSError, match="No space"):
        write_records(tmp_path / "episodes.jsonl", [_record(0)])
    assert not (tmp_path / "episodes.jsonl").exists()


def test_a_level_file_rewritten_with_its_mtime_restored_is_read_again(tmp_path):
    from llm_gym.envs.sokoban.level import load_levels

    path = tmp_path / "l.xsb"
    path.write_text("#####\n#@$.#\n#####\n")
    st = path.stat()
    first = str(load_levels(path)[0])
    time.sleep(0.01)
    path.write_text("#####\n#.$@#\n#####\n")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert str(load_levels(path)[0]) != first


# ------------------------------------------------------------------------------ benchmarks, deprecation noise
def _code_strings(path: Path) -> list[str]:
    """The string literals of a module, its docstrings left out."""
    out, previous = [], tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if tok.type == tokenize.STRING and previous not in (
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.NL,
        ):
            out.append(tok.string)
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    return out


PUBLISHING_BENCHMARKS = ("learning_study.py", "organism_learning.py", "ragen2_claims.py", "smollm2_checks.py")


@pytest.mark.parametrize(
    "path",
    # these publish with an explicit --publish flag; their own tests check that --quick writes nothing there
    [p for p in sorted((REPO / "benchmarks").glob("*.py")) if p.name not in PUBLISHING_BENCHMARKS],
    ids=lambda p: p.name,
)
def test_benchmarks_name_no_docs_path(path):
    assert not [s for s in _code_strings(path) if "docs" in s], f"{path.name} names a docs/ path in its code"


def test_organism_learning_quick_results_are_never_published(tmp_path, monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "organism_learning", REPO / "benchmarks" / "organism_learning.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "part_bandit", lambda *a: pytest.fail("a run started"))
    with pytest.raises(SystemExit):
        bench.main(["--work-dir", str(tmp_path / "w"), "--quick", "--publish"])
    assert "never published" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_our_trl_calls_raise_no_checkpointing_deprecation_but_others_still_do(tiny_dir):
    pytest.importorskip("trl")
    from llm_gym.trainer.deprecations import old_checkpointing_names, use_current_checkpointing_names
    from transformers import AutoModelForCausalLM
    from trl.models.utils import disable_gradient_checkpointing

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.activation_checkpointing_enable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with old_checkpointing_names(), disable_gradient_checkpointing(model, None):
            pass
        assert not [w for w in caught if "checkpointing" in str(w.message)]
        with disable_gradient_checkpointing(model, None):  # outside our calls the warning still shows
            pass
        assert [w for w in caught if issubclass(w.category, FutureWarning)]
    from llm_gym.trainer.config import LLMGymGRPOConfig  # noqa: F401 - the config hands TRL's default over

    class Args:
        activation_checkpointing = None
        gradient_checkpointing = True
        activation_checkpointing_kwargs = None
        gradient_checkpointing_kwargs = None

    args = Args()
    use_current_checkpointing_names(args)
    assert args.activation_checkpointing is True


def test_template_deadline_benchmark_quick_mode(monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import template_deadline

    assert template_deadline.main(["--quick", "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "conversation (41 messages)" in out and "ratio" in out
