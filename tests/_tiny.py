"""Tiny random models for tests and benchmarks (never part of the installed package's API).

``build_tiny_tokenizer`` trains a byte-level BPE in memory on text like what the environments show, with a chat
template in the style of a supported model family; ``build_tiny_model`` saves a random ~100k-parameter
``Qwen2ForCausalLM`` with it. Tests share one model per session through the ``tiny_model_dir`` fixture
(``tests/conftest.py``); benchmarks import this module from the repository root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Chat templates in the style of the models we support; written for the tiny tokenizers used in tests.
CHAT_TEMPLATES: dict[str, str] = {
    # Plain ChatML, as Qwen2.5 renders it when a system message is given.
    "chatml": (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # Qwen2.5 style: ChatML with a default system message when none is given.
    "qwen2.5": (
        "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
        "{% endif %}"
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # SmolLM2 style: ChatML, default system message inserted before the first message.
    "smollm2": (
        "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a small helpful assistant.<|im_end|>\n' }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # Llama 3.x style: BOS, role headers, trimmed content, <|eot_id|> ends every message, date lines in system.
    "llama3": (
        "{{ '<|begin_of_text|>' }}"
        "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] | trim %}"
        "{% set rest = messages[1:] %}{% else %}{% set sys = '' %}{% set rest = messages %}{% endif %}"
        "{{ '<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\n' + sys + "
        "'<|eot_id|>' }}"
        "{% for m in rest %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + "
        "'<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
}

#: The tiny Qwen2's shape (hidden 64, 2 layers, ~100k parameters with a 400-token vocabulary).
TINY_QWEN2_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}

_SPECIALS = {
    "chatml": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", "<|endoftext|>"),
    "llama3": (
        ["<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|eot_id|>",
        "<|end_of_text|>",
    ),
}
_QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def _tiny_corpus() -> list[str]:
    """Text like what the tokenizer will see: instructions, states, answers of every registered env we can make."""
    texts = [
        "You're a helpful assistant. Turn 1: State: You have 10 actions and 5 turns left.",
        "Always answer in the format <think>...</think><answer>...</answer> with no other text.",
        "<think>I should move towards the goal.</think><answer>Left || Down</answer>",
        "<think>The arm with the higher reward.</think><answer>Phoenix</answer> Reward of your last answer: 1",
        "Warning: your last answer was invalid (missing <think>...</think> block), so the state did not change.",
        "Countdown: use the numbers 12 45 7 3 with + - * / to reach 52. <answer>45 + 7</answer>",
        "What is 7 + 5? The answer is 12.",
    ]
    try:
        import gymnasium as gym

        from llm_gym.registration import make_env

        for env_id in (
            "llmgym/FrozenLake-v0",
            "llmgym/Bandit-v0",
            "llmgym/Sokoban-v0",
            "llmgym/Countdown-v0",
        ):
            if env_id not in gym.registry:
                continue
            try:
                env = make_env(env_id)
                for seed in range(3):
                    obs, _ = env.reset(seed=seed)
                    texts += [env.unwrapped.instructions, obs]
                env.close()
            except Exception:  # an env still under construction must not break test models
                continue
    except ImportError:
        pass
    return texts * 4


def build_tiny_tokenizer(template: str = "chatml", vocab_size: int = 400) -> Any:
    """A byte-level BPE trained in memory with Qwen2's pre-tokenizer (so a saved ``qwen2`` checkpoint reloads
    with identical ids) and a chat template in the given style (``chatml``, ``qwen2.5``, ``smollm2``, ``llama3``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if template not in CHAT_TEMPLATES:
        raise ValueError(f"unknown template style {template!r}; choose from {sorted(CHAT_TEMPLATES)}")
    specials, eos, pad = _SPECIALS["llama3" if template == "llama3" else "chatml"]
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    bpe = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=bpe)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos,
        pad_token=pad,
        bos_token=None,
        unk_token=None,
        padding_side="left",
    )
    hf.chat_template = CHAT_TEMPLATES[template]
    return hf


def build_tiny_model(out_dir: str | os.PathLike, *, template: str = "chatml", seed: int = 0) -> str:
    """Save a random tiny ``Qwen2ForCausalLM`` (hidden 64, 2 layers, ~100k parameters) and its tokenizer to
    ``out_dir``; returns the folder. Reloads with ``from_pretrained`` to identical token ids."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tiny_tokenizer(template)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tok),
        **TINY_QWEN2_SHAPE,
        max_position_embeddings=4096,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def tiny_trl_kwargs(output_dir: str | os.PathLike, **overrides: Any) -> dict[str, Any]:
    """TRL ``GRPOConfig`` keyword arguments for a quiet CPU test run: no GPU or bf16, no trackers, no
    checkpoints, no gradient checkpointing, no progress bar; ``overrides`` replace or add to them."""
    return {
        "output_dir": str(output_dir),
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "gradient_checkpointing": False,
        "disable_tqdm": True,
        **overrides,
    }


def tiny_config_kwargs(output_dir: str | os.PathLike, **overrides: Any) -> dict[str, Any]:
    """``LLMGymGRPOConfig`` keyword arguments for a quiet CPU test run: ``tiny_trl_kwargs`` plus no evaluation,
    no episode records and no MI estimates; ``overrides`` replace or add to them."""
    quiet = {"num_eval_seeds": 0, "episode_records": "", "mi_every": 0}
    return tiny_trl_kwargs(output_dir, **{**quiet, **overrides})


def tiny_run_kwargs(output_dir: str | os.PathLike, **overrides: Any) -> dict[str, Any]:
    """``tiny_config_kwargs`` plus the run most trainer tests vary from: two-turn FrozenLake, 2 groups of 2,
    6 new tokens a turn, 2 optimizer steps of 4 rows, logging every step, seed 0."""
    run = {
        "env": "FrozenLake",
        "num_prompts": 2,
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 48,
        "max_new_tokens": 6,
        "max_turns": 2,
        "max_steps": 2,
        "logging_steps": 1,
        "seed": 0,
    }
    return tiny_config_kwargs(output_dir, **{**run, **overrides})


def make_tiny_trainer(
    tiny_dir: str | os.PathLike,
    config_kwargs: dict[str, Any],
    *,
    trainer_cls: Any = None,
    **trainer_kwargs: Any,
) -> Any:
    """A trainer (``LLMGymGRPOTrainer`` unless ``trainer_cls``) on the float32 tiny model at ``tiny_dir``, with
    ``LLMGymGRPOConfig(**config_kwargs)``; ``trainer_kwargs`` (``reward_funcs``, ``peft_config``, ...) go to it."""
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.grpo import LLMGymGRPOTrainer
    from llm_gym.trainer.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_dir, dtype="float32")
    cls = trainer_cls or LLMGymGRPOTrainer
    return cls(model=model, args=LLMGymGRPOConfig(**config_kwargs), processing_class=tok, **trainer_kwargs)


def tiny_train_argv(
    model_dir: str | os.PathLike, output_dir: str | os.PathLike, num_eval_seeds: int
) -> list[str]:
    """``llmgym-train`` arguments for a quiet tiny Bandit run that saves a checkpoint every step."""
    return [
        "--env",
        "Bandit",
        "--model",
        str(model_dir),
        "--output_dir",
        str(output_dir),
        "--num_eval_seeds",
        str(num_eval_seeds),
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
        "--report_to",
        "none",
        "--disable_tqdm",
        "True",
    ]
