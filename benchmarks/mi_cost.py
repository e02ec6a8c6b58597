"""Cost of the MI collapse metrics as a fraction of training time, at the default cadence.

Short training runs of the real ``LLMGymGRPOTrainer`` with the same seeds: MI at the default settings
(``mi_every=5``, ``mi_num_samples=64``, first-turn and trajectory scopes) with the KV-cached scorer, MI
off (the reference), and MI with TRL's full-sequence scorer (``--no-trl`` skips that one). Prints the MI
seconds the trainer logged (``mi/*/seconds``), their share of the summed step time, the share amortised
over the cadence, and the extra training CPU time (robust to other processes on a shared machine).
On the tiny random model generation and update are almost free, so its share overstates what a real
model pays; ``--model smollm2`` measures SmolLM2-135M-Instruct (offline copy). Reasoning = whole turns
(``mi_reasoning=turn``), since the random model writes no ``<think>`` tags.

    OMP_NUM_THREADS=1 python benchmarks/mi_cost.py
    OMP_NUM_THREADS=1 python benchmarks/mi_cost.py --model smollm2 --steps 2 --turns 2 --new-tokens 16 \\
        --prompts 2 --group 4 --samples 16 --no-trl
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import _offline  # noqa: F401  (offline env vars and repo path, before any torch import)


def run(
    path: str, a: argparse.Namespace, mi_every: int, scorer: str = "cached"
) -> tuple[float, float, dict[str, float]]:
    """Train; returns (train CPU seconds, summed step_time, summed MI seconds per scope)."""
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.grpo import LLMGymGRPOTrainer
    from llm_gym.trainer.models import load_model_and_tokenizer

    from tests._tiny import tiny_config_kwargs

    model, tok = load_model_and_tokenizer(path, dtype="float32")
    args = LLMGymGRPOConfig(
        **tiny_config_kwargs(
            tempfile.mkdtemp(prefix="bench_mi_"),
            env=a.env,
            num_prompts=a.prompts,
            num_generations=a.group,
            per_device_train_batch_size=a.prompts * a.group,
            max_turns=a.turns,
            max_new_tokens=a.new_tokens,
            max_completion_length=a.turns * (a.new_tokens + 120),
            max_steps=a.steps,
            logging_steps=1,
            learning_rate=1e-5,
            seed=0,
            collapse_report="",
            filter_strategy="off",
            mi_every=mi_every,
            mi_num_samples=a.samples,
            mi_reasoning="turn",
            mi_scorer=scorer,
        )
    )
    tr = LLMGymGRPOTrainer(model=model, args=args, processing_class=tok)
    start = time.process_time()
    tr.train()
    cpu = time.process_time() - start
    step_time = sum(h.get("step_time", 0.0) or 0.0 for h in tr.state.log_history)
    mi = {
        scope: sum(h.get(f"mi/{scope}/seconds", 0.0) or 0.0 for h in tr.state.log_history)
        for scope in ("first_turn", "trajectory")
    }
    return cpu, step_time, mi


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default="tiny", help="'tiny' (random tiny Qwen2), 'smollm2', or a local model folder"
    )
    p.add_argument("--env", default="FrozenLake")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--every", type=int, default=5, help="mi_every (default cadence 5)")
    p.add_argument("--samples", type=int, default=64, help="mi_num_samples (default 64)")
    p.add_argument(
        "--no-trl", action="store_true", help="skip the full-sequence scorer run (slow on real models)"
    )
    a = p.parse_args()

    import torch

    from tests._tiny import build_tiny_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if a.model == "tiny":
        path = build_tiny_model(tempfile.mkdtemp())
    else:
        from llm_gym.trainer.models import resolve_model

        path = resolve_model(a.model)
    cpu_off, step_off, _ = run(path, a, mi_every=0)
    cpu_on, step_on, mi = run(path, a, mi_every=a.every, scorer="cached")
    mi_total = sum(mi.values())
    rounds = len(range(0, a.steps, a.every))  # one generation round per step here; MI on rounds 0, k, 2k...
    print(
        f"{a.steps} steps, {a.prompts}x{a.group} episodes of <= {a.turns} turns, MI every {a.every} rounds "
        f"on <= {a.samples} pairs per scope"
    )
    print(f"reference (MI off): step_time sum {step_off:.2f} s, train CPU {cpu_off:.2f} s")
    print(f"MI on             : step_time sum {step_on:.2f} s, train CPU {cpu_on:.2f} s")
    print(f"MI seconds logged : first turn {mi['first_turn']:.2f} s, trajectory {mi['trajectory']:.2f} s")
    print(f"MI share of step time (logged MI s / step_time sum, MI on): {100 * mi_total / step_on:.1f}%")
    per_round, step_mean = mi_total / rounds, step_off / a.steps
    print(
        f"amortised at mi_every={a.every}: {per_round:.2f} s per MI round / ({a.every} x {step_mean:.2f} s "
        f"reference step) = {100 * per_round / (a.every * step_mean):.1f}% of training time"
    )
    print(
        f"train CPU with MI vs reference (robust on a shared machine): {100 * (cpu_on - cpu_off) / cpu_off:+.1f}%"
    )
    if a.no_trl:
        return
    cpu_trl, step_trl, mi_trl = run(path, a, mi_every=a.every, scorer="trl")
    trl_total = sum(mi_trl.values())
    print(
        f"mi_scorer=trl (full sequences, the reference scorer): MI {trl_total:.2f} s = {100 * trl_total / step_trl:.1f}% "
        f"of step time, train CPU {100 * (cpu_trl - cpu_off) / cpu_off:+.1f}%; cached is "
        f"{trl_total / max(mi_total, 1e-9):.1f}x faster"
    )


if __name__ == "__main__":
    main()
