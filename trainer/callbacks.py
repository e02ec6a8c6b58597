"""Glue between the GRPO trainer and the RAGEN-2 signal tools: SNR group filtering and MI collapse metrics.

The trainer calls ``after_scoring(trainer, out)`` once per generation round, in training mode, right
after TRL scored the batch, and registers ``make_signal_callbacks(trainer)``. Per round:

1. every ``mi_every`` rounds (and the first), MI metrics on the UNFILTERED batch (``mi/...``);
2. the filter decides on the gathered (global) rewards, so every process agrees;
3. dropped rows leave ``out`` (``filter_drop="remove"``), so they cost no forward/backward in the
   update, or only lose their loss weight (``"mask"``); ``num_items_in_batch`` is recomputed;
4. an empty selection skips the update (grads set to None before ``optimizer.step()``, weights
   bitwise unchanged) and ``filter_empty_stop_steps`` consecutive ones stop training.

The algorithms live in ``trainer.snr_filter`` and ``trainer.mutual_info``; this module only wires them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from llm_gym.trainer import mutual_info as mi
from llm_gym.trainer import snr_filter as snr
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

FILTER_STRATEGIES = snr.STRATEGIES
FILTER_METRICS = snr.METRICS
FILTER_DROPS = ("remove", "mask")
LOSS_SCALINGS = ("none", "linear", "sqrt")
MI_REASONING = ("think", "turn")
MI_SCORERS = ("cached", "trl")
#: Keys (beyond ``mi/`` and ``snr/``) the collapse report keeps from each log line.
REPORT_KEYS = ("entropy", "reward", "reward_std", "frac_reward_zero_std")
#: TRL metrics appended per micro-batch by ``compute_loss``; meaningless on a skipped (all-masked) update.
LOSS_METRICS = (
    "entropy",
    "kl",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "cispo_clip_ratio",
    "vespo/phi_seq_mean",
    "ppo/value_loss",
)


@dataclass
class SignalArguments:
    """Config fields for SNR filtering and MI logging; mixed into ``LLMGymGRPOConfig``."""

    filter_strategy: str = field(
        default="top_p",
        metadata={
            "help": "Group filter on per-group reward spread: top_p (RAGEN-2 cumulative variance mass), top_k, "
            "min_p, softmax_top_p (RAGEN's older rule) or off."
        },
    )
    filter_value: float = field(
        default=0.9,
        metadata={
            "help": "rho for top_p / softmax_top_p (share of the total score kept), fraction of groups for "
            "top_k, fraction of the best score for min_p."
        },
    )
    filter_include_zero: bool = field(
        default=False,
        metadata={
            "help": "Let zero-variance groups be kept (RAGEN-2 recommends False: they carry no task signal)."
        },
    )
    filter_eps: float = field(
        default=0.01,
        metadata={
            "help": "top_p threshold slack: keep the smallest prefix reaching rho*total - eps; "
            "rho*total <= eps rejects the batch."
        },
    )
    filter_metric: str = field(
        default="variance",
        metadata={
            "help": "Group score: variance (the paper) or std (RAGEN's code); unbiased estimator either way."
        },
    )
    filter_loss_scaling: str = field(
        default="none",
        metadata={
            "help": "Multiply advantages by the kept-group ratio: none (RAGEN scripts), linear or sqrt."
        },
    )
    filter_drop: str = field(
        default="remove",
        metadata={
            "help": "remove: dropped groups leave the batch, so the update skips their forward/backward; "
            "mask: keep them with zero loss weight (full compute; needed for multimodal batches)."
        },
    )
    filter_empty_stop_steps: int = field(
        default=5,
        metadata={
            "help": "Stop training after this many consecutive rounds with nothing kept (0 = never stop)."
        },
    )
    mi_every: int = field(
        default=5,
        metadata={
            "help": "Compute MI collapse metrics every k generation rounds, and on the first; 0 = off."
        },
    )
    mi_num_samples: int = field(
        default=64, metadata={"help": "At most this many (prompt, reasoning) pairs per scope and process."}
    )
    mi_std_eps: float = field(default=1e-3, metadata={"help": "Epsilon in the MI z-score denominator."})
    mi_ema_decay: float = field(
        default=0.9, metadata={"help": "EMA decay of the marginal std (MI-ZScore-EMA)."}
    )
    mi_first_turn: bool = field(
        default=True, metadata={"help": "Log first-turn MI metrics (mi/first_turn/*)."}
    )
    mi_trajectory: bool = field(
        default=True,
        metadata={"help": "Log trajectory MI metrics (mi/trajectory/*): a random turn of each draw."},
    )
    mi_reasoning: str = field(
        default="think",
        metadata={
            "help": "Reasoning Z: think (tokens inside <think>...</think>) or turn (all model tokens of a turn)."
        },
    )
    mi_marginal: str = field(
        default="code",
        metadata={"help": "Per-token marginal: code (RAGEN code, logmeanexp of per-token scores) or paper."},
    )
    mi_batch_size: int = field(
        default=16, metadata={"help": "Sequences per no-grad forward when cross-scoring."}
    )
    mi_scorer: str = field(
        default="cached",
        metadata={
            "help": "cached: encode each prompt once and reuse its KV cache for every reasoning (much cheaper on "
            "long trajectories); trl: full sequences through TRL's log-prob function (any model TRL supports)."
        },
    )
    collapse_report: str = field(
        default="collapse.jsonl",
        metadata={"help": "JSONL in output_dir with the MI, entropy and reward-variance series; '' = off."},
    )

    def validate_signal_args(self) -> None:
        """Raise ValueError on out-of-range or unknown signal settings."""
        snr.validate_filter(self.filter_strategy, self.filter_value, self.filter_eps)
        choices = {
            "filter_metric": FILTER_METRICS,
            "filter_loss_scaling": LOSS_SCALINGS,
            "filter_drop": FILTER_DROPS,
            "mi_reasoning": MI_REASONING,
            "mi_marginal": mi.MARGINALS,
            "mi_scorer": MI_SCORERS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("filter_empty_stop_steps", "mi_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name, low in (("mi_num_samples", 2), ("mi_batch_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not self.mi_std_eps > 0:
            raise ValueError(f"mi_std_eps must be > 0, got {self.mi_std_eps}")
        if not 0.0 <= self.mi_ema_decay < 1.0:
            raise ValueError(f"mi_ema_decay must be in [0, 1), got {self.mi_ema_decay}")
        spg, group = getattr(self, "steps_per_generation", None), getattr(self, "num_generations", None)
        if self.filter_strategy != "off" and self.filter_drop == "remove" and spg and group and group % spg:
            logger.warning(
                "SNR filtering: steps_per_generation=%s does not divide num_generations=%s, so each process pads "
                "its kept rows with up to %s masked rows (they cost compute) for TRL's even split into micro-batches. "
                "Raise per_device_train_batch_size (and lower gradient_accumulation_steps to keep the update batch) "
                "until steps_per_generation = rollouts per process / per_device_train_batch_size divides "
                "num_generations.",
                spg,
                group,
                spg - 1,
            )
        if self.collapse_report and os.path.basename(self.collapse_report) != self.collapse_report:
            raise ValueError(
                f"collapse_report must be a file name inside output_dir, got {self.collapse_report!r}"
            )


@dataclass
class SignalState:
    """Per-trainer bookkeeping shared by ``after_scoring`` and the callbacks."""

    rounds: int = 0
    skip: bool = False
    consecutive_empty: int = 0
    skipped_steps: int = 0
    stop_reason: str | None = None
    ema: dict[str, mi.EmaState] = field(default_factory=dict)
    rng: np.random.Generator | None = None
    token_text: dict[int, str] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)  # last round's signal metrics, for tests/benchmarks


def signal_state(trainer: Any) -> SignalState:
    state = getattr(trainer, "_signal_state", None)
    if state is None:
        state = SignalState(
            rng=np.random.default_rng(int(trainer.args.seed) + trainer.accelerator.process_index)
        )
        trainer._signal_state = state
    return state


# --------------------------------------------------------------------------- after_scoring


def after_scoring(trainer: Any, out: dict) -> dict:
    """Log MI on the unfiltered batch, then filter groups; returns the batch the loss will see."""
    if not trainer.model.training:
        return out
    args, st = trainer.args, signal_state(trainer)
    round_idx = st.rounds
    st.rounds += 1
    metrics = trainer._metrics["train"]
    st.last = {}

    if args.mi_every and round_idx % args.mi_every == 0 and (args.mi_first_turn or args.mi_trajectory):
        _log_mi(trainer, out, st, metrics)

    start = time.perf_counter()
    out = _filter(trainer, out, st, metrics)
    _put(metrics, st, "snr/filter_seconds", time.perf_counter() - start)
    return out


def _put(metrics: Any, st: SignalState, key: str, value: float) -> None:
    metrics[key].append(float(value))
    st.last[key] = float(value)


def global_rewards(trainer: Any) -> np.ndarray:
    """Per-sample episode reward over all processes (TRL's gathered rewards, weighted)."""
    rpf = getattr(trainer, "_last_rewards_per_func", None)
    if rpf is None:
        raise RuntimeError(
            "SNR filtering needs trainer._last_rewards_per_func (stash the result of _calculate_rewards)"
        )
    weights = trainer.reward_weights.detach().float().cpu().numpy()
    return snr.episode_rewards(rpf.detach().float().cpu().numpy(), weights)


def _filter(trainer: Any, out: dict, st: SignalState, metrics: Any) -> dict:
    args = trainer.args
    acc = trainer.accelerator
    G = trainer.num_generations
    rewards = global_rewards(trainer)
    n_local = out["completion_ids"].shape[0]
    if rewards.size != n_local * acc.num_processes:
        raise RuntimeError(
            f"{rewards.size} gathered rewards for {acc.num_processes} processes x {n_local} rows"
        )
    dec = snr.decide(
        rewards,
        G,
        strategy=args.filter_strategy,
        value=args.filter_value,
        include_zero=args.filter_include_zero,
        eps=args.filter_eps,
        metric=args.filter_metric,
    )
    lo = acc.process_index * n_local
    keep_local = torch.from_numpy(dec.keep_rows(G)[lo : lo + n_local].copy())
    filtering = args.filter_strategy != "off"
    st.skip = filtering and dec.skip
    st.consecutive_empty = st.consecutive_empty + 1 if st.skip else 0

    n_pad = 0
    if filtering:
        scale = snr.loss_scale(dec.kept_frac, args.filter_loss_scaling)
        if scale != 1.0:
            out["advantages"] = out["advantages"] * scale
        spg = int(getattr(args, "steps_per_generation", None) or 1)
        if args.filter_drop == "remove":
            if not bool(keep_local.all()) or n_local % spg:
                out, n_pad = snr.select_rows(out, keep_local, multiple=spg)
                out, _ = snr.trim_completion_columns(out)
        elif not bool(keep_local.all()):
            out = snr.mask_rows(out, keep_local)
        loss_mask = (
            out["completion_mask"]
            if out.get("tool_mask") is None
            else out["completion_mask"] * out["tool_mask"]
        )
        out["num_items_in_batch"] = acc.gather(loss_mask.sum()).sum()

    rows = (
        acc.gather(torch.tensor([out["completion_ids"].shape[0], n_pad], device=acc.device))
        .view(-1, 2)
        .sum(0)
    )
    var = dec.variances
    kept = dec.keep_groups
    _put(metrics, st, "snr/num_groups", kept.size)
    _put(metrics, st, "snr/kept_groups", kept.sum())
    _put(metrics, st, "snr/kept_frac", dec.kept_frac)
    _put(metrics, st, "snr/group_var_before", var.mean() if var.size else math.nan)
    _put(metrics, st, "snr/group_var_after", var[kept].mean() if kept.any() else math.nan)
    _put(metrics, st, "snr/zero_var_frac", (var <= snr.ZERO_TOL).mean() if var.size else math.nan)
    _put(metrics, st, "snr/skipped", float(st.skip))
    _put(metrics, st, "snr/consecutive_empty", st.consecutive_empty)
    _put(metrics, st, "snr/update_rows", int(rows[0]))
    _put(metrics, st, "snr/padding_rows", int(rows[1]))
    return out


# --------------------------------------------------------------------------- MI


def _token_texts(tokenizer: Any, ids: list[int], cache: dict[int, str]) -> list[str]:
    missing = [t for t in set(ids) if t not in cache]
    if missing:
        for t, s in zip(missing, tokenizer.batch_decode([[t] for t in missing])):
            cache[t] = s
    return [cache[t] for t in ids]


def _runs(mask_row: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of 1s: the model-token span of each turn."""
    spans, start = [], None
    for i, v in enumerate(mask_row + [0]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            spans.append((start, i))
            start = None
    return spans


def episodes_from_batch(trainer: Any, out: dict, st: SignalState) -> list[mi.Episode]:
    """Local samples as ``Episode`` records, with the reasoning span of every turn.

    Turn spans come from ``trainer._last_rollout["turn_spans"]`` when the rollout provides them,
    else from the runs of 1s in the loss mask (completion_mask * tool_mask).
    """
    args = trainer.args
    G = trainer.num_generations
    tok = trainer.processing_class
    tok = getattr(tok, "tokenizer", tok)
    n = out["completion_ids"].shape[0]
    base = trainer.accelerator.process_index * n
    loss_mask = (
        out["completion_mask"] if out.get("tool_mask") is None else out["completion_mask"] * out["tool_mask"]
    )
    rollout = getattr(trainer, "_last_rollout", None) or {}
    spans_all = rollout.get("turn_spans")
    if spans_all is not None and len(spans_all) != n:
        spans_all = None
    pids, pmask = out["prompt_ids"].tolist(), out["prompt_mask"].tolist()
    cids, lmask = out["completion_ids"].tolist(), loss_mask.int().tolist()
    episodes = []
    for b in range(n):
        prompt = [t for t, m in zip(pids[b], pmask[b]) if m]
        comp = cids[b]
        spans = (
            _runs(lmask[b])
            if spans_all is None
            else [(int(s), min(int(e), len(comp))) for s, e in spans_all[b]]
        )
        reasoning: list[tuple[int, int] | None] = []
        for s, e in spans:
            if e <= s:
                reasoning.append(None)
                continue
            texts = (
                [""] * (e - s) if args.mi_reasoning == "turn" else _token_texts(tok, comp[s:e], st.token_text)
            )
            r = mi.reasoning_span(texts, args.mi_reasoning)
            reasoning.append(None if r is None else (s + r[0], s + r[1]))
        episodes.append(mi.Episode(prompt, comp, reasoning, group=(base + b) // G))
    return episodes


MI_KEYS = (
    "retrieval_acc",
    "retrieval_chance",
    "retrieval_above_chance",
    *[f"recall@{k}{s}" for k in mi.RECALL_KS for s in ("", "_chance")],
    "mi_est",
    "mi_seq_est",
    "mi_zscore",
    "mi_zscore_ema",
    "mi_seq_zscore",
    "mi_seq_zscore_ema",
    "cond_entropy",
    "marginal_entropy",
    "matched_logp",
    "marginal_logp",
    "marginal_std",
    "marginal_std_ema",
    "mi_upper_bound",
    "num_samples",
    "num_columns",
    "valid_rate",
    "seconds",
)


def _log_mi(trainer: Any, out: dict, st: SignalState, metrics: Any) -> None:
    from trl.models.utils import disable_gradient_checkpointing

    args, acc = trainer.args, trainer.accelerator
    tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    episodes = episodes_from_batch(trainer, out, st)
    scopes = [("first_turn", mi.sample_first_turn)] if args.mi_first_turn else []
    scopes += [("trajectory", mi.sample_trajectory)] if args.mi_trajectory else []

    def logps_fn(ids: torch.Tensor, attn: torch.Tensor, keep: int) -> torch.Tensor:
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attn, keep, batch_size=ids.shape[0]
        )
        return logps

    for name, sampler in scopes:
        start = time.perf_counter()
        pairs = sampler(episodes, args.mi_num_samples, st.rng)
        # identical contexts score identically: score each distinct one once, then expand by class
        unique: list[list[int]] = [[] for _ in set(pairs.column_class.tolist())]
        for ctx, c in zip(pairs.contexts, pairs.column_class):
            unique[int(c)] = ctx
        n_ctx, n_z = len(unique), len(pairs.reasonings)
        if args.mi_scorer == "cached":
            local = mi.cached_forwards(unique, n_z, args.mi_batch_size)
        else:
            local = mi.num_chunks(n_ctx * n_z, args.mi_batch_size)
        # every process runs the same number of forwards (sharded models need it)
        forwards = int(acc.gather(torch.tensor([local], device=acc.device)).max())
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(trainer.model, args.gradient_checkpointing_kwargs),
        ):
            if args.mi_scorer == "cached":
                scores, _ = mi.cross_score_cached(
                    trainer.model,
                    unique,
                    pairs.reasonings,
                    temperature=float(getattr(trainer, "temperature", 1.0) or 1.0),
                    pad_id=pad_id,
                    device=acc.device,
                    batch_size=args.mi_batch_size,
                    min_forwards=forwards,
                )
            else:
                scores = mi.cross_score(
                    logps_fn,
                    unique,
                    pairs.reasonings,
                    pad_id=pad_id,
                    device=acc.device,
                    batch_size=args.mi_batch_size,
                    min_chunks=forwards,
                )
        result = mi.mi_from_scores(
            scores[:, pairs.column_class],
            np.array([len(z) for z in pairs.reasonings]),
            pairs.target,
            pairs.column_class,
            marginal=args.mi_marginal,
            std_eps=args.mi_std_eps,
            ema=st.ema.setdefault(name, mi.EmaState()),
            ema_decay=args.mi_ema_decay,
        )
        result["valid_rate"] = pairs.num_valid / max(pairs.num_total, 1)
        result["seconds"] = time.perf_counter() - start
        local = torch.tensor(
            [result.get(k, math.nan) for k in MI_KEYS], dtype=torch.float64, device=acc.device
        )
        merged = acc.gather(local.unsqueeze(0)).view(-1, len(MI_KEYS))
        for key, column in zip(MI_KEYS, merged.unbind(1)):
            finite = column[~torch.isnan(column)]
            if finite.numel():
                _put(metrics, st, f"mi/{name}/{key}", finite.mean().item())


# --------------------------------------------------------------------------- callbacks


class SkipUpdateCallback(TrainerCallback):
    """Drops every gradient right before ``optimizer.step()`` when the round kept nothing.

    Zero advantages are not enough: AdamW momentum and weight decay would still move the weights.
    With ``grad=None`` AdamW skips the parameter entirely, so the weights stay bitwise equal.
    (DeepSpeed steps inside its engine and is not covered.)
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        st = signal_state(self.trainer)
        if not st.skip:
            return
        optimizer = kwargs.get("optimizer") or self.trainer.optimizer
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        st.skipped_steps += 1
        # TRL's loss metrics of this step come from masked dummy rows only (entropy would read 0): drop them
        n = int(
            getattr(self.trainer, "current_gradient_accumulation_steps", 0)
            or args.gradient_accumulation_steps
        )
        metrics = getattr(self.trainer, "_metrics", {}).get("train", {})
        for key in LOSS_METRICS:
            values = metrics.get(key)
            if values:
                del values[-n:]


class EmptyStopCallback(TrainerCallback):
    """Stops training after ``filter_empty_stop_steps`` consecutive rounds with nothing kept."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        st = signal_state(self.trainer)
        limit = args.filter_empty_stop_steps
        if limit and st.consecutive_empty >= limit and st.stop_reason is None:
            st.stop_reason = (
                f"stopping at step {state.global_step}: {st.consecutive_empty} consecutive rounds had no group "
                f"with reward variance above the {args.filter_strategy} threshold (filter_empty_stop_steps={limit}); "
                "the policy gets no task signal from these prompts"
            )
            logger.warning(st.stop_reason)
            print(f"[llm-gym] {st.stop_reason}", flush=True)
        if st.stop_reason is not None:
            control.should_training_stop = True


class CollapseReportCallback(TrainerCallback):
    """Appends the MI / entropy / reward-variance series to ``output_dir/collapse_report`` (JSONL)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and state.global_step == 0 and os.path.exists(self.path):
            os.remove(self.path)  # a fresh run starts a fresh series; a resumed one appends

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        row = {
            k: v
            for k, v in logs.items()
            if (k.startswith(("mi/", "snr/")) or k in REPORT_KEYS)
            and isinstance(v, (int, float))
            and math.isfinite(v)
        }
        if not any(k.startswith(("mi/", "snr/")) for k in row):
            return
        row = {"step": state.global_step, **row}
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def make_signal_callbacks(trainer: Any) -> list[TrainerCallback]:
    """Callbacks the trainer registers: skip update, early stop, and the collapse-report writer."""
    signal_state(trainer)
    if trainer.args.filter_strategy != "off" and getattr(trainer, "is_deepspeed_enabled", False):
        logger.warning(
            "SNR filtering under DeepSpeed: DeepSpeed steps the optimizer inside its engine, so a round in which "
            "the filter keeps no group is NOT skipped; the update runs on masked rows and AdamW momentum and "
            "weight decay still move the weights. Use DDP or FSDP for SNR filtering, or set filter_strategy=off."
        )
    callbacks: list[TrainerCallback] = [SkipUpdateCallback(trainer), EmptyStopCallback(trainer)]
    if trainer.args.collapse_report:
        callbacks.append(
            CollapseReportCallback(os.path.join(trainer.args.output_dir, trainer.args.collapse_report))
        )
    return callbacks
