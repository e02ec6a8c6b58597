"""What a warm-start step costs: one forward/backward pass over a micro-batch of exported episodes, float32 (the
reference) against bf16 autocast, with and without gradient checkpointing, in CPU seconds of this process.

CPU time, not wall time: on a shared machine other processes stretch the wall clock of every variant by a
different amount, while the CPU time of this single-threaded process is what the work costs. Each variant runs
``--reps`` times in turn (interleaved) and the fastest is kept; ratios are against float32 with gradient
checkpointing (``llmgym-sft``'s TRL default).

    OMP_NUM_THREADS=1 python benchmarks/sft_speed.py --quick            # tiny random model, seconds
    OMP_NUM_THREADS=1 python benchmarks/sft_speed.py --episodes 4       # SmolLM2-135M, both prompt lengths
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline, single-threaded; before torch)

#: (bf16 autocast, gradient checkpointing) per variant; the first is the reference.
VARIANTS = {"fp32_gc": (False, True), "fp32": (False, False), "bf16_gc": (True, True), "bf16": (True, False)}
ENV = "llmgym/CoordFrozenLake-v0"
KWARGS = {
    "success_rate": 1.0,
    "size": 3,
    "max_turns": 3,
    "max_actions_per_turn": 1,
    "max_actions": 3,
    "think": False,
}


def batch(tokenizer: Any, include_instructions: bool, episodes: int) -> tuple[Any, Any, Any, int]:
    """A padded micro-batch of expert episodes with the SFT labels (-100 outside the replies)."""
    import torch
    from llm_gym.trainer.chat_templates import training_template_tokens
    from llm_gym.trainer.sft import build_dataset

    from llm_gym.agent.chat import ChatFormat
    from llm_gym.agent.export import export_episodes

    chat = ChatFormat(include_instructions=include_instructions)
    rows = export_episodes(ENV, range(50_000, 50_000 + episodes), env_kwargs=KWARGS, chat=chat).rows
    ds, _ = build_dataset(rows, training_template_tokens(tokenizer))
    width = max(len(x) for x in ds["input_ids"])
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (x, m) in enumerate(zip(ds["input_ids"], ds["assistant_masks"])):
        ids[i, : len(x)] = torch.tensor(x)
        attn[i, : len(x)] = 1
        labels[i, : len(x)] = torch.tensor([t if keep else -100 for t, keep in zip(x, m)])
    return ids, attn, labels, int(attn.sum())


def step_cpu_seconds(model: Any, ids: Any, attn: Any, labels: Any, bf16: bool, checkpointing: bool) -> float:
    import torch

    model.train()
    if checkpointing:
        model.activation_checkpointing_enable()
    else:
        model.activation_checkpointing_disable()
    t0 = time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.process_time() - t0


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny random model, 2 episodes, 1 repetition")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--episodes", type=int, default=4, help="episodes in the micro-batch")
    p.add_argument("--reps", type=int, default=2)
    a = p.parse_args(argv)
    from llm_gym.trainer.models import load_model_and_tokenizer

    tmp = tempfile.TemporaryDirectory(prefix="sft_speed_")
    model_name = a.model
    if a.quick:
        from tests._tiny import build_tiny_model

        model_name, a.episodes, a.reps = build_tiny_model(Path(tmp.name) / "tiny"), 2, 1
    model, tok = load_model_and_tokenizer(model_name, dtype="float32")
    out: dict[str, Any] = {}
    for prompt, instructions in (("with instructions", True), ("compact", False)):
        ids, attn, labels, tokens = batch(tok, instructions, a.episodes)
        step_cpu_seconds(model, ids, attn, labels, True, False)  # warm-up
        best = {k: float("inf") for k in VARIANTS}
        for _ in range(a.reps):
            for name, (bf16, ckpt) in VARIANTS.items():
                best[name] = min(best[name], step_cpu_seconds(model, ids, attn, labels, bf16, ckpt))
        ref = best["fp32_gc"]
        out[prompt] = {"tokens": tokens, "cpu_seconds": best}
        for name, sec in best.items():
            print(
                f"[sft_speed] {prompt:17s} {name:8s} {tokens} tokens: {sec:.1f} CPU-s, {tokens / sec:.0f} tokens per "
                f"CPU-s, {ref / sec:.2f}x fp32_gc",
                flush=True,
            )
    tmp.cleanup()
    return out


if __name__ == "__main__":
    main()
