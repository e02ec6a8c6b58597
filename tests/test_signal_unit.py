"""``signals.decide_round`` on a fake trainer (only the trainer's public surface): multi-process slicing,
lockstep padding, mask mode, scaling, the skip callback with the trainer's own skip methods, config validation."""

from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from llm_gym.trainer.callbacks import make_signal_callbacks
from llm_gym.trainer.config import SignalArguments
from llm_gym.trainer.grpo import LLMGymGRPOTrainer
from llm_gym.trainer.signals import SignalState, decide_round, episodes_from_batch

G, B, T = 2, 4, 5  # 2 groups per process


@dataclass
class Args(SignalArguments):
    seed: int = 0
    steps_per_generation: int = 2
    gradient_accumulation_steps: int = 1
    gradient_checkpointing_kwargs: dict | None = None
    output_dir: str = "unused"


class FakeAccelerator:
    """Process ``rank`` of ``world``; gather pretends every process sent the same tensor."""

    def __init__(self, rank, world):
        self.process_index, self.num_processes, self.device = rank, world, torch.device("cpu")

    def gather(self, t):
        t = t.reshape(-1) if t.ndim == 0 else t
        parts = [t] * self.num_processes
        return torch.cat(parts)


class FakeTrainer(SimpleNamespace):
    """The public surface the signal glue and callbacks use, nothing more; the skipped-step methods are the
    real trainer's."""

    step_is_empty = LLMGymGRPOTrainer.step_is_empty
    skip_optimizer_step = LLMGymGRPOTrainer.skip_optimizer_step

    def log_metric(self, name, value, mode=None):
        self.metrics[name].append(float(value))

    def drop_last_metrics(self, names, count, mode="train"):
        for name in names:
            if self.metrics.get(name):
                del self.metrics[name][-count:]


def fake_trainer(rewards, rank=0, world=1, **args):
    tr = FakeTrainer(
        args=Args(mi_every=0, collapse_report="", **args),
        accelerator=FakeAccelerator(rank, world),
        num_generations=G,
        metrics=defaultdict(list),
        last_rollout=None,
        rewards=np.array(rewards, dtype=np.float64),
        last_round=None,
        _empty_step=False,
        skipped_steps=0,
    )
    tr.signal_state = SignalState.for_process(0, rank)
    return tr


def score(tr, b):
    """One round of the glue; the decision is kept as the trainer keeps it (``last_round``)."""
    tr.last_round = decide_round(tr, b, tr.rewards, tr.signal_state)
    return tr.last_round


def batch():
    return {
        "prompt_ids": torch.arange(B)[:, None].repeat(1, 3),
        "prompt_mask": torch.ones(B, 3, dtype=torch.long),
        "completion_ids": torch.arange(B * T).view(B, T),
        "completion_mask": torch.ones(B, T, dtype=torch.long),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "num_items_in_batch": torch.tensor(B * T * 2),
    }


def test_rank_with_no_kept_group_gets_masked_dummy_rows_while_others_train():
    # global: rank 0 holds groups 0-1 (with variance), rank 1 holds groups 2-3 (none)
    rewards = [0.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.2, 0.2]
    tr = fake_trainer(rewards, rank=1, world=2)
    decision = score(tr, batch())
    out = decision.batch
    assert not decision.skip  # the decision is global: rank 0 keeps something, so nobody skips
    # as many rows as the process that kept most (rank 0: 2 groups x G), all masked dummy rows here:
    # every process must send equal shapes to TRL's gathers
    assert out["completion_ids"].shape[0] == 4
    assert out["tool_mask"].sum() == 0 and out["advantages"].abs().sum() == 0
    assert decision.metrics["snr/kept_groups"] == 2.0
    tr0 = fake_trainer(rewards, rank=0, world=2)
    out0 = score(tr0, batch()).batch
    assert out0["prompt_ids"][:, 0].tolist() == [0, 1, 2, 3] and "tool_mask" not in out0


def test_local_slice_is_selected_by_process_index():
    rewards = [0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.5, 0.5]  # only global group 2 (rank 1's first group)
    out = score(fake_trainer(rewards, rank=1, world=2), batch()).batch
    assert out["prompt_ids"][:, 0].tolist() == [0, 1]
    assert "tool_mask" not in out and out["advantages"].tolist() == [1.0, -1.0]


def test_mask_mode_keeps_shapes_and_recomputes_num_items():
    tr = fake_trainer([0.0, 1.0, 0.5, 0.5], filter_drop="mask")
    out = score(tr, batch()).batch
    assert out["completion_ids"].shape == (B, T)
    assert out["tool_mask"][:2].sum() == 2 * T and out["tool_mask"][2:].sum() == 0
    assert int(out["num_items_in_batch"]) == 2 * T


def test_linear_loss_scaling_and_off_strategy():
    decision = score(fake_trainer([0.0, 1.0, 0.5, 0.5], filter_loss_scaling="linear"), batch())
    # the multiplier is decided here and applied by the trainer to the final advantages (test_ragen2 checks that)
    assert decision.loss_scale == 0.5 and decision.batch["advantages"].tolist() == [1.0, -1.0]
    tr = fake_trainer([0.5] * 4, filter_strategy="off")
    decision = score(tr, batch())
    out = decision.batch
    assert out["completion_ids"].shape[0] == B and not decision.skip and decision.loss_scale == 1.0
    assert int(out["num_items_in_batch"]) == B * T * 2  # untouched when nothing is filtered


def test_skip_callback_drops_grads_only_on_skipped_rounds():
    tr = fake_trainer([0.5] * 4)
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    tr.optimizer = torch.optim.AdamW([p])
    skip_cb = make_signal_callbacks(tr.args, tr)[0]
    tr.metrics["entropy"] = [0.3, 0.0]  # the last value came from the skipped step's masked rows
    assert score(tr, batch()).skip and tr.step_is_empty
    skip_cb.on_pre_optimizer_step(tr.args, None, None)
    assert p.grad is None and tr.metrics["entropy"] == [0.3] and tr.skipped_steps == 1
    tr.rewards = np.array([0.0, 1.0, 0.5, 0.5])
    score(tr, batch())
    p.grad = torch.ones(2)
    skip_cb.on_pre_optimizer_step(tr.args, None, None)
    assert p.grad is not None and tr.signal_state.consecutive_empty == 0 and tr.metrics["entropy"] == [0.3]
    assert tr.skipped_steps == 1


def test_snr_filter_under_deepspeed_is_refused_with_the_alternatives_named():
    tr = fake_trainer([0.5] * 4)
    assert len(make_signal_callbacks(tr.args, tr)) >= 2
    with pytest.raises(ValueError, match="refused under DeepSpeed") as err:
        make_signal_callbacks(tr.args, tr, deepspeed=True)
    assert "FSDP" in str(err.value) and "--filter_strategy off" in str(err.value)
    off = fake_trainer([0.5] * 4, filter_strategy="off")
    assert len(make_signal_callbacks(off.args, off, deepspeed=True)) >= 2


def test_rewards_must_cover_every_process_row():
    tr = fake_trainer([0.0] * 4, world=2)  # 2 processes x 4 rows need 8 rewards
    with pytest.raises(RuntimeError, match="4 gathered rewards for 2 processes x 4 rows"):
        score(tr, batch())


def test_unscorable_rows_leave_their_groups_variance():
    # group 0: rewards 0 and NaN -> one finite value, no spread; group 1 spreads: only group 1 is kept
    tr = fake_trainer([0.0, float("nan"), 0.0, 1.0])
    decision = score(tr, batch())
    assert (
        decision.batch["prompt_ids"][:, 0].tolist() == [2, 3] and decision.metrics["snr/kept_groups"] == 1.0
    )


@pytest.mark.parametrize(
    "field,value",
    [
        ("filter_strategy", "top_q"),
        ("filter_value", 0.0),
        ("filter_metric", "range"),
        ("filter_loss_scaling", "cubic"),
        ("filter_drop", "delete"),
        ("filter_empty_stop_steps", -1),
        ("mi_every", -2),
        ("mi_num_samples", 1),
        ("mi_std_eps", 0.0),
        ("mi_ema_decay", 1.0),
        ("mi_reasoning", "words"),
        ("mi_marginal", "exact"),
        ("mi_batch_size", 0),
        ("mi_scorer", "fast"),
        ("collapse_report", "../x.jsonl"),
    ],
)
def test_bad_signal_config_raises(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        SignalArguments(**{field: value}).validate_signal_args()
    SignalArguments().validate_signal_args()  # defaults are valid


def test_episodes_find_reasoning_inside_think_tags_of_each_turn():
    from tests._tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    turn1 = tok.encode("<think>go left</think><answer>Left</answer>", add_special_tokens=False)
    obs = tok.encode("\nState: hole ahead\n", add_special_tokens=False)
    turn2 = tok.encode("no tags here", add_special_tokens=False)
    comp = turn1 + obs + turn2
    env_mask = [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    tr = fake_trainer([0.0, 1.0])
    tr.processing_class = tok
    tr.args.mi_reasoning = "think"
    out = {
        "prompt_ids": torch.tensor([[tok.pad_token_id, 5, 6]] * 2),
        "prompt_mask": torch.tensor([[0, 1, 1]] * 2),
        "completion_ids": torch.tensor([comp] * 2),
        "completion_mask": torch.ones(2, len(comp), dtype=torch.long),
        "tool_mask": torch.tensor([env_mask] * 2),
    }
    eps = episodes_from_batch(tr, out, tr.signal_state)
    assert len(eps) == 2 and eps[0].group == eps[1].group == 0 and eps[0].prompt_ids == [5, 6]
    (a, b), second = eps[0].reasoning
    assert second is None  # no closing tag: no reasoning
    assert tok.decode(comp[a:b]).strip() == "go left"
    spans = [[[0, len(turn1)]], [[0, len(turn1)]]]  # the rollout's spans win over the mask's runs
    assert len(episodes_from_batch(tr, out, tr.signal_state, spans)[0].reasoning) == 1
