"""LLMGymGRPOConfig: environment names, group sizes, env kwargs, validation messages."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from llm_gym.trainer.config import LLMGymGRPOConfig  # noqa: E402

from llm_gym.registration import resolve_env_id  # noqa: E402

BASE = dict(use_cpu=True, bf16=False, report_to="none")


def cfg(tmp_path, **kw):
    return LLMGymGRPOConfig(output_dir=str(tmp_path), **{**BASE, **kw})


@pytest.mark.parametrize(
    ("name", "env_id"),
    [
        ("FrozenLake", "llmgym/FrozenLake-v0"),
        ("frozen_lake", "llmgym/FrozenLake-v0"),
        ("Sokoban", "llmgym/Sokoban-v0"),
        ("bandit", "llmgym/Bandit-v0"),
        ("Countdown", "llmgym/Countdown-v0"),
        ("MetaMathQA", "llmgym/MetaMathQA-v0"),
        ("llmgym/FrozenLakeSlippery-v0", "llmgym/FrozenLakeSlippery-v0"),
        ("SokobanLarge", "llmgym/SokobanLarge-v0"),
    ],
)
def test_env_names_resolve(name, env_id):
    assert resolve_env_id(name) == env_id


def test_group_sampling_sets_generation_batch(tmp_path):
    c = cfg(tmp_path, num_prompts=3, num_generations=4, per_device_train_batch_size=6)
    assert c.generation_batch_size == 12 and c.steps_per_generation == 2 and c.num_prompts_per_round == 3
    assert c.shuffle_dataset is False and c.num_generations_eval == 1


def test_env_kwargs_and_limits(tmp_path):
    c = cfg(tmp_path, env="FrozenLake", env_kwargs='{"size": 6, "max_turns": 7}', max_turns=4, think=False)
    assert c.env_kwargs == {"size": 6, "max_turns": 7}
    assert c.make_env_kwargs() == {"max_turns": 7, "think": False, "size": 6}  # env_kwargs win
    assert cfg(tmp_path, env="Countdown").make_env_kwargs() == {}  # None keeps each env's defaults
    c = cfg(tmp_path, one_shot_example=True)
    assert c.chat_format().history_window is None and c.chat_format().one_shot  # training: full history
    with pytest.raises(
        TypeError, match="history_window"
    ):  # no unused field (llmgym-eval has --history-window)
        cfg(tmp_path, history_window=2)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(env="Chess"), "unknown environment 'Chess'"),
        (dict(env_kwargs="{not json"), "env_kwargs must be a JSON object"),
        (dict(max_turns=0), "max_turns must be a positive integer"),
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
        (dict(num_prompts=0), "num_prompts must be a positive integer"),
        (dict(num_prompts=2, steps_per_generation=2), "either num_prompts or steps_per_generation"),
        (dict(num_prompts=3, num_generations=2, per_device_train_batch_size=4), "must be divisible"),
        (
            dict(
                num_prompts=2, num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=4
            ),
            r"gradient_accumulation_steps \(4\) must divide .* = 2",
        ),
        (dict(num_eval_seeds=-1), "num_eval_seeds"),
        (dict(mask_truncated_completions=True), "env/budget_stop_rate"),
    ],
)
def test_bad_settings_raise_clear_errors(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        cfg(tmp_path, **kw)


def test_best_model_and_plateau_go_by_eval_success_not_a_loss(tmp_path):
    """Evaluation reports no loss, so transformers' default "loss" metric would fail at the first evaluation."""
    keep = dict(eval_strategy="steps", save_strategy="steps", eval_steps=2, save_steps=2)
    c = cfg(tmp_path, load_best_model_at_end=True, **keep)
    assert c.metric_for_best_model == "env/success" and c.greater_is_better is True
    c = cfg(tmp_path, lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="steps", eval_steps=2)
    assert c.metric_for_best_model == "env/success"
    assert cfg(tmp_path).metric_for_best_model is None  # nothing needs one
    for metric in ("loss", "eval_loss"):
        with pytest.raises(ValueError, match="reports no loss"):
            cfg(tmp_path, metric_for_best_model=metric, **keep)


def test_the_config_is_a_plain_class_and_the_shared_defaults_load_no_torch():
    import subprocess
    import sys

    import llm_gym.trainer.config as config_module

    assert LLMGymGRPOConfig.__module__ == config_module.__name__ == "llm_gym.trainer.config"
    assert "LLMGymGRPOConfig" in vars(config_module)  # defined at import, not on first access
    code = (
        "import sys, llm_gym.trainer.defaults, llm_gym.trainer.evaluate, llm_gym.trainer.policies; "
        "print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
