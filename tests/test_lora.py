"""LoRA with TRL's ModelConfig flags: flag parity with TRL, GRPO (adapter moves, base frozen, a skipped round
changes nothing), PPO (value head trained, saved and restored with the adapter), and llmgym-eval on the adapter."""

from __future__ import annotations

import dataclasses
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_gym.trainer.config import LLMGymGRPOConfig  # noqa: E402
from llm_gym.trainer.grpo import LLMGymGRPOTrainer  # noqa: E402
from llm_gym.trainer.lora import LORA_FIELDS, LoRAFieldTypes, lora_arguments, peft_config  # noqa: E402
from llm_gym.trainer.models import ModelError, adapter_base, check_model, load_model_and_tokenizer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from tests._tiny import make_tiny_trainer, tiny_run_kwargs  # noqa: E402

LORA = dict(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules=["q_proj", "v_proj"])
G = 2


def test_the_typed_view_of_the_lora_fields_is_trls():
    # type checkers see LoRAFieldTypes in place of the group built from trl.ModelConfig: same names, same types
    import typing

    from trl import ModelConfig

    ours = typing.get_type_hints(LoRAFieldTypes)
    theirs = typing.get_type_hints(ModelConfig)
    assert tuple(ours) == LORA_FIELDS
    assert [f.name for f in dataclasses.fields(lora_arguments())] == list(LORA_FIELDS)
    for name, hint in ours.items():
        assert hint == theirs[name], name


def test_flags_names_and_defaults_are_trls(tmp_path):
    from llm_gym.trainer.resolve import resolve_config
    from trl import ModelConfig, get_peft_config

    defaults = ModelConfig()
    cfg_fields = {f.name: f for f in dataclasses.fields(LLMGymGRPOConfig)}
    for name in LORA_FIELDS:
        assert cfg_fields[name].default == getattr(defaults, name), name
        assert cfg_fields[name].metadata["help"] == ModelConfig.__dataclass_fields__[name].metadata["help"]
    argv = ["--env", "FrozenLake", "--use_peft", "--lora_r", "4", "--lora_alpha", "8"]
    argv += ["--lora_target_modules", "q_proj", "v_proj", "--lora_modules_to_save", "lm_head"]
    argv += ["-o", str(tmp_path)]
    config, _ = resolve_config(argv, gpu=False, log=lambda *a: None)
    ours = peft_config(config).to_dict()
    theirs = get_peft_config(
        ModelConfig(
            use_peft=True,
            lora_r=4,
            lora_alpha=8,
            lora_target_modules=["q_proj", "v_proj"],
            lora_modules_to_save=["lm_head"],
        )
    ).to_dict()
    assert ours == theirs and ours["r"] == 4 and set(ours["target_modules"]) == {"q_proj", "v_proj"}
    off, _ = resolve_config(["--env", "FrozenLake", "-o", str(tmp_path)], gpu=False, log=lambda *a: None)
    assert peft_config(off) is None


class Snapshots(TrainerCallback):
    """Adapter weights and AdamW state right after each optimizer step."""

    def __init__(self, trainer):
        self.trainer, self.steps = trainer, {}

    def on_step_end(self, args, state, control, **kwargs):
        tr = self.trainer
        lora = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
        opt = {
            id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in tr.optimizer.state[p].items()}
            for g in tr.optimizer.param_groups
            for p in g["params"]
            if p in tr.optimizer.state
        }
        self.steps[state.global_step] = (lora, opt)


def variance_in_first_round_only():
    calls = []

    def reward(prompts, completions, **_):
        calls.append(1)
        if len(calls) == 1:  # round 1: every group has reward variance
            return [float(i % G) for i in range(len(prompts))]
        return [0.5] * len(prompts)  # round 2: none, so the SNR filter skips the update

    return reward


def make(tiny_dir, out, algo="grpo", reward=None, **overrides):
    from llm_gym.trainer.algorithms import algorithm_overrides, trainer_class

    kwargs = tiny_run_kwargs(
        out,
        num_generations=G,
        learning_rate=1e-2,
        collapse_report="",
        filter_strategy="top_p",
        filter_empty_stop_steps=0,
        **algorithm_overrides(algo),
        **LORA,
    )
    kwargs.update(overrides)
    extra = {"reward_funcs": [reward]} if reward is not None else {}
    return make_tiny_trainer(tiny_dir, kwargs, trainer_cls=trainer_class(algo), **extra)


def test_grpo_trains_only_the_adapter_and_a_skipped_round_changes_nothing(tiny_dir, tmp_path):
    tr = make(tiny_dir, tmp_path / "out", reward=variance_in_first_round_only())
    assert isinstance(tr, LLMGymGRPOTrainer) and type(tr.model).__name__.startswith("Peft")
    trainable = {n for n, p in tr.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    base0 = {n: p.detach().clone() for n, p in tr.model.named_parameters() if not p.requires_grad}
    lora0 = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
    snaps = Snapshots(tr)
    tr.add_callback(snaps)
    tr.train()
    assert tr.state.global_step == 2 and tr.skipped_steps == 1
    lora1, opt1 = snaps.steps[1]
    lora2, opt2 = snaps.steps[2]
    assert any(not torch.equal(lora0[n], lora1[n]) for n in lora0 if "lora_B" in n)  # step 1 trained
    # step 2 was skipped: adapter weights and AdamW state bitwise unchanged
    assert all(torch.equal(lora1[n], lora2[n]) for n in lora1)
    assert opt1.keys() == opt2.keys() and opt1
    for pid in opt1:
        for k, v in opt1[pid].items():
            assert torch.equal(v, opt2[pid][k]) if torch.is_tensor(v) else v == opt2[pid][k], k
    # the base model never moves
    assert all(torch.equal(p, base0[n]) for n, p in tr.model.named_parameters() if n in base0)

    final = tmp_path / "final"
    tr.save_model(str(final))
    assert (final / "adapter_config.json").is_file() and not (final / "model.safetensors").exists()
    assert adapter_base(final) == str(tiny_dir) or os.path.samefile(adapter_base(final), tiny_dir)
    assert check_model(str(final)) == str(final.resolve())
    # llmgym-eval's loader puts the adapter on its base: same logits as the trained model
    from llm_gym.trainer.policies import HFPolicy

    policy = HFPolicy.from_pretrained(str(final), dtype="float32", device="cpu")
    ids = torch.tensor([[5, 17, 42, 9, 3]])
    tr.model.eval()
    with torch.no_grad():
        want = tr.model(input_ids=ids).logits
        got = policy.model(input_ids=ids).logits
        base_model, _ = load_model_and_tokenizer(tiny_dir, dtype="float32")
        base = base_model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(base, want, atol=1e-5)  # the adapter is really applied


def test_llmgym_eval_runs_on_a_saved_adapter(tiny_dir, tmp_path, capsys):
    from llm_gym.trainer.evaluate import main
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_dir),
        LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"),
    )
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)  # no tokenizer saved: it comes from the base model
    argv = [
        "--model",
        str(adapter),
        "--env",
        "FrozenLake",
        "--num_eval_seeds",
        "1",
        "--env_kwargs",
        '{"max_turns": 1}',
    ]
    argv += [
        "--max_new_tokens",
        "4",
        "--output_dir",
        str(tmp_path / "ev"),
        "--no_progress",
        "--dtype",
        "float32",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "ev" / "summary.json").is_file()
    AutoTokenizer.from_pretrained(tiny_dir)  # the base is untouched
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    with pytest.raises(ModelError, match="base_model_name_or_path"):
        check_model(str(adapter))


def test_ppo_value_head_trains_and_is_restored_with_the_adapter(tiny_dir, tmp_path):
    from llm_gym.trainer.ppo import VALUE_HEAD_FILE

    out = tmp_path / "ppo"
    tr = make(tiny_dir, out, "ppo", max_steps=1, save_strategy="steps", save_steps=1, filter_strategy="off")
    assert tr.value_head.weight.requires_grad
    head0 = tr.value_head.weight.detach().clone()
    tr.train()
    head1 = tr.value_head.weight.detach().clone()
    assert not torch.equal(head0, head1)
    ckpt = out / "checkpoint-1"
    assert (ckpt / VALUE_HEAD_FILE).is_file() and (ckpt / "adapter_model.safetensors").is_file()
    lora1 = {n: p.detach().clone() for n, p in tr.model.named_parameters() if "lora_" in n}

    again = make(tiny_dir, out, "ppo", max_steps=1, filter_strategy="off")
    assert not torch.equal(again.value_head.weight, head1)
    again.train(resume_from_checkpoint=str(ckpt))  # loads adapter + value head; no step left to run
    assert torch.equal(again.value_head.weight, head1)
    for n, p in again.model.named_parameters():
        if n in lora1:
            assert torch.equal(p, lora1[n]), n


def test_an_adapter_as_model_keeps_training_and_use_peft_on_it_is_refused(tiny_dir, tmp_path, capsys):
    from llm_gym.trainer.cli import main as train_main
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_dir),
        LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"),
    ).save_pretrained(adapter)
    model, _ = load_model_and_tokenizer(str(adapter), dtype="float32", adapter_trainable=True)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    frozen, _ = load_model_and_tokenizer(str(adapter), dtype="float32")  # evaluation: nothing trainable
    assert not any(p.requires_grad for p in frozen.parameters())
    argv = ["--model", str(adapter), "--use_peft", "--env", "FrozenLake", "-o", str(tmp_path / "o")]
    assert train_main(argv) == 2
    assert "is a LoRA adapter" in capsys.readouterr().err
