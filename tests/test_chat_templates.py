"""Any chat template: a history-rewriting (Qwen3 thinking) template gets TRL's training variant, with a log line;
one without a variant fails clearly; ``llmgym check-template`` reports why, with exit codes 0/1/2."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from llm_gym.trainer.chat_templates import (  # noqa: E402  # noqa: E402
    ChatTemplateError,
    ChatTemplateTokens,
    check_template,
    training_template_tokens,
    trl_training_template,
)
from llm_gym.trainer.rollouts import play_token_episodes  # noqa: E402
from trl.chat_template_utils import qwen3_chat_template, qwen3_training_chat_template  # noqa: E402

from llm_gym.cli import main as llmgym  # noqa: E402
from tests._tiny import build_tiny_tokenizer, tiny_config_kwargs  # noqa: E402

#: Qwen3's template with one character changed: still drops old reasoning, but TRL does not recognise it.
UNKNOWN_REWRITING = qwen3_chat_template.replace(
    "'<|im_start|>' + message.role + '\\n' + content }}",
    "'<|im_start|>' + message.role + '\\n' + content + '' }}",
)  # noqa: E501


@pytest.fixture()
def qwen3_tok():
    tok = build_tiny_tokenizer("chatml")
    tok.chat_template = qwen3_chat_template
    return tok


def test_qwen3_template_rewrites_history_and_trl_variant_is_swapped_in(qwen3_tok):
    with pytest.raises(ChatTemplateError, match="not prefix-preserving"):
        ChatTemplateTokens(qwen3_tok)
    logged: list[str] = []
    tokens = training_template_tokens(qwen3_tok, log=logged.append)
    assert tokens.chat_template == qwen3_training_chat_template
    assert qwen3_tok.chat_template == qwen3_chat_template  # the tokenizer (and what is saved) keeps its own
    assert len(logged) == 1 and "qwen3_training.jinja" in logged[0] and "not prefix-preserving" in logged[0]
    assert tokens.end_of_turn_text == "<|im_end|>"


class Scripted:
    def __init__(self, tokens, texts):
        self.tokens, self.texts, self.k = tokens, texts, 0

    def __call__(self, contexts, budgets):
        out = []
        for _ in contexts:
            out.append(
                self.tokens.encode(self.texts[self.k % len(self.texts)]) + [self.tokens.end_of_turn_id]
            )
            self.k += 1
        return out, [[-0.5] * len(r) for r in out]


def test_rollouts_with_the_variant_train_exactly_the_sampled_tokens(qwen3_tok):
    tokens = training_template_tokens(qwen3_tok, log=lambda _: None)
    replies = ["<think>go right</think><answer>Right</answer>", "<think>down</think><answer>Down</answer>"]
    (ep,) = play_token_episodes(
        "llmgym/FrozenLakeDeterministic-v0",
        [0],
        Scripted(tokens, replies),
        tokens,
        max_new_tokens=64,
        max_completion_length=4000,
        env_kwargs={"max_turns": 3},
    )
    assert len(ep.record.turns) >= 2
    model_ids = [t for t, m in zip(ep.completion_ids, ep.env_mask) if m == 1]
    expected = [i for turn in ep.record.turns for i in tokens.encode(turn.response) + [tokens.end_of_turn_id]]
    assert model_ids == expected  # the reasoning of every turn stays in the trained sequence, as sampled
    env_text = qwen3_tok.decode([t for t, m in zip(ep.completion_ids, ep.env_mask) if m == 0])
    assert env_text.count("<|im_start|>user") == len(ep.record.turns) - 1
    # the first prompt is the model's own generation prompt, as the variant renders it
    assert qwen3_tok.decode(ep.prompt_ids).endswith("<|im_start|>assistant\n")


def test_unknown_rewriting_template_fails_clearly():
    tok = build_tiny_tokenizer("chatml")
    tok.chat_template = UNKNOWN_REWRITING
    assert UNKNOWN_REWRITING != qwen3_chat_template and trl_training_template(tok) is None
    with pytest.raises(ChatTemplateError, match="not prefix-preserving.*TRL has no training variant"):
        training_template_tokens(tok)
    check = check_template(tok)
    assert not check.ok and check.prefix_preserving is False and check.variant is None
    assert "NOT USABLE" in check.lines()[-1]


def test_check_template_reports_each_case():
    plain = check_template(build_tiny_tokenizer("llama3"))
    assert plain.ok and plain.error is None and plain.prefix_preserving and plain.end_of_turn == "<|eot_id|>"
    tok = build_tiny_tokenizer("chatml")
    tok.chat_template = qwen3_chat_template
    swapped = check_template(tok)
    assert swapped.ok and swapped.uses_variant and swapped.prefix_preserving is False
    assert swapped.variant == "TRL's qwen3_training.jinja" and "OK with" in swapped.lines()[-1]
    tok.chat_template = None
    assert not check_template(tok).ok


def test_llmgym_check_template_cli(tmp_path, capsys):
    tok = build_tiny_tokenizer("chatml")
    tok.save_pretrained(tmp_path / "plain")
    tok.chat_template = qwen3_chat_template
    tok.save_pretrained(tmp_path / "qwen3")
    (tmp_path / "bad.jinja").write_text(UNKNOWN_REWRITING)
    assert llmgym(["check-template", str(tmp_path / "plain")]) == 0
    assert "verdict: OK: token-exact" in capsys.readouterr().out
    assert llmgym(["check-template", str(tmp_path / "qwen3")]) == 0
    out = capsys.readouterr().out
    assert "prefix-preserving (adding a turn leaves earlier text unchanged): no" in out
    assert "TRL training variant: TRL's qwen3_training.jinja (works)" in out
    assert (
        llmgym(["check-template", str(tmp_path / "plain"), "--chat_template", str(tmp_path / "bad.jinja")])
        == 1
    )
    assert "NOT USABLE" in capsys.readouterr().out
    assert llmgym(["check-template", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_trainer_trains_with_a_qwen3_template_and_says_so(tiny_dir, tmp_path, caplog):
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.grpo import LLMGymGRPOTrainer
    from llm_gym.trainer.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_dir, dtype="float32")
    tok.chat_template = qwen3_chat_template
    args = LLMGymGRPOConfig(
        **tiny_config_kwargs(
            tmp_path,
            env="FrozenLake",
            num_prompts=1,
            num_generations=2,
            per_device_train_batch_size=2,
            max_completion_length=32,
            max_new_tokens=6,
            max_turns=2,
            max_steps=1,
            collapse_report="",
            filter_strategy="off",
        )
    )
    with caplog.at_level(logging.WARNING, logger="llm_gym.trainer.chat_templates"):
        tr = LLMGymGRPOTrainer(model=model, args=args, processing_class=tok)
    assert any("qwen3_training.jinja" in r.getMessage() for r in caplog.records)
    tr.train()
    assert tr.state.global_step == 1
