"""The bundled ``config.json`` files (``trainer/model_configs``): each recounts to the parameter count the Qwen2.5
report publishes, by hand and with transformers' own module (meta device, no memory); base and Instruct share
shapes; the README names every file; the dry run uses them offline, matched by exact hub id only."""

import json

import pytest
from llm_gym.trainer.dry_run import BUNDLED_CONFIGS, bundled_model_configs, find_model_config
from llm_gym.trainer.memory import ModelShape

#: Qwen2.5 report / model cards: total and non-embedding parameters, in billions (two decimals).
PUBLISHED = {
    "Qwen/Qwen2.5-0.5B": (0.49, 0.36),
    "Qwen/Qwen2.5-1.5B": (1.54, 1.31),
    "Qwen/Qwen2.5-3B": (3.09, 2.77),
    "Qwen/Qwen2.5-7B": (7.62, 6.53),
}


def test_every_profile_model_is_bundled_except_the_one_without_a_public_copy():
    have = set(bundled_model_configs())
    expected = {f"{base}{suffix}" for base in PUBLISHED for suffix in ("", "-Instruct")}
    assert have == expected - {"Qwen/Qwen2.5-1.5B"}  # see model_configs/README.md
    readme = (BUNDLED_CONFIGS / "README.md").read_text()
    assert all(f"`{hub_id}`" in readme for hub_id in expected)


@pytest.mark.parametrize("hub_id", sorted(bundled_model_configs()))
def test_bundled_config_has_the_published_parameter_count(hub_id):
    path = bundled_model_configs()[hub_id]
    text = path.read_text()
    cfg = json.loads(text)
    assert text == json.dumps(cfg, indent=2, sort_keys=True) + "\n"  # transformers' layout
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["eos_token_id"] == (151645 if hub_id.endswith("-Instruct") else 151643)
    shape = ModelShape.from_config(cfg)
    total, non_embedding = PUBLISHED[hub_id.removesuffix("-Instruct")]
    assert round(shape.parameters() / 1e9, 2) == total
    assert round(shape.non_embedding_parameters() / 1e9, 2) == non_embedding
    torch = pytest.importorskip("torch")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**cfg))
    assert sum(p.numel() for p in model.parameters()) == shape.parameters()


def test_base_and_instruct_share_every_shape():
    configs = bundled_model_configs()
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    for hub_id, path in configs.items():
        twin = configs.get(hub_id.removesuffix("-Instruct"))
        if hub_id.endswith("-Instruct") and twin:
            a, b = json.loads(path.read_text()), json.loads(twin.read_text())
            assert [a[k] for k in keys] == [b[k] for k in keys]


def _no_hub_cache(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))


def test_lookup_prefers_local_files_and_matches_hub_ids_exactly(tmp_path, monkeypatch):
    _no_hub_cache(monkeypatch, tmp_path)
    assert find_model_config("Qwen/Qwen2.5-3B") == bundled_model_configs()["Qwen/Qwen2.5-3B"]
    for name in ("Qwen/../Qwen/Qwen2.5-3B", "qwen/qwen2.5-3b", "Qwen", "Qwen/Qwen2.5-3B/config.json"):
        assert find_model_config(name) is None, name
    folder = tmp_path / "Qwen" / "Qwen2.5-3B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)  # a local folder of that name wins over the bundled copy
    assert find_model_config("Qwen/Qwen2.5-3B").resolve() == folder / "config.json"


def test_offline_dry_run_prints_the_memory_line_from_the_bundled_config(tmp_path, monkeypatch, capsys):
    from llm_gym.trainer.cli import main

    _no_hub_cache(monkeypatch, tmp_path)
    assert main(["--profile", "ragen2", "--env", "Sokoban", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "model_configs/Qwen/Qwen2.5-3B/config.json; 3.09B parameters, policy + critic" in out
    line = next(x for x in out.splitlines() if x.startswith("memory: "))
    assert "GiB per GPU (1 GPU): does NOT fit 80 GiB, fits 141 GiB" in line
    assert "FSDP x8" in out and "fits 141 GiB" in out
