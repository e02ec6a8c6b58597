"""Worker for ``tests/test_prefix_sharing.py``'s two-process DDP test, launched by ``accelerate launch``.

Each rank plays its share of one round (two groups of four over two processes), wraps the model with DDP through
the trainer's accelerator, and backpropagates the round's loss twice through the DDP model, with prefix sharing
and without, so the gradients compared are the all-reduced ones. Writes ``rank{r}.json``: the distributed setup,
the largest gradient relative difference, a digest of the gradients of both passes and the packed token count.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from llm_gym.trainer import LLMGymGRPOConfig, LLMGymGRPOTrainer, load_model_and_tokenizer
from llm_gym.trainer.rollouts import seed_prompt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model, tok = load_model_and_tokenizer(a.model, dtype="float32")
    args = LLMGymGRPOConfig(
        output_dir=os.path.join(a.out, "run"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        disable_tqdm=True,
        num_eval_seeds=0,
        episode_records="",
        mi_every=0,
        env="FrozenLake",
        env_kwargs={"max_turns": 3},
        num_prompts=2,
        num_generations=4,
        per_device_train_batch_size=4,
        max_completion_length=64,
        max_new_tokens=6,
        filter_strategy="off",
        max_steps=1,
        use_prefix_sharing=True,
        seed=0,
    )
    tr = LLMGymGRPOTrainer(model=model, args=args, processing_class=tok)
    acc = tr.accelerator
    sharing = tr.prefix_sharing
    rank = acc.process_index
    tr.current_gradient_accumulation_steps = 1
    tr.model.train()
    rows = [{"prompt": seed_prompt(s)} for s in (5, 5, 5, 5, 6, 6, 6, 6)]
    local = rows[rank * 4 : (rank + 1) * 4]  # group g on rank g
    torch.manual_seed(rank)
    batch = tr._generate_and_score_completions(local)
    batch["advantages"] = torch.linspace(-1.0, 1.0, 4) * (rank + 1)
    ddp = acc.prepare_model(tr.model)
    grads = {}
    for shared in (True, False):
        tr.prefix_sharing = sharing if shared else None
        ddp.zero_grad(set_to_none=True)
        acc.backward(tr.compute_loss(ddp, batch))
        grads[shared] = {n: p.grad.detach().clone() for n, p in ddp.named_parameters() if p.grad is not None}
    rel = max(float((grads[True][n] - g).norm() / g.norm().clamp(min=1e-30)) for n, g in grads[False].items())
    digest = [float(sum(g.double().sum() for g in grads[s].values())) for s in (True, False)]
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "world_size": acc.num_processes,
                "ddp": type(ddp).__name__,
                "max_grad_rel_diff": rel,
                "grad_digest": digest,
                "packed_tokens": sharing.tokens.processed,
                "plain_tokens": sharing.tokens.plain,
            },
            f,
        )


if __name__ == "__main__":
    main()
