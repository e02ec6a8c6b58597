"""llmgym-train --warm_start: SFT on trajectories first, then RL from its model, with base / warm start / RL
evaluations on the same seeds beside the baselines; evaluation seeds in the data are refused before any model
loads."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from llm_gym.trainer.cli import main, resolve_config  # noqa: E402

from llm_gym.agent.export import export_episodes, write_jsonl  # noqa: E402

FL = ["--env", "CoordFrozenLake", "--env_kwargs", '{"success_rate": 1.0, "size": 3}', "--max_turns", "2",
      "--max_actions_per_turn", "1", "--max_actions", "2", "--max_new_tokens", "8"]  # fmt: skip
QUIET = ["--report_to", "none", "--disable_tqdm", "True", "--mi_every", "0", "--num_prompts", "2",
         "--num_generations", "2"]  # fmt: skip


def test_warm_start_fields_are_validated():
    config, _ = resolve_config(
        [*FL, "--warm_start", "expert", "--warm_start_expert_fraction", "0.5"], gpu=False
    )
    assert config.warm_start_fraction == 0.5
    config, _ = resolve_config([*FL, "--warm_start", "random"], gpu=False)
    assert config.warm_start_fraction == 0.0
    config, _ = resolve_config([*FL, "--warm_start", "/some/data.jsonl"], gpu=False)
    assert config.warm_start_fraction is None
    for bad, match in (
        (["--warm_start", "random", "--warm_start_expert_fraction", "0.5"], "needs --warm_start expert"),
        (["--warm_start", "expert", "--warm_start_expert_fraction", "2"], r"in \[0, 1\]"),
        (
            ["--warm_start", "expert", "--warm_start_batch_size", "6", "--warm_start_micro_batch_size", "4"],
            "divisor",
        ),
        (["--warm_start", "expert", "--warm_start_learning_rate", "0"], "> 0"),
    ):
        with pytest.raises(ValueError, match=match):
            resolve_config([*FL, *bad], gpu=False)


def test_warm_start_then_rl_reports_three_evaluations(tiny_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*FL, *QUIET, "--model", tiny_dir, "--max_steps", "1", "--output_dir", str(out), "--num_eval_seeds", "3",
            "--warm_start", "expert", "--warm_start_expert_fraction", "0.5", "--warm_start_episodes", "4",
            "--warm_start_max_steps", "2", "--warm_start_batch_size", "2", "--warm_start_micro_batch_size", "2",
            "--warm_start_learning_rate", "1e-2"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    report = json.loads((out / "eval_report.json").read_text())
    ws = report["warm_start"]
    from llm_gym.agent.baselines import format_outcomes, format_rate

    # each evaluation printed with its Wilson intervals, the three baselines on the same line below them
    for label, key in (("base model", "base"), ("warm start", "warm_start"), ("after RL", "after_rl")):
        assert f"llmgym-train: {label:<10} (3 seeds): {format_outcomes(ws[key])}" in text
    best = max(report["constant_actions"].items(), key=lambda kv: kv[1]["rate"])
    baselines = (
        f"baselines on the same seeds and limits: random valid {format_rate(report['baseline']['random'])}, "
        f"best constant (always {best[0]}) {format_rate(best[1])}, optimum {format_rate(report['baseline']['optimum'])}"
    )
    assert baselines in text and "[0.0" in baselines
    assert ws["warm_start"] == report["evals"][0] and ws["after_rl"] == report["evals"][-1]
    assert (
        ws["base"]["success"]["n"] == ws["warm_start"]["success"]["n"] == ws["after_rl"]["success"]["n"] == 3
    )
    assert set(report["constant_actions"]) == {"Left", "Down", "Right", "Up"}
    # the data: the run's env, its own chat, seeds away from the evaluation seeds
    rows = [json.loads(line) for line in (out / "warm_start" / "data.jsonl").read_text().splitlines()]
    from collections import Counter

    assert ws["sft"]["steps"] == 2 and ws["sft"]["data"]["policies"] == dict(
        Counter(r["policy"] for r in rows)
    )
    assert {r["seed"] for r in rows} <= set(range(50_000, 50_004)) and {r["env_id"] for r in rows} == {
        "llmgym/CoordFrozenLake-v0"
    }
    # RL started from the warm start's model, and the RL model is what final/ holds
    run = json.loads((out / "llmgym_run.json").read_text())
    assert run["env"] == "llmgym/CoordFrozenLake-v0"
    assert (out / "warm_start" / "final" / "model.safetensors").is_file() and (out / "final").is_dir()
    sft_run = json.loads((out / "warm_start" / "final" / "llmgym_run.json").read_text())
    assert sft_run["one_shot_example"] == run["one_shot_example"]
    from llm_gym.trainer.resolve import has_gpu

    if not has_gpu():  # the CPU settings' demonstration is dropped: the warm start teaches the format
        assert run["one_shot_example"] is False and "no format demonstration" in text
        assert all(json.loads(r["chat"])["one_shot_example"] is False for r in rows)


def test_warm_start_data_on_evaluation_seeds_is_refused_before_loading(tiny_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    kwargs = {"success_rate": 1.0, "size": 3, "max_turns": 2, "max_actions_per_turn": 1, "max_actions": 2}
    rows = export_episodes(
        "llmgym/CoordFrozenLake-v0", range(120, 126), env_kwargs=kwargs, expert_fraction=0.0
    ).rows
    write_jsonl(rows, data)
    out = tmp_path / "run"
    argv = [*FL, *QUIET, "--model", tiny_dir, "--max_steps", "1", "--output_dir", str(out), "--num_eval_seeds", "3",
            "--warm_start", str(data)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "evaluation seeds (123, 124, 125" in err and not (out / "warm_start").exists()
    # a malformed row: refused before the base evaluation or any model
    bad = tmp_path / "bad.jsonl"
    rows = export_episodes("llmgym/CoordFrozenLake-v0", range(300, 302), env_kwargs=kwargs).rows
    write_jsonl([rows[0], {**rows[1], "messages": [{"role": "user", "content": "x"}]}], bad)
    argv[argv.index(str(data))] = str(bad)
    assert main([*argv, "--overwrite_output_dir"]) == 2
    err = capsys.readouterr().err
    assert "--warm_start: row 1:" in err and not (out / "warm_start").exists()
    other = tmp_path / "bandit.jsonl"
    write_jsonl(export_episodes("llmgym/Bandit-v0", range(300, 302)).rows, other)
    argv[argv.index(str(bad))] = str(other)
    assert main([*argv, "--overwrite_output_dir"]) == 2
    assert "warm-start data is for llmgym/Bandit-v0" in capsys.readouterr().err


def test_data_in_another_chat_than_the_run_is_named():
    from llm_gym.trainer.warm_start import chat_differences

    from llm_gym.agent.chat import ChatFormat

    kwargs = {"success_rate": 1.0, "size": 3, "max_turns": 2, "max_actions_per_turn": 1, "max_actions": 2}
    config, _ = resolve_config([*FL, "--one_shot_example", "False", "--demonstration", "solver"], gpu=False)
    same = export_episodes("llmgym/CoordFrozenLake-v0", [300], env_kwargs=kwargs).rows
    assert (
        chat_differences(config, same) == []
    )  # no demonstration shown: what it would answer does not matter
    shown = export_episodes(
        "llmgym/CoordFrozenLake-v0",
        [300],
        env_kwargs=kwargs,
        chat=ChatFormat(one_shot=True, include_instructions=False),
    ).rows
    assert chat_differences(config, shown) == [
        "include_instructions (data False, run True)",
        "one_shot_example (data True, run False)",
        "demonstration (data 'action', run 'solver')",
    ]
    assert chat_differences(config, [{k: v for k, v in same[0].items() if k != "chat"}]) == []


def test_an_sft_model_shown_another_chat_than_its_data_is_warned_with_the_flags(tmp_path):
    from llm_gym.trainer.warm_start import model_chat_warnings

    # what llmgym-sft records in its output folder: the data's chat, in config names
    data_chat = {"include_instructions": True, "one_shot_example": False, "demonstration": "action"}
    (tmp_path / "llmgym_sft.json").write_text(json.dumps({"data": {"chat": data_chat}}))
    shown, _ = resolve_config([*FL, "--one_shot_example", "True"], gpu=False)
    [line] = model_chat_warnings(shown, str(tmp_path))
    assert "one_shot_example (data False, run True)" in line and "pass --one_shot_example False" in line
    same, _ = resolve_config([*FL, "--one_shot_example", "False"], gpu=False)
    assert model_chat_warnings(same, str(tmp_path)) == []
    # not an llmgym-sft folder, or a record without a chat: nothing to compare, no warning and no crash
    assert model_chat_warnings(shown, str(tmp_path / "missing")) == []
    (tmp_path / "llmgym_sft.json").write_text('{"data": []}')
    assert model_chat_warnings(shown, str(tmp_path)) == []


def test_a_resumed_run_reuses_the_base_evaluation_only_with_the_same_settings(tmp_path, monkeypatch):
    from llm_gym.trainer import warm_start

    calls = []

    def fake_eval(model, env, seeds, **kw):
        calls.append(kw["temperature"])
        return {"success": {"rate": 0.25 * len(calls)}}

    monkeypatch.setattr(warm_start, "evaluate_model", fake_eval)
    lines: list[str] = []

    def base(*extra):
        config, _ = resolve_config([*FL, *QUIET, "--output_dir", str(tmp_path / "o"), *extra], gpu=False)
        return warm_start.base_evaluation(config, "m", [1, 2, 3], tmp_path, lines.append)

    first = base("--eval_temperature", "0.5")
    assert base("--eval_temperature", "0.5") == first and len(calls) == 1  # same settings: reused
    again = base(
        "--eval_temperature", "0.9"
    )  # another temperature: evaluated again, and saved as the new one
    assert calls == [0.5, 0.9] and again != first and any("other settings" in s for s in lines)
    assert base("--eval_temperature", "0.9") == again and len(calls) == 2
    (tmp_path / warm_start.BASE_EVAL_SETTINGS_FILE).write_text("{not json")  # unreadable: evaluated again
    base("--eval_temperature", "0.9")
    assert len(calls) == 3


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_kl_reference_after_a_warm_start_is_the_warm_start(tiny_dir, tmp_path, capsys, monkeypatch, lora):
    """With beta > 0 the KL of RL is to the warm-started model, not to the base model: after the RL steps the
    reference TRL uses (its frozen copy; with LoRA, the policy with its adapter disabled) gives the warm start's
    logits, and the term is logged under TRL's name ``kl``."""
    import torch
    from llm_gym.trainer.grpo import LLMGymGRPOTrainer
    from llm_gym.trainer.models import load_model_and_tokenizer

    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 8]])
    seen = {}
    train = LLMGymGRPOTrainer.train

    def spy(self, *args, **kwargs):
        result = train(self, *args, **kwargs)
        with torch.no_grad():
            if lora:
                assert self.ref_model is None
                with self.model.disable_adapter():
                    seen["ref"] = self.model(ids).logits
            else:
                seen["ref"] = self.ref_model(ids).logits
            seen["policy"] = self.model(ids).logits
        seen["logs"] = self.state.log_history
        return result

    monkeypatch.setattr(LLMGymGRPOTrainer, "train", spy)
    out = tmp_path / "run"
    argv = [*FL, *QUIET, "--model", tiny_dir, "--max_steps", "2", "--output_dir", str(out), "--num_eval_seeds", "0",
            "--warm_start", "expert", "--warm_start_episodes", "4", "--warm_start_max_steps", "2",
            "--warm_start_batch_size", "2", "--warm_start_micro_batch_size", "2", "--warm_start_learning_rate", "1e-2",
            "--beta", "0.04", "--filter_strategy", "off", "--learning_rate", "1e-2", "--use_peft", str(lora)]  # fmt: skip
    assert main(argv) == 0
    assert (
        f"KL (beta 0.04, logged as kl) to the warm start {out / 'warm_start' / 'final'}"
        in capsys.readouterr().out
    )
    logits = {}
    for name, path in (("warm", out / "warm_start" / "final"), ("base", tiny_dir)):
        model, _ = load_model_and_tokenizer(str(path), dtype="float32")
        with torch.no_grad():
            logits[name] = model.eval()(ids).logits
    torch.testing.assert_close(seen["ref"], logits["warm"], rtol=1e-5, atol=1e-5)
    assert (
        seen["ref"] - logits["base"]
    ).abs().max() > 1e-2  # the warm start moved the model away from the base
    assert (seen["policy"] - seen["ref"]).abs().max() > 0  # RL moved the policy; the reference stayed
    kl = [h["kl"] for h in seen["logs"] if "loss" in h]
    assert len(kl) == 2 and all(v is not None and v >= 0 for v in kl)
