"""Training worker for the scale-out tests (``tests/test_scaleout.py``), launched by ``accelerate launch``.

It uses the trainer's public classes only (``llm_gym.trainer.LLMGymGRPOTrainer`` / ``LLMGymGRPOConfig`` /
``EnvRolloutFunc`` / ``load_model_and_tokenizer``, the documented ``signal_state``) and adds two things the CLI
cannot:

- a scripted reward: round ``s`` gives reward variance to the groups named in ``--schedule`` (``"1|-|0,1|-"``:
  round 0 group 1, round 1 none, ...), so filtered and skipped rounds happen exactly when the test says;
- a probe callback that, on every rank, hashes this rank's parameter shards and optimizer state before and after
  every optimizer step, checks with a collective that all ranks agree on the step and the skip decision, and
  writes ``probe-rank{r}.json`` at the end.

``--per_row_sampling`` generates every rollout row on its own with a torch seed derived from its environment seed
and its position in its group, so the samples do not depend on how rows are split over processes: a one-process
run and a two-node run then see the same trajectories.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from collections import Counter
from typing import Any

import torch
from llm_gym.trainer import EnvRolloutFunc, LLMGymGRPOConfig, LLMGymGRPOTrainer, load_model_and_tokenizer
from llm_gym.trainer.rollouts import parse_seed_prompt
from transformers import TrainerCallback


def schedule_from(text: str) -> list[set[int]]:
    """``"1|-|0,1"`` -> ``[{1}, set(), {0, 1}]`` (groups with reward variance per round, cycled)."""
    return [set() if part in ("", "-") else {int(g) for g in part.split(",")} for part in text.split("|")]


def scripted_reward(schedule: list[set[int]], train_seed: int, num_prompts: int):
    """Reward ``k % 2`` for the k-th row of a seed in this call if its group has variance this round, else 0.5.

    Rows of one seed are contiguous on a process; if a group were split over processes each part still
    alternates, so a variance group never has zero spread and a flat group never has any."""

    def reward(prompts: list, completions: list, **_: Any) -> list[float]:
        seen: Counter = Counter()
        out = []
        for p in prompts:
            seed = parse_seed_prompt(p)
            k = seen[seed]
            seen[seed] += 1
            rnd, group = divmod(seed - train_seed, num_prompts)
            out.append(float(k % 2) if group in schedule[rnd % len(schedule)] else 0.5)
        return out

    reward.__name__ = "scripted_reward"
    return reward


def _occurrences(prompts: list) -> list[int]:
    seen: Counter = Counter()
    out = []
    for p in prompts:
        seed = parse_seed_prompt(p)
        out.append(seen[seed])
        seen[seed] += 1
    return out


class PerRowRollout:
    """Wraps :class:`EnvRolloutFunc`: one call per row, under a torch seed fixed by (env seed, member index)."""

    def __init__(self, inner: EnvRolloutFunc):
        self.inner = inner
        self.last = None

    def __call__(self, prompts: list, trainer: Any) -> dict:
        parts, infos = [], []
        for p, member in zip(prompts, _occurrences(prompts)):
            seed = parse_seed_prompt(p)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed * 1009 + member)
                parts.append(self.inner([p], trainer))
            infos.append(self.inner.last)
        merged = {
            k: (None if parts[0][k] is None else [x for part in parts for x in part[k]]) for k in parts[0]
        }
        cls = type(infos[0])
        fields = {f.name: [x for i in infos for x in getattr(i, f.name)] for f in dataclasses.fields(cls)}
        # one-row calls cannot know a row's place in its group: restore it (groups are whole on a process here)
        members = _occurrences(prompts)
        fields["group_index"] = members
        for rec, k in zip(fields["records"], members):
            rec.meta["group_index"] = k
        self.last = cls(**fields)
        return merged


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t  # FSDP2 DTensor: this rank's shard
        local = local.detach().cpu().contiguous()
        h.update(str((tuple(local.shape), str(local.dtype))).encode())
        h.update(local.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _opt_state_tensors(optimizer: Any) -> list[torch.Tensor]:
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            for _, v in sorted(optimizer.state.get(p, {}).items()):
                if torch.is_tensor(v):
                    out.append(v)
    return out


class Probe(TrainerCallback):
    """Per-step digests of this rank's parameter shards and optimizer state, plus a cross-rank lockstep check."""

    def __init__(self, trainer: LLMGymGRPOTrainer, path: str):
        self.trainer = trainer
        self.path = path
        self.steps: list[dict] = []
        self._before: dict = {}

    def _snapshot(self, model: Any, optimizer: Any) -> dict:
        params = [p for p in model.parameters()]
        return {"params": _digest(params), "optim": _digest(_opt_state_tensors(optimizer))}

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._before = {
            **self._snapshot(model, optimizer),
            "skipped_steps": self.trainer.skipped_steps,
        }

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        sig = self.trainer.signal_state
        after = self._snapshot(model, optimizer)
        skipped = self.trainer.skipped_steps - self._before["skipped_steps"]
        acc = self.trainer.accelerator
        mine = torch.tensor([state.global_step, skipped, sig.rounds, sig.consecutive_empty], dtype=torch.long)
        every = acc.gather(mine.to(acc.device)).reshape(acc.num_processes, -1).cpu().tolist()
        self.steps.append(
            {
                "step": state.global_step,
                "skipped": skipped,
                "before": {k: self._before[k] for k in ("params", "optim")},
                "after": after,
                "all_ranks": every,
            }
        )

    def on_train_end(self, args, state, control, model=None, **kwargs):
        acc = self.trainer.accelerator
        params = list(model.parameters())
        info = {
            "rank": acc.process_index,
            "world_size": acc.num_processes,
            "distributed_type": str(acc.distributed_type),
            "dtensor_params": sum(type(p).__name__ == "DTensor" for p in params),
            "num_params": len(params),
            "local_numel": sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params),
            "steps": self.steps,
            "log_history": state.log_history if acc.is_main_process else [],
        }
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(info, f)


def force_fsdp_on_cpu() -> None:
    """accelerate only switches its FSDP plugin on for accelerator devices (``AcceleratorState`` keeps
    ``MULTI_CPU`` + DDP on CPU). Initialise the shared state first and switch it to FSDP with the plugin built
    from the ``FSDP_*`` variables ``accelerate launch`` exported from the config file, so the trainer's
    ``Accelerator`` prepares the model with ``fully_shard`` over gloo exactly as it would on GPUs."""
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        raise SystemExit("--fsdp_on_cpu needs `accelerate launch` with an FSDP config")
    state = Accelerator(cpu=True).state
    state.fsdp_plugin = FullyShardedDataParallelPlugin()
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--output_dir", required=True)
    ap.add_argument("--probe_dir", required=True)
    ap.add_argument("--schedule", default="1|-|0,1|-")
    ap.add_argument("--max_steps", type=int, default=4)
    ap.add_argument("--num_prompts", type=int, default=2)
    ap.add_argument("--num_generations", type=int, default=4)
    ap.add_argument("--per_device_train_batch_size", type=int, default=4)
    ap.add_argument("--save_steps", type=int, default=0)
    ap.add_argument("--resume_from_checkpoint", default=None)
    ap.add_argument("--per_row_sampling", action="store_true")
    ap.add_argument("--filter_strategy", default="top_p")
    ap.add_argument(
        "--no_use_cpu", action="store_true", help="leave use_cpu=False (DeepSpeed is only enabled without it)"
    )
    ap.add_argument(
        "--fsdp_on_cpu",
        action="store_true",
        help="turn on the FSDP plugin that `accelerate launch` configured although the processes run on CPU",
    )
    ap.add_argument("--ddp_backend", default=None)
    a = ap.parse_args(argv)

    model, tok = load_model_and_tokenizer(a.model, dtype="float32")
    train_seed = 10_000
    cfg = LLMGymGRPOConfig(
        output_dir=a.output_dir,
        use_cpu=not a.no_use_cpu,
        ddp_backend=a.ddp_backend,
        bf16=False,
        report_to="none",
        env="FrozenLake",
        train_seed=train_seed,
        num_prompts=a.num_prompts,
        num_generations=a.num_generations,
        per_device_train_batch_size=a.per_device_train_batch_size,
        max_completion_length=48,
        max_new_tokens=6,
        max_turns=2,
        max_steps=a.max_steps,
        logging_steps=1,
        save_strategy="steps" if a.save_steps else "no",
        save_steps=a.save_steps or 500,
        gradient_checkpointing=False,
        learning_rate=1e-2,
        # weight decay > 0: a skipped round that still reached optimizer.step() would move every weight
        weight_decay=0.1,
        lr_scheduler_type="constant",
        seed=0,
        disable_tqdm=True,
        num_eval_seeds=0,
        mi_every=0,
        filter_strategy=a.filter_strategy,
        filter_empty_stop_steps=0,
        group_dynamics="shared",
    )
    if a.fsdp_on_cpu:
        _ = (
            cfg.device
        )  # TrainingArguments resets accelerate's state when it sets up devices: let it run first
        force_fsdp_on_cpu()
    rollout = EnvRolloutFunc(cfg, tok)
    trainer = LLMGymGRPOTrainer(
        model=model,
        args=cfg,
        processing_class=tok,
        reward_funcs=[scripted_reward(schedule_from(a.schedule), train_seed, a.num_prompts)],
        rollout_func=PerRowRollout(rollout) if a.per_row_sampling else rollout,
    )
    os.makedirs(a.probe_dir, exist_ok=True)
    probe = Probe(trainer, os.path.join(a.probe_dir, f"probe-rank{trainer.accelerator.process_index}.json"))
    trainer.add_callback(probe)
    trainer.train(resume_from_checkpoint=a.resume_from_checkpoint)
    trainer.accelerator.end_training()  # as llmgym-train does: no process group left to interpreter shutdown


if __name__ == "__main__":
    main()
    # Everything this test checks is written by now. Under heavy CPU load gloo's threads can still abort the
    # interpreter's teardown ("terminate called without an active exception", 1 run in ~7 on a loaded 2-core
    # machine): end the worker without that teardown so the test judges training, not the shutdown race.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
