"""Three ways to compute a group's shared prompt once in the loss pass, against the plain pass, in the same run.

One group of random tokens (a ``--prompt``-token prompt and ``--group`` completions of about ``--completion``
tokens), forward + backward of the summed log-probs through TRL's fused log-prob head, no gradient checkpointing
(the KV-cache variant cannot have it). Prints CPU seconds of this process (robust to other jobs on a shared
machine), the ratio to the plain pass, and each variant's log-prob sum minus the plain one:

* plain: TRL's layout, the prompt repeated on every row (left-padded prompt, right-padded completion);
* KV cache with gradient: the prompt once through the backbone with a cache, the cache expanded to the rows, the
  completions through the model with it;
* dense 4D mask: one row (prompt once, then every completion, positions continuing the prompt) and a boolean
  (L, L) mask that transformers uses as given;
* prefix tree: :mod:`llm_gym.trainer.prefix_sharing`, what the trainer uses.

    OMP_NUM_THREADS=1 python benchmarks/prefix_mechanisms.py --model smollm2 --group 8 --completion 100
    OMP_NUM_THREADS=1 python benchmarks/prefix_mechanisms.py --quick      # tiny random model, seconds
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline env vars and repo path, before any torch import)


def main(argv: list[str] | None = None) -> int:
    import torch
    from llm_gym.trainer import prefix_sharing as ps
    from llm_gym.trainer.models import resolve_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompt", type=int, default=340)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--completion", type=int, default=100)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="tiny random model, short sequences")
    a = p.parse_args(argv)
    if a.quick:
        from tests._tiny import build_tiny_model

        path = build_tiny_model(tempfile.mkdtemp(prefix="bench_mech_"))
        a.prompt, a.completion, a.repeats = 40, 12, 1
    else:
        path = resolve_model(a.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ps.enable(model)
    model.train()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, vocab, (a.prompt,), generator=g).tolist()
    comps = [
        torch.randint(10, vocab, (a.completion - (i * 7) % max(1, a.completion // 5),), generator=g).tolist()
        for i in range(a.group)
    ]
    C = max(len(c) for c in comps)
    P = len(prompt)
    ids = torch.zeros(a.group, P + C, dtype=torch.long)
    att = torch.zeros_like(ids)
    for b, c in enumerate(comps):
        ids[b, :P] = torch.tensor(prompt)
        ids[b, P : P + len(c)] = torch.tensor(c)
        att[b, : P + len(c)] = 1
    K = (
        P - 1
    )  # the prompt's last token goes with each completion: its state predicts the completion's first token

    def plain():
        labels = ids.masked_fill(att == 0, -100)
        labels[:, :-C] = -100
        return model(input_ids=ids, attention_mask=att, labels=labels, fused_lm_head=True).log_probs.sum()

    sharing = ps.PrefixSharing()

    def tree():
        return ps.per_token_logps(sharing, model, ids, att, C)[0].sum()

    def dense():
        toks, pos, labels = prompt[:K], list(range(K)), [-100] * K
        spans = []
        for c in comps:
            spans.append((len(toks), 1 + len(c)))
            toks += [prompt[K], *c]
            pos += list(range(K, K + 1 + len(c)))
            labels += [*c, -100]
        L = len(toks)
        mask = torch.zeros(L, L, dtype=torch.bool)
        mask[:K, :K] = torch.ones(K, K, dtype=torch.bool).tril()
        for start, n in spans:
            mask[start : start + n, :K] = True
            mask[start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        out = model(
            input_ids=torch.tensor([toks]),
            position_ids=torch.tensor([pos]),
            attention_mask=mask[None, None],
            shift_labels=torch.tensor([labels]),
            fused_lm_head=True,
        )
        return out.log_probs.sum()

    def kv_cache():
        out = model.model(input_ids=torch.tensor([prompt[:K]]), use_cache=True)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        cache.batch_select_indices(torch.zeros(a.group, dtype=torch.long))
        W = 1 + C
        sid = torch.zeros(a.group, W, dtype=torch.long)
        mask = torch.zeros(a.group, K + W, dtype=torch.long)
        labels = torch.full((a.group, W), -100)
        mask[:, :K] = 1
        for i, c in enumerate(comps):
            sid[i, : 1 + len(c)] = torch.tensor([prompt[K], *c])
            mask[i, K : K + 1 + len(c)] = 1
            labels[i, : len(c)] = torch.tensor(c)
        name = "cache" if hasattr(out, "cache") else "past_key_values"
        res = model(
            input_ids=sid,
            attention_mask=mask,
            position_ids=torch.arange(K, K + W).expand(a.group, -1),
            shift_labels=labels,
            fused_lm_head=True,
            **{name: cache},
        )
        return res.log_probs.sum()

    variants = {
        "plain": plain,
        "KV cache with gradient": kv_cache,
        "dense 4D mask": dense,
        "prefix tree": tree,
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    sums: dict[str, float] = {}
    for _ in range(a.repeats):
        for name, fn in variants.items():
            model.zero_grad(set_to_none=True)
            t0 = time.process_time()
            value = fn()
            value.backward()
            times[name].append(time.process_time() - t0)
            sums[name] = value.item()
    base = min(times["plain"])
    print(f"G={a.group} completions ~{a.completion} tokens, prompt {a.prompt} tokens; CPU seconds per repeat")
    for name, ts in times.items():
        print(
            f"{name:<24} {' / '.join(f'{t:.2f}' for t in ts):>20}  {base / min(ts):5.2f}x  "
            f"log-prob sum - plain: {sums[name] - sums['plain']:+.1e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
