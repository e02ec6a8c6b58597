"""Update time with SNR filtering vs the same batch without it (RAGEN-2's step-time saving).

One rollout batch of P groups x G samples (synthetic token ids, realistic masks) goes through the
real ``LLMGymGRPOTrainer`` update path: ``llm_gym.trainer.signals.decide_round`` (filter), TRL's shuffle and
``split_tensor_dict`` into ``steps_per_generation`` micro-batches, ``compute_loss`` + ``backward`` per
micro-batch, one ``optimizer.step()``. Only the update is timed, in process CPU seconds (min of repeats), so
other processes on a shared machine do not distort it. The reference is the unfiltered batch
(``filter_strategy=off``) in the same run; ``mask`` mode (zero loss weight, full compute) is shown too.
Rewards give exactly k groups reward variance, so top_p at rho=0.9 keeps k of P groups.

Target: update-time ratio (filtered / unfiltered) within 10 percentage points of the kept fraction.

A second table times ``filter_update_steps="proportional"`` (RAGEN: fewer optimizer steps after filtering): one
optimizer step per update batch of ``--step-rows`` rows (default one group), the kept rows (padded with copies to
whole update batches) fill the first steps, the round's other steps get an empty micro-batch and no optimizer
step. Its reference is the unfiltered batch through the same path (every step taken).

    OMP_NUM_THREADS=1 python benchmarks/filter_update_time.py
    OMP_NUM_THREADS=1 python benchmarks/filter_update_time.py --micro-batch 4 --kept 3,5   # with padding rows
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

import _offline  # noqa: F401  (offline env vars and repo path, before any torch import)


def build_trainer(
    groups: int,
    group_size: int,
    micro_batch: int,
    completion_len: int,
    hidden: int,
    layers: int,
    **config: object,
):
    """A real ``LLMGymGRPOTrainer`` around a random Qwen2 of the given size (no rollouts are run)."""
    import torch
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.grpo import LLMGymGRPOTrainer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests._tiny import build_tiny_tokenizer, tiny_config_kwargs

    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=hidden,
            intermediate_size=3 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    )
    args = LLMGymGRPOConfig(
        **tiny_config_kwargs(
            tempfile.mkdtemp(prefix="bench_filter_"),
            env="Bandit",
            num_prompts=groups,
            num_generations=group_size,
            per_device_train_batch_size=micro_batch,
            max_completion_length=completion_len,
            collapse_report="",
            **config,
        )
    )
    tr = LLMGymGRPOTrainer(model=model, args=args, processing_class=tok)
    tr.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    tr.model.train()
    return tr


def synthetic_batch(tr, prompt_len: int, completion_len: int, kept_groups: int, seed: int = 0):
    """A scored batch as TRL returns it, plus the gathered rewards: groups < kept_groups have variance."""
    import torch

    g = torch.Generator().manual_seed(seed)
    G, P = tr.num_generations, tr.args.num_prompts
    n = P * G
    vocab = len(tr.processing_class)
    lengths = torch.randint(completion_len // 2, completion_len + 1, (n,), generator=g)
    completion_mask = (torch.arange(completion_len)[None] < lengths[:, None]).long()
    tool_mask = torch.ones(n, completion_len, dtype=torch.long)
    for r in range(n):  # one environment observation in the middle of each trajectory
        a = int(lengths[r]) // 3
        tool_mask[r, a : a + 8] = 0
    rewards = torch.full((n,), 0.5)
    for grp in range(kept_groups):
        rewards[grp * G : (grp + 1) * G] = torch.arange(G).float() % 2
    mean = rewards.view(P, G).mean(1, keepdim=True)
    std = rewards.view(P, G).std(1, keepdim=True)
    adv = ((rewards.view(P, G) - mean) / (std + 1e-4)).view(-1)
    out = {
        "prompt_ids": torch.randint(10, vocab, (n, prompt_len), generator=g),
        "prompt_mask": torch.ones(n, prompt_len, dtype=torch.long),
        "completion_ids": torch.randint(10, vocab, (n, completion_len), generator=g),
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": adv,
        "num_items_in_batch": (completion_mask * tool_mask).sum(),
    }
    return out, rewards[:, None]


def filtered(tr, out, rewards, strategy: str, drop: str = "remove"):
    """Run the real filter on a copy of ``out`` with the given strategy; returns its ``RoundDecision``."""
    from llm_gym.trainer.batch import episode_rewards
    from llm_gym.trainer.signals import decide_round

    tr.args.filter_strategy, tr.args.filter_drop = strategy, drop
    scores = episode_rewards(rewards, tr.reward_weights).double().numpy()
    return decide_round(tr, copy.copy(out), scores, tr.signal_state)


def update_seconds(tr, out, optimizer) -> float:
    """One optimizer step over ``out`` the way TRL consumes it: shuffle, split, loss+backward per micro-batch."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    optimizer.zero_grad(set_to_none=True)
    start = time.process_time()  # CPU time: other processes on a shared machine do not inflate it
    for mb in split_tensor_dict(shuffle_sequence_dict(out), tr.args.steps_per_generation):
        tr.compute_loss(tr.model, mb).backward()
    optimizer.step()
    return time.process_time() - start


def proportional_update_seconds(tr, out, optimizer, real: int | None = None) -> tuple[float, int]:
    """The round the way ``filter_update_steps="proportional"`` trains it: the trainer's split into micro-batches
    (kept rows first, empty ones after), an optimizer step per update batch that has rows (the first ``real``
    micro-batches; None: all), none for the others. Returns (CPU seconds, optimizer steps taken)."""
    from llm_gym.trainer.batch import split_micro_batches

    spg, ga = tr.args.steps_per_generation, tr.args.gradient_accumulation_steps
    real = spg if real is None else real
    start = time.process_time()
    chunks, _ = split_micro_batches(out, tr.args.per_device_train_batch_size, spg)
    steps = 0
    optimizer.zero_grad(set_to_none=True)
    for i, mb in enumerate(chunks):
        tr.compute_loss(tr.model, mb).backward()
        if (i + 1) % ga == 0:
            if i < real:
                optimizer.step()
                steps += 1
            optimizer.zero_grad(set_to_none=True)  # an empty step: no update (the skip callback's grad=None)
    return time.process_time() - start, steps


def proportional_table(a, kept_list: list[int]) -> float:
    """Update time under filter_update_steps=proportional vs the unfiltered round; returns the worst gap (pp)."""
    import torch

    tr = build_trainer(
        a.groups,
        a.group_size,
        a.step_rows,
        a.completion_len,
        a.hidden,
        a.layers,
        filter_update_steps="proportional",
        filter_strategy="top_p",
    )
    opt = torch.optim.AdamW(tr.model.parameters(), lr=1e-6)
    print(
        f"\nfilter_update_steps=proportional: an optimizer step per {a.step_rows} rows, "
        f"{tr.args.steps_per_generation} steps per unfiltered round"
    )
    print(
        f"{'kept':>9} {'rows':>5} {'copies':>6} {'steps':>5} {'full':>8} {'filtered':>9} {'ratio':>6} {'gap pp':>7}"
    )
    worst = 0.0
    out0, r0 = synthetic_batch(tr, a.prompt_len, a.completion_len, a.groups)
    full_b = filtered(tr, out0, r0, "top_p").batch  # every group has variance: the whole round
    proportional_update_seconds(tr, full_b, opt)  # warm-up
    for k in kept_list:
        out, rewards = synthetic_batch(tr, a.prompt_len, a.completion_len, k)
        decision = filtered(tr, out, rewards, "top_p")
        kept_b = decision.batch
        copies = int(decision.metrics["snr/padding_rows"])
        kept_frac = decision.metrics["snr/kept_frac"]
        full, kept, steps = [], [], 0
        for _ in range(a.repeats):
            full.append(proportional_update_seconds(tr, full_b, opt)[0])  # the unfiltered round: every step
            t, steps = proportional_update_seconds(tr, kept_b, opt, decision.update_micro_batches)
            kept.append(t)
        tf, tk = min(full), min(kept)
        ratio = tk / tf
        gap = 100 * abs(ratio - kept_frac)
        worst = max(worst, gap)
        print(
            f"{k:>3}/{a.groups:<2} {kept_frac:>3.0%} {kept_b['completion_ids'].shape[0]:>5} {copies:>6} {steps:>5} "
            f"{tf:>8.3f} {tk:>9.3f} {ratio:>6.2f} {gap:>7.1f}"
        )
    print(f"proportional: worst gap {worst:.1f} pp (target <= 10 pp) -> {'PASS' if worst <= 10 else 'FAIL'}")
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=8, help="P prompt groups per batch")
    p.add_argument("--group-size", type=int, default=4, help="G samples per group")
    p.add_argument(
        "--micro-batch",
        type=int,
        default=8,
        help="per_device_train_batch_size (8: steps_per_generation 4 divides G)",
    )
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--completion-len", type=int, default=96)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--kept", default="1,2,3,4,5,6,7", help="groups with reward variance (kept by top_p 0.9)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--step-rows",
        type=int,
        default=None,
        help="proportional mode: rows per optimizer step (default: the group size, one group per step)",
    )
    p.add_argument("--skip-proportional", action="store_true")
    a = p.parse_args()
    a.step_rows = a.step_rows or a.group_size

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    tr = build_trainer(a.groups, a.group_size, a.micro_batch, a.completion_len, a.hidden, a.layers)
    opt = torch.optim.AdamW(tr.model.parameters(), lr=1e-6)
    n_params = sum(p.numel() for p in tr.model.parameters())
    print(
        f"model {n_params / 1e6:.2f}M params; batch {a.groups}x{a.group_size} rows of "
        f"{a.prompt_len}+{a.completion_len} tokens; {tr.args.steps_per_generation} micro-batches of {a.micro_batch}"
    )
    out0, r0 = synthetic_batch(tr, a.prompt_len, a.completion_len, a.groups)
    update_seconds(tr, filtered(tr, out0, r0, "off").batch, opt)  # warm-up
    print("update CPU seconds, min of repeats; ratio = filtered / full")
    print(
        f"{'kept':>9} {'rows':>5} {'pad':>4} {'full':>8} {'filtered':>9} {'mask':>8} {'ratio':>6} {'gap pp':>7}"
    )
    worst = 0.0
    for k in [int(x) for x in a.kept.split(",")]:
        out, rewards = synthetic_batch(tr, a.prompt_len, a.completion_len, k)
        full_b = filtered(tr, out, rewards, "off").batch
        decision = filtered(tr, out, rewards, "top_p")
        kept_b = decision.batch
        pad = int(decision.metrics["snr/padding_rows"])
        kept_frac = decision.metrics["snr/kept_frac"]
        mask_b = filtered(tr, out, rewards, "top_p", drop="mask").batch
        full, kept, masked = [], [], []
        for _ in range(a.repeats):  # interleaved so drift hits all three alike
            full.append(update_seconds(tr, full_b, opt))
            kept.append(update_seconds(tr, kept_b, opt))
            masked.append(update_seconds(tr, mask_b, opt))
        tf, tk, tm = min(full), min(kept), min(masked)  # least-disturbed run of each
        ratio = tk / tf
        gap = 100 * abs(ratio - kept_frac)  # padding rows (see "pad") cost compute and widen the gap
        worst = max(worst, gap)
        print(
            f"{k:>3}/{a.groups:<2} {kept_frac:>3.0%} {kept_b['completion_ids'].shape[0]:>5} {pad:>4} {tf:>8.3f} "
            f"{tk:>9.3f} {tm:>8.3f} {ratio:>6.2f} {gap:>7.1f}"
        )
    print(
        f"update-time ratio vs kept fraction: worst gap {worst:.1f} pp (target <= 10 pp) -> "
        f"{'PASS' if worst <= 10 else 'FAIL'}"
    )
    if not a.skip_proportional:
        proportional_table(a, [int(x) for x in a.kept.split(",")])


if __name__ == "__main__":
    main()
