"""llmgym-sft: the loss mask is exactly the assistant tokens of the RL rollout, rows are validated, evaluation
seeds are refused, and the output folder is a model llmgym-eval and llmgym-train load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("trl")

from llm_gym.trainer.sft import (  # noqa: E402
    DataError,
    build_dataset,
    check_rows,
    check_seeds,
    data_settings,
    load_rows,
    row_conversation,
    seed_ranges,
    tokenize_conversation,
)

from llm_gym.agent.chat import ChatFormat  # noqa: E402
from llm_gym.agent.export import export_episodes, verify_rows, write_jsonl  # noqa: E402

FL = "llmgym/CoordFrozenLake-v0"
FL_KW = {
    "success_rate": 1.0,
    "size": 3,
    "max_turns": 3,
    "max_actions_per_turn": 1,
    "max_actions": 3,
    "think": False,
}


def _template(style: str):
    from llm_gym.trainer.chat_templates import ChatTemplateTokens

    from tests._tiny import build_tiny_tokenizer

    return ChatTemplateTokens(build_tiny_tokenizer(style))


def _rollout_tokens(template, row, chat, env_kwargs):
    """The RL rollout's tokens when the model samples exactly the row's replies."""
    from llm_gym.trainer.rollouts import play_token_episodes

    replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"][-row["num_turns"] :]
    prefix = "<answer>" if chat.style == "ragen" else ""
    turn = iter(replies)

    def generate(contexts, budgets):
        ids = template.encode(next(turn)[len(prefix) :]) + [template.end_of_turn_id]
        return [ids], [[0.0] * len(ids)]

    (ep,) = play_token_episodes(
        row["env_id"],
        [row["seed"]],
        generate,
        template,
        max_new_tokens=64,
        max_completion_length=8192,
        env_kwargs=env_kwargs,
        chat=chat,
        group_dynamics="shared",
    )
    return ep


@pytest.mark.parametrize("style", ["chatml", "smollm2", "llama3"])
@pytest.mark.parametrize(
    "chat",
    [
        ChatFormat(),
        ChatFormat(one_shot=True),
        ChatFormat(one_shot=True, demonstration="several", include_instructions=False),
        ChatFormat(style="ragen"),
    ],
    ids=["plain", "one_shot", "several", "ragen"],
)
def test_sft_tokens_are_the_rollout_tokens_and_only_replies_carry_loss(style, chat):
    template = _template(style)
    rows = export_episodes(FL, range(3), env_kwargs=FL_KW, chat=chat).rows
    rows += export_episodes(FL, range(3, 6), env_kwargs=FL_KW, chat=chat, expert_fraction=0.0).rows
    assert any(r["num_turns"] > 1 for r in rows)
    for row in rows:
        messages, trained = row_conversation(row)
        prefix = "<answer>" if chat.style == "ragen" else ""
        ex = tokenize_conversation(template, messages, trained, prefix)
        ep = _rollout_tokens(template, row, chat, FL_KW)
        # token for token the sequence RL trains on, with the loss exactly where the model sampled
        assert ex["input_ids"] == ep.prompt_ids + ep.completion_ids
        assert ex["assistant_masks"] == [0] * len(ep.prompt_ids) + ep.env_mask
        # and the trained spans decode to the replies (without the prefix) each closed by the end-of-turn token
        ids, mask = ex["input_ids"], ex["assistant_masks"]
        spans, start = [], None
        for i, m in enumerate([*mask, 0]):
            if m and start is None:
                start = i
            if not m and start is not None:
                spans.append(template.tokenizer.decode(ids[start:i], skip_special_tokens=False))
                start = None
        replies = [m["content"][len(prefix) :] for m in messages if m["role"] == "assistant"][-trained:]
        assert spans == [r + template.end_of_turn_text for r in replies]


def test_demonstration_turns_are_prompt_not_loss():
    template = _template("chatml")
    (row,) = export_episodes(FL, [1], env_kwargs=FL_KW, chat=ChatFormat(one_shot=True)).rows
    messages, trained = row_conversation(row)
    demo = messages[2]["content"]
    assert messages[2]["role"] == "assistant" and trained == row["num_turns"]
    ex = tokenize_conversation(template, messages, trained)
    masked = template.tokenizer.decode([t for t, m in zip(ex["input_ids"], ex["assistant_masks"]) if m])
    everything = template.tokenizer.decode(ex["input_ids"])
    assert demo in everything and masked.count("<answer>") == trained


def test_random_rows_replay_and_mix_counts():
    from llm_gym.agent.export import plays_expert

    rows = export_episodes(FL, range(40), env_kwargs=FL_KW, expert_fraction=0.25).rows
    by_expert = {s for s in range(40) if plays_expert(s, 0.25)}
    assert 4 <= len(by_expert) <= 16  # each seed independently with probability 0.25
    assert {r["seed"] for r in rows if r["policy"] == "random-valid"} == set(range(40)) - by_expert
    assert {r["seed"] for r in rows if r["policy"] == "expert"} <= by_expert  # unsolvable seeds are skipped
    assert plays_expert(7, 1.0) and not plays_expert(7, 0.0)
    assert all(r["success"] for r in rows if r["policy"] == "expert")
    assert not all(r["success"] for r in rows if r["policy"] == "random-valid")  # chance: some fail
    assert verify_rows(rows, env_kwargs=FL_KW) == []
    # the metadata records each policy's seeds exactly: disjoint, and together every kept seed
    recorded = data_settings(rows)["policy_seeds"]
    assert set(recorded) == {"expert", "random-valid"}
    seeds = {p: {s for a, b in runs for s in range(a, b + 1)} for p, runs in recorded.items()}
    assert seeds["random-valid"] == set(range(40)) - by_expert
    assert seeds["expert"] == {r["seed"] for r in rows if r["policy"] == "expert"}
    assert not seeds["expert"] & seeds["random-valid"]
    again = export_episodes(FL, range(40), env_kwargs=FL_KW, expert_fraction=0.25).rows
    assert again == rows  # deterministic
    with pytest.raises(ValueError, match="expert_fraction"):
        export_episodes(FL, range(2), expert_fraction=1.5)


def test_evaluation_seeds_and_unseeded_rows_are_refused():
    rows = export_episodes(FL, range(120, 130), env_kwargs=FL_KW, expert_fraction=0.0).rows
    with pytest.raises(DataError, match=r"3 data seed\(s\) are evaluation seeds \(123, 124, 125"):
        check_seeds(rows, range(123, 126))
    check_seeds(rows, range(200, 300))
    check_seeds(rows, range(0))  # no evaluation seeds: nothing to protect
    with pytest.raises(DataError, match="carry no integer 'seed'"):
        check_seeds([{k: v for k, v in rows[0].items() if k != "seed"}], range(0, 5))


def test_rows_that_differ_in_chat_are_refused():
    a = export_episodes(FL, [1], env_kwargs=FL_KW).rows
    b = export_episodes(FL, [2], env_kwargs=FL_KW, chat=ChatFormat(one_shot=True)).rows
    with pytest.raises(DataError, match="different chat settings"):
        data_settings(a + b)
    s = data_settings(a)
    assert s["env"] == FL and s["env_kwargs"] == FL_KW and s["chat"]["one_shot_example"] is False


def test_seed_ranges_are_exact_runs():
    assert seed_ranges([]) == []
    assert seed_ranges([5, 3, 4, 9, 9, 11, 10, 0]) == [[0, 0], [3, 5], [9, 11]]


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("chat", {"chat_style": "llmgym"}, "'chat' must be a string"),  # unhashable: was a TypeError
        ("env_id", ["llmgym/Bandit-v0"], "'env_id' must be a string"),
        ("env_kwargs", {"size": 3}, "'env_kwargs' must be a string"),
        ("chat", json.dumps({"chat_style": "evil"}), "style must be one of"),
        ("chat", json.dumps({"one_shot_example": "yes"}), "'one_shot_example' has the wrong type"),
        ("chat", json.dumps({"demonstration": 3}), "'demonstration' has the wrong type"),
        ("messages", [{"role": "user", "content": "a"}], "must alternate"),
    ],
)
def test_rows_with_wrong_field_types_are_a_data_error(field, value, match):
    (row,) = export_episodes(FL, [300], env_kwargs=FL_KW).rows
    check_rows([row])
    with pytest.raises(DataError, match=match):
        check_rows([{**row, field: value}])


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 5) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["role", "content", "x"]), inner)
    ),
    max_leaves=12,
)
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool", 3]),
        "content": st.text(max_size=6) | st.none(),
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(_message, max_size=7) | _json,
    num_turns=st.none() | st.integers(-1, 4) | st.booleans() | st.text(max_size=2),
)
def test_untrusted_rows_are_a_data_error_or_a_valid_conversation(messages, num_turns):
    row = {"messages": messages} if num_turns is None else {"messages": messages, "num_turns": num_turns}
    try:
        out, trained = row_conversation(row, 7)
    except DataError as e:
        assert str(e).startswith("row 7:")
        return
    body = out[1:] if out[0]["role"] == "system" else out
    assert [m["role"] for m in body] == ["user", "assistant"] * (len(body) // 2)
    assert 1 <= trained <= len(body) // 2


_row = st.dictionaries(
    st.sampled_from(["messages", "seed", "chat", "env_id", "env_kwargs", "policy", "num_turns"]),
    _json,
    max_size=7,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_row | _json, min_size=1, max_size=3))
def test_untrusted_rows_are_a_data_error_or_settings(rows):
    try:
        settings = check_rows(rows)
        check_seeds(rows, range(0, 3))
    except DataError as e:
        assert "\n" not in str(e)
        return
    assert settings["rows"] == len(rows)


def test_load_rows_jsonl_and_datasets_folder(tmp_path):
    from datasets import Dataset

    rows = export_episodes(FL, range(3), env_kwargs=FL_KW).rows
    write_jsonl(rows, tmp_path / "d.jsonl")
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))
    assert list(load_rows(tmp_path / "d.jsonl")) == rows
    assert [r["messages"] for r in load_rows(tmp_path / "hf")] == [r["messages"] for r in rows]
    (tmp_path / "bad.jsonl").write_text("[1]\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_rows(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match="not found"):
        load_rows(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a datasets folder"):
        load_rows(tmp_path / "empty")
    from datasets import DatasetDict

    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "splits"))
    with pytest.raises(DataError, match="several splits"):
        load_rows(tmp_path / "splits")


def test_load_rows_bounds_the_data_it_reads(tmp_path, monkeypatch):
    import llm_gym.trainer.sft as sft
    from datasets import Dataset

    rows = export_episodes(FL, range(3), env_kwargs=FL_KW).rows
    write_jsonl(rows, tmp_path / "d.jsonl")
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))
    monkeypatch.setattr(sft, "MAX_DATA_BYTES", 1000)
    with pytest.raises(DataError, match="bytes, more than the 1000"):
        load_rows(tmp_path / "d.jsonl")
    with pytest.raises(DataError, match="bytes of data, more than 1000"):
        load_rows(tmp_path / "hf")
    monkeypatch.setattr(sft, "MAX_DATA_BYTES", 10**9)
    monkeypatch.setattr(sft, "MAX_ROWS", 2)
    with pytest.raises(DataError, match="more than 2 rows"):
        load_rows(tmp_path / "d.jsonl")
    with pytest.raises(DataError, match="3 rows, more than the 2"):
        load_rows(tmp_path / "hf")


def test_trainer_labels_are_the_assistant_mask(tiny_dir, tmp_path):
    """TRL's SFTTrainer turns our assistant_masks into labels: -100 on every prompt and observation token."""
    from llm_gym.trainer.chat_templates import ChatTemplateTokens
    from llm_gym.trainer.config import LLMGymSFTConfig
    from llm_gym.trainer.models import load_model_and_tokenizer
    from trl import SFTTrainer

    model, tok = load_model_and_tokenizer(tiny_dir, dtype="float32")
    rows = export_episodes(FL, range(4), env_kwargs=FL_KW).rows
    rows += export_episodes(FL, range(4, 8), env_kwargs=FL_KW, chat=ChatFormat(one_shot=True)).rows
    assert any(r["num_turns"] > 1 for r in rows)  # multi-turn: observations between replies are masked too
    dataset, stats = build_dataset(rows, ChatTemplateTokens(tok))
    assert stats["rows"] == len(rows) and 0 < stats["trained_tokens"] < stats["tokens"]
    args = LLMGymSFTConfig(output_dir=str(tmp_path), data="x", use_cpu=True, bf16=False, max_steps=1)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok)
    prepared = trainer.train_dataset
    for i in range(len(rows)):
        ids, mask, labels = dataset[i]["input_ids"], dataset[i]["assistant_masks"], prepared[i]["labels"]
        assert prepared[i]["input_ids"] == ids
        assert labels == [t if m else -100 for t, m in zip(ids, mask)]


def _sft(argv):
    from llm_gym.trainer.sft import main

    return main(argv)


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


@pytest.mark.parametrize("bf16", [False, True])
def test_llmgym_sft_end_to_end_moves_weights_and_output_is_a_model(tiny_dir, tmp_path, capsys, bf16):
    data = tmp_path / "data.jsonl"
    chat = ChatFormat(include_instructions=False)
    rows = export_episodes(FL, range(300, 308), env_kwargs=FL_KW, chat=chat, expert_fraction=0.5).rows
    write_jsonl(rows, data)
    out = tmp_path / "out"
    argv = ["--model", tiny_dir, "--data", str(data), "--output_dir", str(out), "--max_steps", "2",
            "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--learning_rate", "1e-2",
            "--bf16", str(bf16), "--logging_steps", "1"]  # fmt: skip
    assert _sft(argv) == 0
    before, after = _weights(tiny_dir), _weights(out / "final")
    assert all(after[k].dtype == before[k].dtype for k in before)  # float32 weights, bf16 only in compute
    assert any(not (before[k] == after[k]).all() for k in before)
    summary = json.loads((out / "final" / "llmgym_sft.json").read_text())
    assert (
        summary["steps"] == 2 and summary["data"]["rows"] == len(rows) and summary["settings"]["bf16"] is bf16
    )
    from collections import Counter

    assert summary["tokens_per_second"] > 0
    assert summary["data"]["policies"] == dict(Counter(r["policy"] for r in rows))
    recorded = {
        p: [s for a, b in runs for s in range(a, b + 1)]
        for p, runs in summary["data"]["policy_seeds"].items()
    }
    assert recorded == {p: sorted(r["seed"] for r in rows if r["policy"] == p) for p in recorded}
    assert summary["eval_seeds_checked"] == [123, 186]
    run = json.loads((out / "final" / "llmgym_run.json").read_text())
    assert run["env"] == FL and run["env_kwargs"] == FL_KW and run["include_instructions"] is False
    assert "llmgym-sft: 2 steps" in capsys.readouterr().out
    # the output is a model: llmgym-eval plays it in the chat it was trained on (from llmgym_run.json)
    from llm_gym.trainer.evaluate import main as eval_main

    ev = tmp_path / "ev"
    rc = eval_main(["--model", str(out / "final"), "--env", FL, "--env_kwargs", json.dumps(FL_KW), "--num_eval_seeds", "2",
                    "--max_new_tokens", "8", "--output_dir", str(ev), "--no_progress"])  # fmt: skip
    assert rc == 0
    assert "chat settings of the trained run" in capsys.readouterr().err
    assert json.loads((ev / "summary.json").read_text())["include_instructions"] is False
    # a second run into the same folder is refused unless asked to overwrite
    assert _sft(argv) == 2 and "not empty" in capsys.readouterr().err
    assert _sft([*argv, "--overwrite_output_dir"]) == 0


def test_llmgym_sft_refuses_evaluation_seeds_before_loading(tiny_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    write_jsonl(export_episodes(FL, range(120, 125), env_kwargs=FL_KW).rows, data)
    out = tmp_path / "out"
    assert _sft(["--model", tiny_dir, "--data", str(data), "--output_dir", str(out)]) == 2
    assert "evaluation seeds" in capsys.readouterr().err and not out.exists()
    assert _sft(["--model", tiny_dir, "--output_dir", str(out)]) == 2
    assert "--data is required" in capsys.readouterr().err
    # a malformed row anywhere in the data: a one-line error before the model loads or the folder is made
    rows = export_episodes(FL, range(300, 303), env_kwargs=FL_KW).rows
    rows[2]["messages"] = [{"role": "assistant", "content": "Left"}]
    write_jsonl(rows, data)
    assert _sft(["--model", tiny_dir, "--data", str(data), "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "row 2:" in err and "must alternate" in err and not out.exists()
    data.write_text('{"messages": [' * 5000 + "\n")
    assert _sft(["--model", tiny_dir, "--data", str(data), "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.jsonl:1" in err and not out.exists()


def test_llmgym_sft_lora_adapter_and_merged(tiny_dir, tmp_path):
    data = tmp_path / "data.jsonl"
    write_jsonl(export_episodes(FL, range(300, 304), env_kwargs=FL_KW).rows, data)
    common = ["--model", tiny_dir, "--data", str(data), "--max_steps", "1", "--per_device_train_batch_size", "2",
              "--use_peft", "--lora_r", "4", "--lora_target_modules", "all-linear", "--learning_rate", "1e-2"]  # fmt: skip
    assert _sft([*common, "--output_dir", str(tmp_path / "lora")]) == 0
    assert (tmp_path / "lora" / "final" / "adapter_config.json").is_file()
    assert _sft([*common, "--output_dir", str(tmp_path / "merged"), "--merge_lora"]) == 0
    merged = tmp_path / "merged" / "final"
    assert not (merged / "adapter_config.json").exists()
    before, after = _weights(tiny_dir), _weights(merged)
    assert set(before) == set(after) and any(not (before[k] == after[k]).all() for k in before)
    import torch
    from llm_gym.trainer.models import load_model_and_tokenizer

    # both load as a model (the adapter on its base) and compute the same function, which is not the base's:
    # the same seed and data trained both, so the merged weights are the base plus the adapter
    ids = torch.tensor([list(range(3, 40))])
    logits = {}
    for name, folder in (("base", tiny_dir), ("lora", tmp_path / "lora" / "final"), ("merged", merged)):
        model, _ = load_model_and_tokenizer(str(folder), dtype="float32")
        with torch.no_grad():
            logits[name] = model(input_ids=ids).logits
    assert torch.allclose(logits["lora"], logits["merged"], atol=1e-4)
    assert not torch.allclose(logits["lora"], logits["base"], atol=1e-4)


def test_sft_speed_benchmark_quick_mode():
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("sft_speed", root / "benchmarks" / "sft_speed.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sft_speed"] = mod
    spec.loader.exec_module(mod)
    out = mod.main(["--quick"])
    assert set(out) == {"with instructions", "compact"}
    assert out["compact"]["tokens"] < out["with instructions"]["tokens"]
    assert all(s > 0 for v in out.values() for s in v["cpu_seconds"].values())
