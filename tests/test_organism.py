"""The model organism: built by name, deterministic, an ordinary model folder, accepted by every CLI."""

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

from llm_gym.trainer import organism  # noqa: E402
from llm_gym.trainer.models import ModelError, resolve_model  # noqa: E402

ENV = "llmgym/Bandit-v0"


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


def test_names_and_sizes():
    assert organism.is_organism("organism") and organism.is_organism("Organism-S")
    assert not organism.is_organism("smollm2") and not organism.is_organism("./organism_runs/final/x")
    assert organism.organism_size("organism") == organism.DEFAULT_SIZE
    assert organism.organism_size("organism-l") == "l"
    with pytest.raises(organism.OrganismError, match="organism-s"):
        organism.organism_size("organism-xl")
    # without an env there is nothing to train the tokenizer on: a clear error, not a hub lookup
    with pytest.raises(ModelError, match="--env"):
        resolve_model("organism")
    with pytest.raises(organism.OrganismError, match="--env"):
        organism.materialize("organism", None)
    assert organism.materialize("smollm2", None) == "smollm2"


def test_build_is_deterministic_and_loads(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = organism.build_organism(tmp_path / "a", ENV, size="s", seed=3, corpus_episodes=20)
    b = organism.build_organism(tmp_path / "b", ENV, size="s", seed=3, corpus_episodes=20)
    c = organism.build_organism(tmp_path / "c", ENV, size="s", seed=4, corpus_episodes=20)
    assert _digest(a) == _digest(b)  # byte for byte: weights, tokenizer, config
    assert _digest(a)["model.safetensors"] != _digest(c)["model.safetensors"]  # the seed draws the weights
    assert (
        _digest(a)["tokenizer.json"] == _digest(c)["tokenizer.json"]
    )  # the tokenizer depends on the env only
    recipe = json.loads((a / "organism.json").read_text())
    assert recipe["env"] == ENV and recipe["size"] == "s" and recipe["seed"] == 3
    model = AutoModelForCausalLM.from_pretrained(a)
    tok = AutoTokenizer.from_pretrained(a)
    assert sum(p.numel() for p in model.parameters()) == recipe["parameters"]
    assert model.config.model_type == "qwen2" and len(tok) == model.config.vocab_size
    # the chat template and stop token the rollouts need
    from llm_gym.trainer.chat_templates import ChatTemplateTokens

    t = ChatTemplateTokens(tok)
    assert tok.convert_ids_to_tokens(t.end_of_turn_id) == "<|im_end|>"


def test_building_leaves_the_global_rng_alone(tmp_path):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    organism.build_organism(tmp_path / "m", ENV, size="s", seed=0, corpus_episodes=5)
    assert torch.equal(torch.rand(3), expected)


def test_cached_by_env_size_and_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(organism, "CORPUS_EPISODES", 5)
    first = organism.organism_dir("organism-s", "Bandit", seed=0, cache=tmp_path)
    again = organism.organism_dir("organism-s", "llmgym/Bandit-v0", seed=0, cache=tmp_path)
    other = organism.organism_dir("organism-s", "Bandit", seed=1, cache=tmp_path)
    assert first == again != other
    assert not [
        p for p in (tmp_path / "organisms").iterdir() if p.name.startswith(".")
    ]  # no temp folder left


@pytest.mark.slow
def test_every_cli_accepts_the_name(tmp_path, monkeypatch):
    """llmgym-eval plays it; llmgym-sft trains it on exported rows; the result is a model folder llmgym-eval
    takes back. (llmgym-train by name is in the learning tests.)"""
    from llm_gym.trainer import evaluate, sft

    from llm_gym.agent.export import export_episodes, write_jsonl

    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(organism, "CORPUS_EPISODES", 10)
    rc = evaluate.main(
        ["--model", "organism-s", "--env", "Bandit", "--num_eval_seeds", "4", "--max_new_tokens", "4",
         "--output_dir", str(tmp_path / "eval0"), "--no_progress"]
    )  # fmt: skip
    assert rc == 0 and (tmp_path / "eval0" / "summary.json").is_file()
    rows = export_episodes("llmgym/Bandit-v0", range(5000, 5008), expert_fraction=0.0).rows
    write_jsonl(rows, tmp_path / "rows.jsonl")
    rc = sft.main(
        ["--model", "organism-s", "--data", str(tmp_path / "rows.jsonl"), "--output_dir", str(tmp_path / "sft"),
         "--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no"]
    )  # fmt: skip
    assert rc == 0
    final = tmp_path / "sft" / "final"
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    rc = evaluate.main(
        ["--model", str(final), "--env", "Bandit", "--num_eval_seeds", "4", "--max_new_tokens", "4",
         "--output_dir", str(tmp_path / "eval1"), "--no_progress"]
    )  # fmt: skip
    assert rc == 0


@pytest.fixture(scope="module")
def bandit_tokenizer():
    texts = list(organism.corpus(ENV, {}, episodes=40))
    return organism.build_tokenizer(texts, 400)


_WORD = st.text(alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz"), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    word=st.one_of(_WORD, _WORD.map(str.capitalize)), before=st.sampled_from([" ", ">", ": ", "(", "\n", "_"])
)
def test_a_word_is_the_same_tokens_whatever_precedes_it(bandit_tokenizer, word, before):
    # why the split isolates words: Bandit answers a shown " Nurse" as ">Nurse"; with Qwen2's split those are two
    # unrelated tokens and the organism never learned to copy a name (8% valid answers after the warm start)
    ids = bandit_tokenizer(before + word)["input_ids"]
    alone = bandit_tokenizer(word)["input_ids"]
    assert ids[len(ids) - len(alone) :] == alone
    assert bandit_tokenizer.decode(ids) == before + word


def test_names_and_board_cells_are_tokens_of_their_own(bandit_tokenizer):
    tok = bandit_tokenizer
    shown = tok("The two arms are: Nurse and Clerk.")["input_ids"]
    answered = tok("<answer>Nurse</answer>")["input_ids"]
    nurse = tok("Nurse")["input_ids"]

    def holds(seq: list[int], part: list[int]) -> bool:
        return any(seq[i : i + len(part)] == part for i in range(len(seq)))

    assert holds(shown, nurse) and holds(answered, nurse)
    # one token per grid cell, even for cell letters that sit side by side
    pieces = [tok.decode([i]) for i in tok("PG_\nO__")["input_ids"]]
    assert pieces == ["P", "G", "_", "\n", "O", "_", "_"]


def test_small_model_warnings_follow_the_measured_harm():
    from llm_gym.trainer.organism import SMALL_MODEL_PARAMETERS, small_model_warnings

    (line,) = small_model_warnings(891_008, 0.001)
    assert "entropy_coef 0.001 on a 0.9M-parameter model" in line and "--entropy_coef 0" in line
    assert small_model_warnings(891_008, 0.0) == []
    # SmolLM2 (135M) is above the threshold: no harm measured there (tests/test_smollm2_checks.py)
    assert small_model_warnings(SMALL_MODEL_PARAMETERS, 0.001) == []


def test_dry_run_sizes_an_organism_by_name_without_building_it(tmp_path, monkeypatch):
    """--dry_run knows the organism's shape by name (no config.json exists before the run builds it): the plan
    counts the parameters a built organism has at the size's full vocabulary, and nothing is built."""
    from llm_gym.trainer import memory
    from llm_gym.trainer.dry_run import memory_report
    from llm_gym.trainer.resolve import resolve_config
    from transformers import Qwen2Config, Qwen2ForCausalLM

    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    config, meta = resolve_config(
        ["--profile", "organism", "--env", "Bandit", "--model", "organism-s"],
        gpu=True,
        log=lambda *_: None,
        dry_run=True,
    )
    text, _ = memory_report(config, meta)
    assert "organism-s, built at run time; 0.15M parameters" in text and "fits 80 GiB" in text, text
    assert not (tmp_path / "cache").exists()  # sized, not built
    built = Qwen2ForCausalLM(Qwen2Config(**organism.config_fields("s")))
    assert built.num_parameters() == 150_080  # the sizes table of docs/training/organism.md
    shape = memory.ModelShape.from_config(Qwen2Config(**organism.config_fields("s")).to_dict())
    assert shape.parameters() == built.num_parameters()
