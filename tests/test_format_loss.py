"""``--format_loss_weight``: the SFT loss with the reply's format tokens weighed down against its content."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from llm_gym.trainer.config import LLMGymSFTConfig  # noqa: E402
from llm_gym.trainer.sft import format_token_ids, format_weighted_loss, weighted_token_loss  # noqa: E402


def _batch(seed=0, batch=3, length=7, vocab=11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=g)
    labels = torch.randint(0, vocab, (batch, length), generator=g)
    labels[:, :2] = -100  # the prompt
    labels[1, 4:] = -100  # padding
    return logits, labels


def test_weight_one_is_transformers_causal_lm_loss_with_and_without_accumulation():
    from transformers.loss.loss_utils import ForCausalLMLoss

    logits, labels = _batch()
    ours = weighted_token_loss(logits, labels, frozenset({3, 5}), 1.0)
    assert torch.allclose(ours, ForCausalLMLoss(logits, labels, vocab_size=11), atol=1e-6)
    # under gradient accumulation the step's token count normalises, as in TRL/transformers
    n = int((labels[:, 1:] != -100).sum()) * 3
    ours = weighted_token_loss(logits, labels, frozenset({3}), 1.0, num_items_in_batch=n)
    theirs = ForCausalLMLoss(logits, labels, vocab_size=11, num_items_in_batch=n)
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_format_positions_are_weighted_and_the_mean_is_over_weights():
    logits, labels = _batch(seed=1)
    fmt = frozenset({2, 7})
    shift_logits, shift_labels = logits[:, :-1], labels[:, 1:]
    total = weights = 0.0
    for b in range(shift_labels.shape[0]):
        for t in range(shift_labels.shape[1]):
            y = int(shift_labels[b, t])
            if y == -100:
                continue
            w = 0.25 if y in fmt else 1.0
            total += w * -torch.log_softmax(shift_logits[b, t], -1)[y].item()
            weights += w
    got = weighted_token_loss(logits, labels, fmt, 0.25)
    assert math.isclose(got.item(), total / weights, rel_tol=1e-5)
    assert not math.isclose(got.item(), weighted_token_loss(logits, labels, fmt, 1.0).item(), rel_tol=1e-3)


def test_format_gradient_shrinks_with_the_weight():
    logits, labels = _batch(seed=2)
    fmt = frozenset(int(t) for t in labels[0, 2:4])  # two label tokens are "format"
    grads = {}
    for w in (1.0, 0.1):
        x = logits.clone().requires_grad_(True)
        weighted_token_loss(x, labels, fmt, w).backward()
        is_fmt = torch.isin(labels[:, 1:], torch.tensor(sorted(fmt)))
        grads[w] = (x.grad[:, :-1][is_fmt].norm() / x.grad[:, :-1][~is_fmt].norm()).item()
    assert grads[0.1] < grads[1.0] / 5


def test_format_ids_are_the_tags_and_end_of_turn_not_the_move():
    from llm_gym.trainer.chat_templates import ChatTemplateTokens

    from tests._tiny import build_tiny_tokenizer

    template = ChatTemplateTokens(build_tiny_tokenizer("chatml"))
    ids = format_token_ids(template)
    assert template.end_of_turn_id in ids
    assert set(template.encode("</answer>")) <= ids
    assert not set(template.encode("Left")) & ids - set(template.encode("<answer>"))
    assert format_weighted_loss(template, 1.0) is None  # TRL's own loss
    assert callable(format_weighted_loss(template, 0.1))


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, float("nan"), float("inf"), "0.1", True])
def test_weights_outside_zero_one_are_refused(bad):
    with pytest.raises(ValueError, match="format_loss_weight must be a number in"):
        LLMGymSFTConfig(output_dir="/tmp/x", data="d.jsonl", format_loss_weight=bad, use_cpu=True)


def test_warm_start_passes_its_weight_to_the_sft_config(tmp_path):
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.warm_start import sft_config

    with pytest.raises(ValueError, match="warm_start_format_loss_weight"):
        LLMGymGRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, warm_start="random", warm_start_format_loss_weight=0.0
        )
    config = LLMGymGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, warm_start="random", warm_start_format_loss_weight=0.2
    )
    assert sft_config(config, tmp_path / "ws", tmp_path / "d.jsonl").format_loss_weight == 0.2


def test_warm_start_passes_its_schedule_to_the_sft_config(tmp_path):
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.warm_start import sft_config

    def config(**kw):
        return LLMGymGRPOConfig(output_dir=str(tmp_path), use_cpu=True, warm_start="expert", **kw)

    # TRL's default unless asked: the Bandit organism profile's recorded warm start decays linearly
    assert sft_config(config(), tmp_path / "ws", tmp_path / "d").lr_scheduler_type == "linear"
    ws = sft_config(config(warm_start_lr_scheduler_type="constant"), tmp_path / "ws", tmp_path / "d")
    assert ws.lr_scheduler_type == "constant"
    with pytest.raises(ValueError, match="warm_start_lr_scheduler_type must be one of"):
        config(warm_start_lr_scheduler_type="cosine_typo")


def test_llmgym_sft_trains_with_the_weighted_loss(tiny_dir, tmp_path, monkeypatch):
    import json

    from llm_gym.trainer import sft
    from safetensors.torch import load_file

    from llm_gym.agent.export import export_episodes, write_jsonl

    data = tmp_path / "data.jsonl"
    kw = {"success_rate": 1.0, "size": 3, "max_turns": 3, "max_actions_per_turn": 1, "max_actions": 3}
    write_jsonl(export_episodes("llmgym/CoordFrozenLake-v0", range(300, 304), env_kwargs=kw).rows, data)
    calls = []
    real = sft.weighted_token_loss
    monkeypatch.setattr(sft, "weighted_token_loss", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    out = tmp_path / "out"
    argv = ["--model", tiny_dir, "--data", str(data), "--output_dir", str(out), "--max_steps", "2",
            "--per_device_train_batch_size", "2", "--learning_rate", "1e-2", "--format_loss_weight", "0.1",
            "--bf16", "False"]  # fmt: skip
    assert sft.main(argv) == 0
    assert calls and set(calls) == {0.1}
    before, after = (
        load_file(f"{tiny_dir}/model.safetensors"),
        load_file(str(out / "final" / "model.safetensors")),
    )
    assert any(not (before[k] == after[k]).all() for k in before)
    assert (
        json.loads((out / "final" / "llmgym_sft.json").read_text())["settings"]["format_loss_weight"] == 0.1
    )
