"""PPO trainer on a tiny random model: GAE targets, value loss, optimizer groups, checkpoints, training steps."""

import os

import pytest
import torch
from llm_gym.trainer.algorithms import algorithm_overrides
from llm_gym.trainer.batch import loss_mask
from llm_gym.trainer.ppo import (
    OLD_VALUES,
    RETURNS,
    VALUE_HEAD_FILE,
    VALUE_MASK,
    LLMGymPPOTrainer,
    load_value_head,
)

from tests._tiny import make_tiny_trainer, tiny_run_kwargs


def make_trainer(tiny_dir, out_dir, trainer_kwargs=None, **overrides):
    kwargs = tiny_run_kwargs(
        out_dir,
        num_prompts=None,  # rounds sized by the batch (steps_per_generation), as TRL does by default
        max_completion_length=64,
        max_new_tokens=8,
        learning_rate=1e-3,
        value_lr=1e-2,
        filter_strategy="off",
        **algorithm_overrides("ppo"),
    )
    kwargs.update(overrides)
    tr = make_tiny_trainer(tiny_dir, kwargs, trainer_cls=LLMGymPPOTrainer, **(trainer_kwargs or {}))
    tr.current_gradient_accumulation_steps = (
        1  # set by the training loop; needed when calling the loss directly
    )
    return tr


@pytest.fixture(scope="module")
def trainer(tiny_dir, tmp_path_factory):
    return make_trainer(tiny_dir, tmp_path_factory.mktemp("ppo_out"))


def synthetic_batch(tr, B=4, P=5, C=7):
    torch.manual_seed(1)
    vocab = tr.processing_class.vocab_size
    tool_mask = torch.ones(B, C, dtype=torch.long)
    tool_mask[:, 2:4] = 0  # an environment observation between two model turns
    completion_mask = torch.ones(B, C, dtype=torch.long)
    completion_mask[-1, -2:] = 0  # padding at the end of the last row
    return {
        "prompt_ids": torch.randint(10, vocab, (B, P)),
        "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(10, vocab, (B, C)),
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.zeros(B),
        "num_items_in_batch": (completion_mask * tool_mask).sum(),
    }


def test_value_head_attached_hooked_and_kept_out_of_save(trainer):
    lm = trainer.model
    assert lm.v_head is trainer.value_head and trainer.value_head.weight.requires_grad
    assert {"v_head.weight", "v_head.bias"} <= set(lm._keys_to_ignore_on_save)


def test_optimizer_gives_value_head_its_own_lr(trainer):
    trainer.optimizer = None
    opt = trainer.create_optimizer()
    head_ids = {id(p) for p in trainer.value_head.parameters()}
    groups_with_head = [g for g in opt.param_groups if {id(p) for p in g["params"]} & head_ids]
    assert len(groups_with_head) == 1
    g = groups_with_head[0]
    assert g["lr"] == trainer.args.value_lr and {id(p) for p in g["params"]} == head_ids
    others = [p for grp in opt.param_groups if grp is not g for p in grp["params"]]
    assert others and all(grp["lr"] == trainer.args.learning_rate for grp in opt.param_groups if grp is not g)
    trainer.optimizer = None


def test_ppo_targets_env_tokens_get_zero_advantage(trainer):
    batch = synthetic_batch(trainer)
    B = batch["prompt_ids"].size(0)
    trainer.model.train()
    scores = torch.tensor([1.0, 0.0, 0.5, -0.1])[:B]
    out = trainer.compute_advantages(dict(batch), scores)
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    adv, old_v, ret = out["advantages"], out[OLD_VALUES], out[RETURNS]
    assert adv.shape == mask.shape
    assert torch.all(adv[~mask] == 0) and torch.all(old_v[~mask] == 0) and torch.all(ret[~mask] == 0)
    # gamma = lambda = 1: every model token's return is the episode reward; advantages = whitened (R - V).
    assert torch.allclose(ret, scores[:, None].expand_as(ret) * mask, atol=1e-6)
    raw = (ret - old_v)[mask]
    assert torch.allclose(adv[mask], (raw - raw.mean()) / (raw.std() + 1e-8), atol=1e-4)


def _rows(batch, index):
    n = batch["completion_ids"].shape[0]
    return {
        k: v[index] if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == n else v
        for k, v in batch.items()
    }


def test_advantages_are_whitened_over_every_process_rows(trainer, monkeypatch):
    """Two processes simulated by splitting the rows: the all-reduce of the whitening moments (faked here with
    both processes' sums) makes the split whitening equal the one-process one (veRL whitens the global batch)."""
    batch = synthetic_batch(trainer, B=8)
    trainer.model.train()
    scores = torch.tensor([1.0] * 4 + [0.0] * 4)  # rank 0's seeds succeed, rank 1's fail
    # rank 1 holds 3 rows plus one row of multi-process equal-row padding (a masked copy, as select_rows pads)
    ranks = [torch.arange(0, 4), torch.tensor([4, 5, 6, 6])]
    parts = [_rows(batch, r) for r in ranks]
    parts[1]["tool_mask"] = parts[1]["tool_mask"].clone()
    parts[1]["tool_mask"][3] = 0
    real = torch.arange(7)
    one = trainer.compute_advantages(_rows(batch, real), scores[real])["advantages"]

    sent = []
    monkeypatch.setattr(trainer.accelerator, "reduce", lambda t, reduction: sent.append(t.clone()) or t)
    for part, r in zip(parts, ranks):  # what each process puts into the all-reduce
        trainer.compute_advantages(dict(part), scores[r])
    assert len(sent) == 2
    total = sent[0] + sent[1]
    monkeypatch.setattr(trainer.accelerator, "reduce", lambda t, reduction: total.to(t.device, t.dtype))
    out = [trainer.compute_advantages(dict(p), scores[r])["advantages"] for p, r in zip(parts, ranks)]
    split = torch.cat(out)
    torch.testing.assert_close(split[:7], one, atol=1e-5, rtol=0)
    assert split[7].abs().sum() == 0  # the padding row: no advantage, and not in the statistics
    mask = loss_mask(_rows(batch, real)).bool()
    row_means = torch.stack([one[b][mask[b]].mean() for b in range(7)])
    assert (row_means[:4] > 0.5).all() and (row_means[4:] < -0.5).all()


def test_unscorable_sample_gets_no_advantage_and_no_value_target(trainer):
    batch = synthetic_batch(trainer)
    trainer.model.train()
    out = trainer.compute_advantages(dict(batch), torch.tensor([1.0, float("nan"), 0.5, -0.1]))
    assert out["advantages"][1].abs().sum() == 0 and out[VALUE_MASK][1].sum() == 0
    assert out[VALUE_MASK][0].sum() > 0 and torch.isfinite(out["advantages"]).all()


def test_value_loss_falls_on_fixed_batch(tiny_dir, tmp_path):
    tr = make_trainer(tiny_dir, tmp_path, value_clip=None, entropy_coef=0.0)
    tr.model.train()
    batch = synthetic_batch(tr)
    mask = batch["completion_mask"] * batch["tool_mask"]
    batch["advantages"] = torch.zeros(mask.shape)  # no policy gradient: only the critic learns
    batch[OLD_VALUES] = torch.zeros(mask.shape)
    batch[RETURNS] = torch.tensor([1.0, -1.0, 0.5, 0.0])[:, None] * mask
    opt = torch.optim.Adam(tr.value_head.parameters(), lr=0.05)
    losses = []
    log_metric = tr.log_metric
    tr.log_metric = lambda name, value, mode=None: (
        losses.append(value) if name == "ppo/value_loss" else log_metric(name, value, mode)
    )
    for _ in range(40):
        opt.zero_grad()
        tr.compute_loss(tr.model, batch).backward()
        opt.step()
    assert len(losses) == 40
    assert losses[-1] < 0.5 * losses[0]


def test_checkpoint_round_trip_restores_value_head(trainer, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    head = trainer.value_head
    with torch.no_grad():
        head.weight.normal_()
        head.bias.fill_(0.25)
    saved = {k: v.clone() for k, v in head.state_dict().items()}
    trainer._save(str(tmp_path))
    assert os.path.isfile(tmp_path / VALUE_HEAD_FILE)
    assert not any("v_head" in k for k in load_file(tmp_path / "model.safetensors"))
    AutoModelForCausalLM.from_pretrained(tmp_path)  # a plain policy checkpoint, loadable as is
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    trainer._load_from_checkpoint(str(tmp_path))
    for k, v in head.state_dict().items():
        assert torch.equal(v, saved[k])


def test_load_value_head_errors(trainer, tmp_path):
    from safetensors.torch import save_file

    assert load_value_head(trainer.value_head, str(tmp_path)) is False  # absent: warns, keeps the init
    save_file({"weight": torch.zeros(1, 3), "bias": torch.zeros(1)}, str(tmp_path / VALUE_HEAD_FILE))
    with pytest.raises(ValueError, match="does not match"):
        load_value_head(trainer.value_head, str(tmp_path))


def test_two_ppo_steps_move_policy_and_value_head(tiny_dir, tmp_path):
    tr = make_trainer(tiny_dir, tmp_path)
    head0 = tr.value_head.weight.detach().clone()
    policy0 = {n: p.detach().clone() for n, p in tr.model.named_parameters() if "v_head" not in n}
    tr.train()
    assert tr.state.global_step == 2
    assert not torch.equal(tr.value_head.weight, head0)
    moved = [
        n for n, p in tr.model.named_parameters() if "v_head" not in n and not torch.equal(p, policy0[n])
    ]
    assert moved
    logged = [r for r in tr.state.log_history if "ppo/value_loss" in r]
    assert (
        len(logged) == 2
        and all(r["ppo/return_mean"] == r["reward"] for r in logged if "reward" in r)
        or logged
    )
    head_group = [g for g in tr.optimizer.param_groups if any(p is tr.value_head.weight for p in g["params"])]
    assert head_group[0]["initial_lr"] == tr.args.value_lr


def test_lora_keeps_value_head_trainable(tiny_dir, tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    tr = make_trainer(tiny_dir, tmp_path, max_steps=1, trainer_kwargs={"peft_config": lora})
    assert type(tr.model).__name__.startswith("Peft")
    assert tr.value_head.weight.requires_grad
    head0 = tr.value_head.weight.detach().clone()
    tr.train()
    assert not torch.equal(tr.value_head.weight, head0)
    tr.save_model(str(tmp_path / "final"))
    files = os.listdir(tmp_path / "final")
    assert VALUE_HEAD_FILE in files and "adapter_model.safetensors" in files


@pytest.mark.parametrize("drop", ["remove", "mask"])
def test_dapo_with_snr_filter(tiny_dir, tmp_path, drop):
    """The SNR filter runs after the PPO targets exist, so they are dropped or masked with their rows."""
    overrides = {
        **algorithm_overrides("dapo"),
        "filter_strategy": "top_p",
        "filter_drop": drop,
        "max_steps": 1,
    }
    tr = make_trainer(tiny_dir, tmp_path, **overrides)
    assert tr.args.epsilon_high == 0.28
    tr.train()
    logs = tr.state.log_history[0]
    assert "snr/kept_frac" in logs and "ppo/value_loss" in logs
