"""Multi-turn rollout overhead: our token-level rollout vs plain batched ``generate`` of the same lengths.

Ours: ``trainer.rollouts.play_token_episodes`` (environment steps, chat-template rendering, observation
tokenisation, bookkeeping, one batched ``generate`` per turn). Reference: the same ``generate`` calls replayed
on the same padded contexts with the same number of decoding steps (``min_new_tokens = max_new_tokens``), with
nothing else around them. The ratio of generated tokens per second (ours / reference) is the share of time left
for generation; the target is >= 0.9x.

    OMP_NUM_THREADS=1 python benchmarks/rollout_overhead.py                # tiny random Qwen2
    OMP_NUM_THREADS=1 python benchmarks/rollout_overhead.py --model smollm2 --envs 8 --turns 3
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import _offline  # noqa: F401  (offline env vars and repo path, before any torch import)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="'tiny' (random tiny Qwen2), 'smollm2', or a model folder")
    p.add_argument("--env", default="llmgym/FrozenLake-v0")
    p.add_argument("--envs", type=int, default=16, help="environments (seeds x group) per rollout")
    p.add_argument("--group", type=int, default=4, help="group size G (envs sharing a seed)")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    import torch
    from llm_gym.trainer.chat_templates import ChatTemplateTokens
    from llm_gym.trainer.models import resolve_model
    from llm_gym.trainer.rollouts import HFGenerate, play_token_episodes
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests._tiny import build_tiny_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    path = build_tiny_model(tempfile.mkdtemp()) if args.model == "tiny" else resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    template = ChatTemplateTokens(tok)
    cfg = model.generation_config
    cfg.do_sample, cfg.temperature, cfg.top_p, cfg.top_k = True, 1.0, 1.0, 0
    seeds = [1000 + i // args.group for i in range(args.envs)]

    class Recording(HFGenerate):
        """Records each call's contexts and decoding steps so the reference can replay them."""

        calls: list[tuple[list[list[int]], int]] = []

        def __call__(self, contexts, budgets):
            new, lps = super().__call__(contexts, budgets)
            stop = set(template.stop_ids)
            steps = max(next((k + 1 for k, t in enumerate(r) if t in stop), len(r)) for r in new)
            Recording.calls.append(([list(c) for c in contexts], steps))
            return new, lps

    def ours() -> tuple[float, int]:
        Recording.calls = []
        gen = Recording(model, tok, cfg, template.stop_ids, torch.device("cpu"))
        t0 = time.perf_counter()
        eps = play_token_episodes(
            args.env,
            seeds,
            gen,
            template,
            max_new_tokens=args.max_new_tokens,
            max_completion_length=100_000,
            env_kwargs={"max_turns": args.turns},
            group_size=args.group,
        )
        return time.perf_counter() - t0, sum(sum(e.env_mask) for e in eps)

    def reference(calls) -> float:
        pad = tok.pad_token_id if tok.pad_token_id is not None else template.stop_ids[0]
        total = 0.0
        for contexts, steps in calls:
            width = max(len(c) for c in contexts)
            ids = torch.full((len(contexts), width), pad, dtype=torch.long)
            attn = torch.zeros_like(ids)
            for i, c in enumerate(contexts):
                ids[i, width - len(c) :] = torch.tensor(c)
                attn[i, width - len(c) :] = 1
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(
                    input_ids=ids,
                    attention_mask=attn,
                    do_sample=True,
                    min_new_tokens=steps,
                    max_new_tokens=steps,
                    pad_token_id=pad,
                    eos_token_id=template.stop_ids,
                )
            total += time.perf_counter() - t0
        return total

    torch.manual_seed(0)
    ours()  # warm-up
    rows = []
    for r in range(args.repeats):
        torch.manual_seed(r)
        t_ours, tokens = ours()
        t_ref = reference(Recording.calls)
        rows.append((t_ours, t_ref, tokens, len(Recording.calls)))
        print(
            f"run {r}: ours {t_ours:.2f}s  reference generate {t_ref:.2f}s  model tokens {tokens}  "
            f"turn batches {len(Recording.calls)}  ours {tokens / t_ours:.0f} tok/s  "
            f"reference {tokens / t_ref:.0f} tok/s  ratio {t_ref / t_ours:.3f}x"
        )
    t_ours, t_ref = sum(r[0] for r in rows), sum(r[1] for r in rows)
    print(
        f"model={args.model} env={args.env} envs={args.envs} turns<={args.turns} max_new_tokens={args.max_new_tokens}"
    )
    print(
        f"total over {len(rows)} runs: ours {t_ours:.2f}s vs plain generate {t_ref:.2f}s -> throughput ratio "
        f"{t_ref / t_ours:.3f}x (target >= 0.9x)"
    )


if __name__ == "__main__":
    main()
