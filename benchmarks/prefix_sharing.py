"""Shared-prefix training vs the plain pass: generation, the loss pass and the whole step, in the same run.

For each environment setting (the learning study's Bandit and 3-turn deterministic 3x3 CoordFrozenLake, in the
chat format of ``llmgym-train``'s CPU runs: answer-only, one demonstration turn) and each group size G, one
``LLMGymGRPOTrainer`` with ``num_prompts`` groups per round and one micro-batch per round (as ``llmgym-train``
sizes CPU runs: ``per_device_train_batch_size = num_prompts * G``, gradient checkpointing on) plays rounds with
prefix sharing on and off alternately, on the same weights and the same sampling seed:

* generation: the multi-turn rollouts of one round (``_generate_and_score_completions``), and whether the two
  paths sampled the same tokens;
* loss pass: forward + backward of the round's loss (``compute_loss``) on the same batch (advantages replaced by
  a fixed non-zero ramp, so that the gradients compared are not zero when every reward of a group is equal);
* step: the two together (one optimizer step per round in these settings);
* tokens processed by each (padded widths, what the forwards compute), peak memory above the start of each
  measurement (process RSS, sampled every 5 ms), and the largest per-token log-prob difference and gradient
  relative difference (per parameter tensor: ||g_shared - g_plain|| / ||g_plain||) on the same batch.

Timings are medians over ``--repeats`` rounds; shared and plain alternate, so load from other processes hits
both. The last line reads ``prefix sharing: step speed-up 2.84x (Bandit, G=8), max grad rel diff 3.1e-07``.

    OMP_NUM_THREADS=1 python benchmarks/prefix_sharing.py --quick            # tiny random model, seconds
    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/prefix_sharing.py --model smollm2 --json /tmp/prefix.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline env vars and repo path, before any torch import)


class PeakRSS:
    """Peak resident memory of this process above its value at entry (a 5 ms sampling thread)."""

    def __enter__(self) -> PeakRSS:
        import psutil

        self._proc = psutil.Process()
        self.base = self._proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def mib(self) -> float:
        return (self.peak - self.base) / 2**20


def make_trainer(
    model_dir: str,
    setting: Any,
    group: int,
    prompts: int,
    micro: int,
    quick: bool,
    max_completion_length: int = 320,
    **overrides: Any,
) -> Any:
    """A trainer on ``model_dir`` for ``setting`` in llmgym-train's CPU chat format, one optimizer step of
    ``micro`` rows; ``overrides`` replace or add config values (``benchmarks/organism_speed.py``: a profile's)."""
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.grpo import LLMGymGRPOTrainer
    from llm_gym.trainer.models import load_model_and_tokenizer

    from tests._tiny import tiny_config_kwargs

    model, tok = load_model_and_tokenizer(model_dir, dtype="float32")
    args = LLMGymGRPOConfig(
        **tiny_config_kwargs(
            tempfile.mkdtemp(prefix="bench_prefix_"),
            **{
                "env": setting.env,
                "env_kwargs": setting.env_kwargs,
                "max_turns": setting.max_turns,
                "max_actions_per_turn": setting.max_actions_per_turn,
                "max_actions": setting.max_actions,
                "max_new_tokens": setting.max_new_tokens,
                "think": False,
                "one_shot_example": True,
                "temperature": 0.7,
                "max_completion_length": max_completion_length,
                "num_prompts": prompts,
                "num_generations": group,
                "per_device_train_batch_size": micro,
                "gradient_checkpointing": not quick,
                "filter_strategy": "off",
                "learning_rate": 1e-5,
                "max_steps": 1,
                "seed": 0,
                "collapse_report": "",
                "use_prefix_sharing": True,
                **overrides,
            },
        )
    )
    tr = LLMGymGRPOTrainer(model=model, args=args, processing_class=tok)
    tr.current_gradient_accumulation_steps = 1  # set by the training loop; the loss is called directly here
    if args.gradient_checkpointing:  # Trainer turns it on in train(); the loss is called directly here
        tr.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs
        )
    tr.model.train()
    return tr


def seed_rows(round_index: int, prompts: int, group: int) -> list[dict]:
    from llm_gym.trainer.rollouts import seed_prompt

    return [
        {"prompt": seed_prompt(10_000 + round_index * prompts + g)}
        for g in range(prompts)
        for _ in range(group)
    ]


def grads(tr: Any) -> dict[str, Any]:
    return {n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None}


def grad_rel_diff(tr: Any, first: dict[str, Any], first_is_plain: bool) -> float:
    """Max over parameter tensors of ||g_shared - g_plain|| / ||g_plain||: ``first`` holds the gradients of the
    path that ran first, the model's ``.grad`` those of the second."""
    rel = 0.0
    for name, p in tr.model.named_parameters():
        if p.grad is None or name not in first:
            continue
        plain = first[name] if first_is_plain else p.grad
        norm = float(plain.norm())
        if norm > 0:
            rel = max(rel, float((first[name] - p.grad).norm()) / norm)
    return rel


def left_padded(batch: dict, extra: int, pad_id: int) -> dict:
    """The batch with ``extra`` more columns of left padding before every prompt (what batching it with a longer
    prompt does in TRL's layout)."""
    import torch

    out = dict(batch)
    n = batch["prompt_ids"].shape[0]
    out["prompt_ids"] = torch.cat(
        [torch.full((n, extra), pad_id, dtype=torch.long), batch["prompt_ids"]], dim=1
    )
    out["prompt_mask"] = torch.cat([torch.zeros((n, extra), dtype=torch.long), batch["prompt_mask"]], dim=1)
    return out


def noise_floor(tr: Any, batch: dict, plain_grads: dict, micro: int, extra: int = 8) -> tuple[float, float]:
    """How far the plain pass moves by itself when every row gets ``extra`` more columns of left padding: (max
    |log-prob difference| over loss tokens, max gradient relative difference), the float32 noise floor that any
    reordering of the computation is measured against."""
    import torch
    from llm_gym.trainer import compat
    from llm_gym.trainer.batch import loss_mask

    sharing = tr.prefix_sharing
    tr.prefix_sharing = None
    try:
        pad_id = tr.processing_class.pad_token_id or 0
        padded = left_padded(batch, extra, pad_id)
        tr.model.zero_grad(set_to_none=True)
        for part in micro_batches(padded, micro):
            tr.compute_loss(tr.model, part).backward()
        rel = 0.0
        for name, p in tr.model.named_parameters():
            if p.grad is not None and name in plain_grads and float(plain_grads[name].norm()) > 0:
                g = plain_grads[name]
                rel = max(rel, float((p.grad - g).norm()) / float(g.norm()))
        tr.model.zero_grad(set_to_none=True)
        C = batch["completion_ids"].size(1)
        with torch.no_grad():
            lps = []
            for b in (batch, padded):
                ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
                attn = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
                lps.append(
                    compat.per_token_logps_and_entropies(tr, tr.model, ids, attn, C, batch_size=micro)[0]
                )
        mask = loss_mask(batch).bool()
        return float((lps[0] - lps[1])[mask].abs().max()) if mask.any() else 0.0, rel
    finally:
        tr.prefix_sharing = sharing


def micro_batches(batch: dict, size: int) -> list[dict]:
    """The round's consecutive micro-batches of ``size`` rows. Rows arrive group by group, so each micro-batch holds
    whole groups or consecutive rows of one (the trainer's arrangement with prefix sharing, in a fixed order here
    so that both paths see the same micro-batches)."""
    from llm_gym.trainer.batch import split_micro_batches

    n = batch["completion_ids"].shape[0]
    if size >= n:
        return [batch]
    return split_micro_batches(batch, size, n // size)[0]


def measure(
    tr: Any,
    sharing: Any,
    rows: list[dict],
    batch: dict | None,
    keep_grads: bool = True,
    micro: int = 1 << 30,
) -> dict[str, Any]:
    """One round with ``sharing`` (or None: plain): generation from ``rows`` (same torch seed), then the loss pass
    on ``batch`` (or the generated one)."""
    import torch

    tr.prefix_sharing = sharing
    torch.manual_seed(1234)
    before_gen = sharing.generation.processed if sharing is not None else 0
    with PeakRSS() as mem_gen:
        t0 = time.perf_counter()
        generated = tr._generate_and_score_completions(rows)
        t_gen = time.perf_counter() - t0
    if batch is None:
        batch = generated
        # a fixed non-zero advantage per row: the loss pass costs the same, and gradients have something to compare
        batch["advantages"] = torch.linspace(-1.0, 1.0, batch["advantages"].shape[0])
    tr.model.zero_grad(set_to_none=True)
    before_loss = sharing.tokens.processed if sharing is not None else 0
    with PeakRSS() as mem_loss:
        t0 = time.perf_counter()
        for part in micro_batches(batch, micro):
            tr.compute_loss(tr.model, part).backward()
        t_loss = time.perf_counter() - t0
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    return {
        "generation_s": t_gen,
        "loss_s": t_loss,
        "step_s": t_gen + t_loss,
        "generation_mib": mem_gen.mib,
        "loss_mib": mem_loss.mib,
        "loss_tokens": (sharing.tokens.processed - before_loss) if sharing is not None else ids.numel(),
        "generation_tokens": (sharing.generation.processed - before_gen) if sharing is not None else None,
        "completion_ids": generated["completion_ids"],
        "batch": generated,
        "grads": grads(tr) if keep_grads else None,
    }


def logp_diff(tr: Any, sharing: Any, batch: dict, micro: int) -> float:
    """Max |log-prob difference| between the shared and the plain pass over the batch's loss tokens (forwards of
    ``micro`` rows: TRL's CPU log-prob head materialises every position's logits at once)."""
    import torch
    from llm_gym.trainer import compat
    from llm_gym.trainer.batch import loss_mask

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    C = batch["completion_ids"].size(1)
    out = []
    with torch.no_grad():
        for s in (sharing, None):
            tr.prefix_sharing = s
            out.append(compat.per_token_logps_and_entropies(tr, tr.model, ids, attn, C, batch_size=micro)[0])
    tr.prefix_sharing = sharing
    mask = loss_mask(batch).bool()
    return float((out[0] - out[1])[mask].abs().max()) if mask.any() else 0.0


def bench(model_dir: str, env: str, group: int, a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from learning_study import SETTINGS

    setting = SETTINGS[env]
    micro = a.micro_batch or a.prompts * group
    tr = make_trainer(model_dir, setting, group, a.prompts, micro, a.quick)
    tr.turn_cache = (
        None  # prefix sharing alone against the plain pass (benchmarks/turn_cache.py: the turn cache)
    )
    sharing = tr.prefix_sharing
    runs: dict[str, list[dict]] = {"shared": [], "plain": []}
    same_tokens = True
    lp_diff, grad_rel = 0.0, 0.0
    floor = (float("nan"), float("nan"))
    for r in range(a.repeats):
        rows = seed_rows(r, a.prompts, group)
        first, second = ("shared", "plain") if r % 2 == 0 else ("plain", "shared")
        res = {}
        res[first] = measure(tr, sharing if first == "shared" else None, rows, None, micro=micro)
        # the second path trains on the first path's batch, so gradients compare on identical rows
        res[second] = measure(
            tr,
            sharing if second == "shared" else None,
            rows,
            res[first]["batch"],
            keep_grads=False,
            micro=micro,
        )
        rel = grad_rel_diff(tr, res[first]["grads"], first_is_plain=first == "plain")
        if r == 0 and a.floor:
            plain_grads = res[first]["grads"] if first == "plain" else grads(tr)
            res[first]["grads"] = None
            floor = noise_floor(tr, res[first]["batch"], plain_grads, micro)
            del plain_grads
        res[first]["grads"] = None
        print(
            f"  {env} G={group} round {r}: step {res['shared']['step_s']:.1f}s shared, "
            f"{res['plain']['step_s']:.1f}s plain",
            file=sys.stderr,
            flush=True,
        )
        a_ids, b_ids = res["shared"]["completion_ids"], res["plain"]["completion_ids"]
        same_tokens &= a_ids.shape == b_ids.shape and bool(torch.equal(a_ids, b_ids))
        batch = res[first]["batch"]
        tr.model.zero_grad(set_to_none=True)
        lp_diff, grad_rel = max(lp_diff, logp_diff(tr, sharing, batch, micro)), max(grad_rel, rel)
        for k in runs:
            runs[k].append(
                {key: v for key, v in res[k].items() if key not in ("completion_ids", "batch", "grads")}
            )
        tr.model.zero_grad(set_to_none=True)

    def med(kind: str, key: str) -> float:
        vals = [r[key] for r in runs[kind] if r[key] is not None]
        return statistics.median(vals) if vals else float("nan")

    out: dict[str, Any] = {"env": env, "G": group, "P": a.prompts, "micro_batch": micro, "repeats": a.repeats}
    for key in ("generation_s", "loss_s", "step_s", "generation_mib", "loss_mib", "loss_tokens"):
        out[f"{key}_shared"] = med("shared", key)
        out[f"{key}_plain"] = med("plain", key)
    out["generation_tokens_shared"] = med("shared", "generation_tokens")
    gen_plain = sharing.generation.plain / max(1, a.repeats)  # counted by the shared path's layout
    out["generation_tokens_plain"] = gen_plain
    for key in ("generation", "loss", "step"):
        out[f"{key}_speedup"] = out[f"{key}_s_plain"] / out[f"{key}_s_shared"]
    out.update(same_tokens=same_tokens, max_logp_diff=lp_diff, max_grad_rel_diff=grad_rel)
    out.update(floor_logp_diff=floor[0], floor_grad_rel_diff=floor[1])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="model alias or folder (default smollm2)")
    p.add_argument("--envs", default="Bandit,FrozenLake")
    p.add_argument("--groups", default="4,8,16", help="group sizes G")
    p.add_argument("--prompts", type=int, default=2, help="groups per round (llmgym-train's CPU default: 2)")
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="rows per micro-batch (default: the whole round, as llmgym-train sizes CPU runs; the learning study uses 4)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--floor",
        action="store_true",
        help="also measure the plain pass against itself with 8 more columns of left padding (the float32 noise "
        "floor of the differences), on the first round",
    )
    p.add_argument("--quick", action="store_true", help="tiny random model, G=4, one repeat: seconds")
    p.add_argument("--json", default=None, help="write the results (JSON) to this file")
    a = p.parse_args(argv)
    if a.quick:
        from tests._tiny import build_tiny_model

        model_dir = build_tiny_model(tempfile.mkdtemp(prefix="bench_prefix_tiny_"))
        a.groups, a.repeats = "4", 1
    else:
        from llm_gym.trainer.models import resolve_model

        model_dir = resolve_model(a.model)
    results = []
    print(
        f"{'env':<11}{'G':>3}  {'gen s (sh/plain)':>18} {'x':>6}  {'loss s':>16} {'x':>6}  {'step x':>7}  "
        f"{'loss tokens':>14}  {'gen tokens':>14}  {'loss MiB':>13}  {'logp diff':>9} {'grad rel':>9} same"
    )
    for env in a.envs.split(","):
        for g in (int(x) for x in a.groups.split(",")):
            r = bench(model_dir, env, g, a)
            results.append(r)
            print(
                f"{env:<11}{g:>3}  {r['generation_s_shared']:>8.2f}/{r['generation_s_plain']:<8.2f} "
                f"{r['generation_speedup']:>5.2f}x  {r['loss_s_shared']:>7.2f}/{r['loss_s_plain']:<7.2f} "
                f"{r['loss_speedup']:>5.2f}x  {r['step_speedup']:>6.2f}x  "
                f"{r['loss_tokens_shared']:>6.0f}/{r['loss_tokens_plain']:<6.0f}  "
                f"{r['generation_tokens_shared']:>6.0f}/{r['generation_tokens_plain']:<6.0f}  "
                f"{r['loss_mib_shared']:>6.0f}/{r['loss_mib_plain']:<6.0f}  "
                f"{r['max_logp_diff']:>9.1e} {r['max_grad_rel_diff']:>9.1e} {r['same_tokens']}",
                flush=True,
            )
            if a.floor:
                print(
                    f"{'':<14}noise floor (plain vs plain + 8 pad columns): logp diff {r['floor_logp_diff']:.1e}, "
                    f"grad rel {r['floor_grad_rel_diff']:.1e}",
                    flush=True,
                )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"model": a.model if not a.quick else "tiny", "results": results}, indent=1)
        )
    pick = next((r for r in results if r["env"] == "Bandit" and r["G"] == 8), results[0])
    worst = max(r["max_grad_rel_diff"] for r in results)
    print(
        f"prefix sharing: step speed-up {pick['step_speedup']:.2f}x ({pick['env']}, G={pick['G']}), max grad rel diff {worst:.1e}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
