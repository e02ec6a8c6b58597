"""Hardening, round three, of ``llmgym-sft`` / ``--warm_start`` data and of chat-template checks: data rows name
no files, datasets folders stay inside themselves, rows are valid Unicode and fit the model, memory follows the
data's size, TRL's check never renders an untrusted template, rendering is bounded while it runs, and a killed
``llmgym-sft`` run resumes from its last checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")

from llm_gym.trainer.sft import DataError, check_rows, load_rows  # noqa: E402

RAGEN_CHAT = json.dumps({"chat_style": "ragen"})


def _one_error_line(err: str) -> str:
    """The one error line of a command's stderr (transformers' loading progress bars aside), checked to be one."""
    lines = [
        line
        for line in err.replace("\r", "\n").splitlines()
        if line.strip() and "Loading weights" not in line
    ]
    assert len(lines) == 1 and lines[0].startswith("llmgym-"), err
    return lines[0]


def _ragen_row(env_id: str, env_kwargs: dict, seed: int = 1000) -> dict:
    return {
        "messages": [
            {"role": "user", "content": "State: #@$.#"},
            {"role": "assistant", "content": "<think>push</think><answer>Right</answer>"},
        ],
        "seed": seed,
        "env_id": env_id,
        "env_kwargs": json.dumps(env_kwargs),
        "chat": RAGEN_CHAT,
    }


# ------------------------------------------------------------------------------------------ M7: no files from data
@pytest.mark.parametrize("path", ["/etc/passwd", "/dev/zero", "LEVELS"])
def test_data_rows_that_name_a_file_are_refused_unopened(tmp_path, monkeypatch, path):
    """A RAGEN-style row naming ``level_file`` is refused before the env is made: the file (a valid level file
    here, which the env would read without complaint) is never opened."""
    import llm_gym.registration as registration
    from llm_gym.envs.sokoban.level import sample_path

    levels = tmp_path / "levels.xsb"
    levels.write_text(sample_path().read_text())
    path = str(levels) if path == "LEVELS" else path
    made = []
    monkeypatch.setattr(registration, "make_env", lambda *a, **k: made.append(a) or 1 / 0)
    row = _ragen_row("llmgym/SokobanFile-v0", {"level_file": path})
    start = time.perf_counter()
    with pytest.raises(DataError, match="file paths and data sets are not taken from data rows") as err:
        check_rows([row])
    assert time.perf_counter() - start < 5
    assert not made
    assert "root:" not in str(err.value) and "line 17" not in str(err.value)


def test_data_rows_naming_bundled_data_are_accepted():
    check_rows([_ragen_row("llmgym/SokobanFile-v0", {"level_file": "sample"})])


def test_llmgym_sft_refuses_a_file_named_by_the_data_before_the_model_loads(tiny_dir, tmp_path, capsys):
    from llm_gym.trainer.sft import main

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(_ragen_row("llmgym/SokobanFile-v0", {"level_file": "/etc/passwd"})) + "\n")
    rc = main(
        [
            "--model",
            str(tiny_dir),
            "--data",
            str(data),
            "--output_dir",
            str(tmp_path / "o"),
            "--num_eval_seeds",
            "0",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "file paths and data sets are not taken from data rows" in err and "passwd: line" not in err


# ------------------------------------------------------------------------------------------ L6: folders stay inside
def _traversing_folder(tmp_path: Path) -> Path:
    """A ``datasets`` folder whose ``state.json`` names a file two levels up (a stand-in for /etc/passwd)."""
    from datasets import Dataset

    folder = tmp_path / "a" / "b" / "hf"
    Dataset.from_list([_ragen_row("llmgym/Bandit-v0", {})]).save_to_disk(str(folder))
    (tmp_path / "a" / "secret").write_text("root:x:0:0:root:/root:/bin/bash\n")
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = [{"filename": "../../secret"}]
    (folder / "state.json").write_text(json.dumps(state))
    return folder


def test_a_datasets_folder_naming_a_file_outside_it_is_refused_unread(tmp_path, monkeypatch):
    import datasets

    folder = _traversing_folder(tmp_path)
    opened = []
    monkeypatch.setattr(datasets, "load_from_disk", lambda *a, **k: opened.append(a) or 1 / 0)
    with pytest.raises(DataError, match="is not a file name inside the folder; refusing to read it") as err:
        load_rows(folder)
    assert not opened and "root" not in str(err.value).replace(str(tmp_path), "")


def test_warm_start_refuses_the_same_folder(tmp_path):
    from types import SimpleNamespace

    from llm_gym.trainer.warm_start import warm_start_rows

    folder = _traversing_folder(tmp_path)
    with pytest.raises(DataError, match="not a file name inside the folder"):
        warm_start_rows(SimpleNamespace(warm_start=str(folder), warm_start_fraction=None))


# ------------------------------------------------------------------------------------------ L7: lone surrogates
def _surrogate_row() -> dict:
    row = _ragen_row("llmgym/Bandit-v0", {})
    row["chat"] = None
    row["messages"][1]["content"] = "\ud800<answer>Left</answer>"
    return row


def test_a_lone_surrogate_in_a_row_is_one_line(tmp_path):
    from types import SimpleNamespace

    from llm_gym.trainer.warm_start import check_rows as warm_start_check

    with pytest.raises(
        DataError, match=r"row 0: message 1 holds a lone surrogate \(U\+D800 at character 0\)"
    ):
        check_rows([_surrogate_row()])
    config = SimpleNamespace(env="llmgym/Bandit-v0", eval_seed=123, num_eval_seeds=0)
    with pytest.raises(DataError, match="lone surrogate"):
        warm_start_check(config, [_surrogate_row()])
    # a pair spelled by JSON escapes is one character, and valid
    row = _surrogate_row()
    row["messages"][1]["content"] = json.loads('"\\ud83d\\ude00<answer>Left</answer>"')
    check_rows([row])


def test_llmgym_sft_reports_a_lone_surrogate_in_one_line(tiny_dir, tmp_path, capsys):
    from llm_gym.trainer.sft import main

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(_surrogate_row()) + "\n")  # json.dumps writes it as the escape \ud800
    rc = main(["--model", str(tiny_dir), "--data", str(data), "--output_dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "lone surrogate" in err, err


# ------------------------------------------------------------------------------------------ L8: rows over the context
FL = "llmgym/CoordFrozenLake-v0"
FL_KW = {
    "success_rate": 1.0,
    "size": 3,
    "max_turns": 3,
    "max_actions_per_turn": 1,
    "max_actions": 3,
    "think": False,
}


def _small_context_model(tiny_dir: str, tmp_path: Path, positions: int) -> Path:
    import shutil

    model = tmp_path / "tiny_small_context"
    shutil.copytree(tiny_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = positions
    (model / "config.json").write_text(json.dumps(config))
    return model


def _fl_rows(seeds) -> list[dict]:
    from llm_gym.agent.chat import ChatFormat
    from llm_gym.agent.export import export_episodes

    return export_episodes(FL, seeds, env_kwargs=FL_KW, chat=ChatFormat(include_instructions=False)).rows


def test_rows_longer_than_the_models_context_are_dropped_with_a_warning(tiny_dir, tmp_path, capsys):
    from llm_gym.trainer.sft import main

    from llm_gym.agent.export import write_jsonl

    rows = _fl_rows(range(300, 303))
    long = json.loads(json.dumps(rows[0]))
    long["seed"] = 400
    long["messages"][1]["content"] += " the lake is wide" * 200  # far more tokens than 512 positions
    write_jsonl([*rows, long], tmp_path / "d.jsonl")
    model = _small_context_model(tiny_dir, tmp_path, 512)
    out = tmp_path / "o"
    argv = ["--model", str(model), "--data", str(tmp_path / "d.jsonl"), "--output_dir", str(out), "--max_steps", "1",
            "--per_device_train_batch_size", "2", "--report_to", "none", "--disable_tqdm", "True"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "final" / "llmgym_sft.json").read_text())
    assert summary["data"]["dropped_too_long"] == 1 and summary["data"]["rows"] == 3
    assert summary["data"]["max_length"] == 512 and summary["data"]["max_tokens"] <= 512
    assert "dropped 1 episode(s) longer than 512 tokens (the model's context" in capsys.readouterr().out
    # every row over the context: one line, exit 2
    write_jsonl([long], tmp_path / "long.jsonl")
    argv = [*argv[:3], str(tmp_path / "long.jsonl"), "--output_dir", str(tmp_path / "o2"), *argv[6:]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "every row is longer than 512 tokens" in _one_error_line(err)


# ------------------------------------------------------------------------------------------ M6: memory and workers
def _tiny_rows_file(path: Path, n: int) -> Path:
    """``n`` valid rows of one short user and one short assistant message (about 95 bytes each)."""
    with path.open("w") as f:
        for i in range(n):
            row = {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
            f.write(json.dumps({**row, "seed": 1000 + i}) + "\n")
    return path


def test_loaded_rows_take_about_the_datas_size(tmp_path):
    """10,000 tiny rows (0.9 MB): held as a list of dicts they took 10x the file; now about its size."""
    import tracemalloc

    path = _tiny_rows_file(tmp_path / "d.jsonl", 10_000)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        rows = load_rows(path)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(rows) == 10_000 and rows[5]["seed"] == 1005 and rows[-1]["seed"] == 10_999
    assert held < 1.5 * size + 8 * len(rows) + 100_000, (held, size)
    check_rows(rows)  # every check reads them as before
    assert [r["seed"] for r in rows[:3]] == [1000, 1001, 1002] and next(iter(rows)) == rows[0]


class _FakeTemplate:
    """ChatTemplateTokens' interface without Jinja or a tokenizer: ids above 256 (Python caches small ints)."""

    end_of_turn_id = 1000

    def encode(self, text):
        return [300 + (ord(c) % 50) for c in text]

    def prompt_ids(self, messages):
        return [400 + i for i in range(12)] + self.encode(messages[-1]["content"])

    def between_turns_ids(self, history, next_user):
        return [500] + self.encode(next_user)


def test_tokenized_rows_take_a_few_bytes_a_token(tmp_path):
    """The tokens of 10,000 rows: as lists of Python ints about 45 bytes a token; now 5 (+ Arrow's copy)."""
    import tracemalloc

    import datasets  # noqa: F401 - imported before measuring
    import pyarrow as pa
    from llm_gym.trainer.sft import build_dataset

    rows = load_rows(_tiny_rows_file(tmp_path / "d.jsonl", 10_000))
    build_dataset(rows[:2], _FakeTemplate())  # what a first call sets up once
    arrow0 = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        dataset, stats = build_dataset(rows, _FakeTemplate())
        python_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    tokens = stats["tokens"]
    assert stats["rows"] == 10_000 and tokens > 150_000
    assert python_peak < 8 * tokens + 8 * len(rows) + 1_000_000, (python_peak, tokens)
    assert pa.total_allocated_bytes() - arrow0 < 12 * tokens + 16 * len(rows), tokens
    first = dataset[0]
    assert first["input_ids"][-2:] == [300 + ord("a") % 50, 1000] and first["assistant_masks"][-2:] == [1, 1]
    assert sum(first["assistant_masks"]) == 2 and len(first["input_ids"]) == len(first["assistant_masks"])


def test_a_tokenizer_panic_ends_llmgym_sft_with_one_line(tiny_dir, tmp_path, capsys, monkeypatch):
    """A panicking Rust tokenizer raises a BaseException (pyo3's PanicException): one line, exit 1, no hang."""
    import os

    import llm_gym.trainer.sft as sft

    class PanicException(BaseException):  # what pyo3 raises
        pass

    def panic(*a, **k):
        raise PanicException("Onig: Regex search error: fail to memory allocation")

    monkeypatch.setattr(sft, "tokenize_conversation", panic)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    data = _tiny_rows_file(tmp_path / "d.jsonl", 3)
    start = time.perf_counter()
    rc = sft.main(["--model", str(tiny_dir), "--data", str(data), "--output_dir", str(tmp_path / "o")])
    assert rc == 1 and time.perf_counter() - start < 120
    line = _one_error_line(capsys.readouterr().err)
    assert "row 0: tokenizing failed (PanicException: Onig: Regex search error" in line
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"  # no tokenizer thread pool to panic in


# ------------------------------------------------------------------------------------------ llmgym-sft --resume
def _sft_argv(tiny_dir, data: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(tiny_dir), "--data", str(data), "--output_dir", str(out), "--max_steps", "4",
            "--save_strategy", "steps", "--save_steps", "2", "--per_device_train_batch_size", "2",
            "--learning_rate", "1e-2", "--logging_steps", "1", "--report_to", "none", "--disable_tqdm", "True",
            *extra]  # fmt: skip


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _as_if_killed_after(run: Path, copy: Path, step: int) -> None:
    """``copy``: the folder a kill of ``run`` right after its checkpoint at ``step`` leaves (that checkpoint
    complete, a later one cut off without its marker, a half-saved final model, no final/ nor run files)."""
    import shutil

    from llm_gym.trainer.output import MARKER

    shutil.copytree(run, copy)
    for name in ("final", "llmgym_sft.json", "llmgym_run.json"):
        p = copy / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    later = sorted(p for p in copy.glob("checkpoint-*") if int(p.name.split("-")[1]) > step)
    for p in later[1:]:
        shutil.rmtree(p)
    (later[0] / MARKER).unlink()  # killed while saving it
    (copy / ".final.partial").mkdir()


def test_llmgym_sft_resumes_from_its_last_checkpoint_to_the_same_weights(tiny_dir, tmp_path, capsys):
    """A 4-step run killed after checkpoint-2 and resumed ends with the uninterrupted run's weights, optimizer and
    schedule included; a finished run resumed trains no step; other data is refused."""
    import torch
    from llm_gym.trainer.sft import main

    from llm_gym.agent.export import write_jsonl

    data = tmp_path / "d.jsonl"
    write_jsonl(_fl_rows(range(300, 308)), data)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert main(_sft_argv(tiny_dir, data, whole)) == 0
    assert (whole / "checkpoint-2" / "llmgym_checkpoint.json").is_file()  # each checkpoint gets its marker
    _as_if_killed_after(whole, killed, 2)
    capsys.readouterr()
    # without --resume the rerun is refused, and pointed to it; --resume with --overwrite_output_dir too
    assert main(_sft_argv(tiny_dir, data, killed)) == 2
    assert "pass --resume to continue its run" in _one_error_line(capsys.readouterr().err)
    assert main(_sft_argv(tiny_dir, data, killed, "--resume", "--overwrite_output_dir")) == 2
    assert "exclude each other" in _one_error_line(capsys.readouterr().err)
    assert (killed / "checkpoint-2").is_dir()  # nothing removed by the refusals

    assert main(_sft_argv(tiny_dir, data, killed, "--resume")) == 0
    out = capsys.readouterr().out
    assert f"llmgym-sft: resuming from {killed / 'checkpoint-2'} (step 2); skipped checkpoint-4: no " in out
    assert "2 steps in" in out and "resumed at step 2, 4 in all" in out
    summary = json.loads((killed / "final" / "llmgym_sft.json").read_text())
    assert (
        summary["resumed_at_step"] == 2 and summary["steps"] == 4 and not (killed / ".final.partial").exists()
    )
    assert [s for s, _ in summary["loss_curve"]] == [1, 2, 3, 4]
    a, b = _weights(whole / "final"), _weights(killed / "final")
    before = _weights(Path(tiny_dir))
    assert any(not torch.equal(a[k], before[k]) for k in a)  # it trained
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)

    # a finished run resumed: no step more, the same final model
    assert main(_sft_argv(tiny_dir, data, killed, "--resume")) == 0
    assert "checkpoint-4 is at step 4 of max_steps 4: no step left to train" in capsys.readouterr().out
    assert all(torch.equal(a[k], v) for k, v in _weights(killed / "final").items())
    # other data: refused, not silently mixed into the run
    write_jsonl(_fl_rows(range(300, 307)), data)
    assert main(_sft_argv(tiny_dir, data, killed, "--resume")) == 2
    assert "is not what checkpoint-4 was trained on" in _one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------------ M5, L9: chat templates
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
HUGE_OUTPUT = "{% for i in range(100000) %}{{ messages|tojson }}{% endfor %}" + CHATML  # 7 MB rendered


@pytest.fixture(scope="module")
def tok():
    from tests._tiny import build_tiny_tokenizer

    return build_tiny_tokenizer("chatml")


def _with_template(tok, template):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = template
    return t


def test_trls_check_never_renders_a_template_trl_does_not_ship(tok, monkeypatch):
    """TRL's training-variant check renders and tokenises outside the size bound (7 MB cost 4.2 GB and 32 s, and
    a SIGABRT under a 3 GB cap): it is asked only about TRL's own templates."""
    import trl.chat_template_utils as trl_templates
    from llm_gym.trainer.chat_templates import check_template, training_template_tokens

    asked = []
    monkeypatch.setattr(trl_templates, "get_training_chat_template", lambda t: asked.append(t) or None)
    huge = _with_template(tok, HUGE_OUTPUT)
    start = time.perf_counter()
    check = check_template(huge)
    assert not asked
    verdict = check.lines()[-1]
    assert not check.ok and "NOT USABLE: the template rendered more than 1,000,120 characters" in verdict, (
        verdict
    )
    from llm_gym.agent.templates import ChatTemplateError

    with pytest.raises(ChatTemplateError, match="rendered more than"):
        training_template_tokens(huge)
    assert not asked and time.perf_counter() - start < 10
    # a template TRL ships is still asked about (Qwen3's, which TRL has a variant of)
    from llm_gym.trainer.chat_templates import trl_known_templates
    from trl.chat_template_utils import qwen3_chat_template

    assert qwen3_chat_template in trl_known_templates()
    check_template(_with_template(tok, qwen3_chat_template))
    assert len(asked) == 1


def test_template_output_is_bounded_while_it_renders(tok):
    """Nested loops that each emit a fresh string: stopped at the size bound at once, not at the deadline after
    gigabytes (2.68 GB in 9.8 s before)."""
    import tracemalloc

    from llm_gym.agent.templates import TemplateRenderError, render_chat_template

    looping = (
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'ab' * 50 ~ i }}{% endfor %}{% endfor %}"
    )
    macro = "{% macro m() %}{% for j in range(100000) %}{{ 'ab' * 50 }}{% endfor %}{% endmacro %}"
    macro += "{% for i in range(100000) %}{{ m() }}{% endfor %}"
    messages = [{"role": "user", "content": "hi"}]
    for template in (looping, macro):
        tracemalloc.start()
        start = time.perf_counter()
        try:
            with pytest.raises(TemplateRenderError, match="rendered more than 1,000,060 characters") as err:
                render_chat_template(
                    tok, messages, add_generation_prompt=True, chat_template=template, deadline_s=5
                )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert not err.value.timed_out and time.perf_counter() - start < 4
        assert peak < 60_000_000, peak
    # a normal render is unchanged, and outside our renders Jinja's join is the plain one
    assert render_chat_template(tok, messages, add_generation_prompt=True, chat_template=CHATML).endswith(
        "<|im_start|>assistant\n"
    )
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    big = "{% for i in range(20000) %}{{ 'x' * 100 }}{% endfor %}"
    assert len(ImmutableSandboxedEnvironment().from_string(big).render()) == 2_000_000
