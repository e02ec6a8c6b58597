"""The model organism: a small causal LM trained from scratch, built in seconds for one environment.

``--model organism`` (or ``organism-s`` / ``organism-m`` / ``organism-l``) in ``llmgym-train``, ``llmgym-sft`` and
``llmgym-eval`` builds a random standard ``Qwen2ForCausalLM`` with a byte-level BPE tokenizer trained on the
environment's own texts (its instructions, the chat around them, and the observations and answers of solver and
random-valid episodes on seeds far from any evaluation seed) and a ChatML chat template. It is saved as an
ordinary model folder, so everything that takes a model folder takes it; nothing is downloaded.

Everything is deterministic: the corpus comes from fixed seeds, the tokenizer trainer is deterministic for a
given corpus, and the weights are drawn from ``torch.manual_seed(seed)``. The same name, environment and seed give
the same folder, byte for byte (tested). Built folders are cached under ``cache_dir()/organisms``; a run's own
copy is what its checkpoints and ``final/`` hold.

Why an organism: RL on a 135M-parameter model costs about 1,000 multi-turn episodes per CPU-hour; the organism
runs 10^5 or more, so learning tests, the CPU main job and studies of RL's dynamics fit on a laptop (the field
uses such model organisms to study collapse: Echo Chamber, arXiv:2504.07912; RL Excursions, arXiv:2606.04272).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: Bumped whenever the recipe (corpus, tokenizer or architecture) changes, so cached folders are rebuilt.
RECIPE_VERSION = 2

#: Seeds whose episodes make the tokenizer's corpus: far from llmgym-train's training seeds (0..) and its
#: evaluation seeds (``eval_seed``, 10^5..), so no evaluated board is read while the vocabulary is built.
CORPUS_SEED = 900_000_000
CORPUS_EPISODES = 400


@dataclass(frozen=True)
class OrganismShape:
    """A Qwen2 shape: hidden size, layers, attention heads (key/value heads), MLP width, vocabulary."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int


#: Sizes by suffix (``organism-s`` ...); ``organism`` alone is ``organism-m``. Parameter counts and episodes per
#: CPU-second are measured in ``docs/training/organism.md``.
SIZES: dict[str, OrganismShape] = {
    "s": OrganismShape(64, 2, 4, 2, 192, 800),
    "m": OrganismShape(128, 4, 4, 2, 384, 800),
    "l": OrganismShape(256, 4, 8, 4, 768, 1200),
}
DEFAULT_SIZE = "m"
_PREFIX = "organism"

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The pre-tokenizer split: a capitalised or lower-case word, one digit, one run of white space, or one other
# character. BPE merges only inside a piece, so a word is one and the same token wherever it stands and a board
# cell is a token of its own. Qwen2's split glues one leading character to a word and keeps punctuation runs:
# Bandit's arm shown as " Nurse" and answered as ">Nurse" were two unrelated tokens (8% valid names after the
# probe's 400 warm-start steps), and a FrozenLake row "PG_" read as "PG" + "_\n" (cells merged into tokens the
# model must learn one by one).
_SPLIT = r"""\p{Lu}\p{Ll}*|\p{Ll}+|\p{N}|\s+|[^\s\p{L}\p{N}]"""


class OrganismError(ValueError):
    """An organism name or build that cannot be used; the message says what to change."""


def is_organism(name: Any) -> bool:
    """Whether ``name`` (a ``--model`` value) names an organism rather than a folder or hub id."""
    if not isinstance(name, str):
        return False
    n = name.strip().lower()
    return n == _PREFIX or n.startswith(_PREFIX + "-") and not os.path.isdir(name)


#: Below this many parameters, settings measured harmful on the model organism print a warning. SmolLM2-135M stays
#: above it: on Bandit (benchmarks/smollm2_checks.py, one seed, 15 GRPO rounds at lr 1e-5) the entropy bonus
#: 0.001 changed nothing detectable (docs/training/organism.md#defaults; tests/test_smollm2_checks.py ties the
#: scope to that measurement).
SMALL_MODEL_PARAMETERS = 10_000_000


def small_model_warnings(num_parameters: int, entropy_coef: float) -> list[str]:
    """Warnings for a model of ``num_parameters`` run with settings that harmed the model organism
    (``benchmarks/organism_learning.py``'s defaults grid: Bandit, three RL seeds from one warm start)."""
    if num_parameters >= SMALL_MODEL_PARAMETERS:
        return []
    out = []
    if entropy_coef and entropy_coef > 0:
        out.append(
            f"entropy_coef {entropy_coef:g} on a {num_parameters / 1e6:.1f}M-parameter model: on the 0.9M "
            "organism an entropy bonus of 0.001 collapsed one of three Bandit runs to no valid answer "
            "(docs/training/organism.md#defaults); --entropy_coef 0 avoids it"
        )
    return out


def organism_size(name: str) -> str:
    """The size suffix of an organism name (``organism`` -> the default); :class:`OrganismError` if unknown."""
    n = name.strip().lower()
    size = DEFAULT_SIZE if n == _PREFIX else n[len(_PREFIX) + 1 :]
    if size not in SIZES:
        choices = ", ".join(f"{_PREFIX}-{s}" for s in SIZES)
        raise OrganismError(
            f"unknown organism size {name!r}; choose {_PREFIX} ({_PREFIX}-{DEFAULT_SIZE}) or {choices}"
        )
    return size


# ------------------------------------------------------------------------------------------------------ corpus
def corpus(
    env_id: str, env_kwargs: Mapping[str, Any] | None = None, episodes: int | None = None
) -> Iterator[str]:
    """The texts the tokenizer is trained on, in a fixed order: every message of solver and random-valid episodes
    on the corpus seeds, rendered with and without instructions and in both chat styles, plus the role names."""
    from llm_gym.agent.chat import ChatFormat
    from llm_gym.agent.export import iter_export

    episodes = CORPUS_EPISODES if episodes is None else int(episodes)
    yield from ("system", "user", "assistant")
    formats = [ChatFormat(), ChatFormat(include_instructions=False), ChatFormat(style="ragen")]
    for k, fmt in enumerate(formats):
        for fraction in (1.0, 0.0):
            seeds = range(CORPUS_SEED + k * episodes, CORPUS_SEED + (k + 1) * episodes)
            for _, row, _ in iter_export(
                env_id, seeds, env_kwargs=env_kwargs, chat=fmt, expert_fraction=fraction
            ):
                if row is not None:
                    for m in row["messages"]:
                        yield m["content"]


def build_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE with a word-isolating pre-tokenizer (:data:`_SPLIT`), ChatML special tokens and template, trained on ``texts``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        padding_side="left",
    )
    hf.chat_template = CHATML
    return hf


# ------------------------------------------------------------------------------------------------------ build
def _key(env_id: str, env_kwargs: Mapping[str, Any], size: str, seed: int) -> str:
    recipe = {"version": RECIPE_VERSION, "corpus": [CORPUS_SEED, CORPUS_EPISODES], "split": _SPLIT}
    text = json.dumps(
        {"env": env_id, "env_kwargs": dict(env_kwargs), "size": size, "seed": seed, "recipe": recipe},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_fields(size: str, vocab_size: int | None = None) -> dict[str, Any]:
    """The ``Qwen2Config`` fields of organism ``size`` (a key of :data:`SIZES`). ``vocab_size`` is the built
    tokenizer's; without it the size's full vocabulary, an upper bound (an env with fewer distinct merges gets a
    slightly smaller one): what ``--dry_run`` sizes before anything is built."""
    shape = SIZES[size]
    return {
        "vocab_size": shape.vocab_size if vocab_size is None else int(vocab_size),
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
    }


def build_organism(
    out_dir: str | os.PathLike,
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    size: str = DEFAULT_SIZE,
    seed: int = 0,
    corpus_episodes: int | None = None,
) -> Path:
    """Build the organism of ``size`` for ``env_id`` (with ``env_kwargs``) into ``out_dir`` and return it. The
    folder is an ordinary transformers model folder plus ``organism.json`` (the recipe it was built with)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from llm_gym.registration import resolve_env_id

    if size not in SIZES:
        raise OrganismError(f"unknown organism size {size!r}; choose one of {sorted(SIZES)}")
    env_id = resolve_env_id(env_id)
    kwargs = dict(env_kwargs or {})
    shape = SIZES[size]
    corpus_episodes = CORPUS_EPISODES if corpus_episodes is None else int(corpus_episodes)
    tok = build_tokenizer(list(corpus(env_id, kwargs, corpus_episodes)), shape.vocab_size)
    # A private generator, so building never moves the caller's global RNG streams.
    gen = torch.Generator().manual_seed(int(seed))
    config = Qwen2Config(
        **config_fields(size, len(tok)),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    recipe = {
        "recipe_version": RECIPE_VERSION,
        "env": env_id,
        "env_kwargs": kwargs,
        "size": size,
        "seed": int(seed),
        "shape": asdict(shape),
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {"first_seed": CORPUS_SEED, "episodes_per_part": int(corpus_episodes)},
    }
    (out / "organism.json").write_text(json.dumps(recipe, indent=1, sort_keys=True) + "\n")
    return out


def materialize(
    name: str, env_id: str | None, env_kwargs: Mapping[str, Any] | None = None, *, seed: int = 0
) -> str:
    """``name`` itself, or for an organism name the folder built for ``env_id`` and ``seed`` (what the CLIs pass
    on as ``--model`` once the run's environment is known)."""
    if not is_organism(name):
        return name
    if not env_id:
        raise OrganismError(f"--model {name}: an organism is built for one environment; pass --env")
    return str(organism_dir(name, env_id, env_kwargs, seed=seed))


def organism_dir(
    name: str,
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    cache: Path | None = None,
) -> Path:
    """The folder of organism ``name`` for this env and seed, built once into the cache (a few seconds)."""
    from llm_gym.registration import resolve_env_id

    from .defaults import cache_dir

    size = organism_size(name)
    env_id = resolve_env_id(env_id)
    kwargs = dict(env_kwargs or {})
    root = (cache or cache_dir()) / "organisms"
    out = root / f"{env_id.replace('/', '_')}-{size}-seed{int(seed)}-{_key(env_id, kwargs, size, int(seed))}"
    if (out / "organism.json").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".organism-", dir=root))
    os.chmod(tmp, 0o755)  # mkdtemp creates 0700; the cache is an ordinary folder
    try:
        build_organism(tmp, env_id, kwargs, size=size, seed=seed)
        if (out / "organism.json").is_file():  # another process won the race
            return out
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
