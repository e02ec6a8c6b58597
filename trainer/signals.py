"""The RAGEN-2 signal tools in a training round: MI collapse metrics and the SNR group filter.

:class:`~llm_gym.trainer.grpo.LLMGymGRPOTrainer` calls :func:`decide_round` once per training generation round,
after TRL scored the batch, with the round's episode rewards. It returns a :class:`RoundDecision`, which the
trainer applies and logs in one place (``_generate_and_score_completions``):

1. every ``mi_every`` rounds (and the first), MI metrics on the UNFILTERED batch (``mi/...``); every
   ``gradient_analysis_every`` rounds (and the first), the gradient split by reward variance on it
   (``grad_analysis/...``, :mod:`llm_gym.trainer.gradient_analysis`; it changes nothing the round trains);
2. the filter decides on the gathered (global) rewards, so every process agrees (``snr/...``);
3. dropped rows leave the batch (``filter_drop="remove"``), so they cost no forward/backward in the update, or
   only lose their loss weight (``"mask"``); ``num_items_in_batch`` is recomputed;
4. ``skip``: nothing was kept, so the round's optimizer steps take no update; ``loss_scale``: the
   ``filter_loss_scaling`` multiplier for the final advantages; ``update_micro_batches``
   (``filter_update_steps="proportional"``): the round's micro-batches that carry rows.

The math lives in :mod:`llm_gym.trainer.snr_filter`, :mod:`llm_gym.trainer.mutual_info` and
:mod:`llm_gym.trainer.batch`; this module only wires them. It reads the trainer's public surface only (``args``,
``accelerator``, ``model``, ``processing_class``, ``num_generations``, ``temperature``, ``last_rollout`` and
``sequence_logps(ids, attention_mask, logits_to_keep)``) and writes nothing but its own :class:`SignalState`.
"""

from __future__ import annotations

import base64
import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch
from llm_gym.trainer import gradient_analysis
from llm_gym.trainer import mutual_info as mi
from llm_gym.trainer import snr_filter as snr
from llm_gym.trainer.batch import (
    loss_mask,
    mask_rows,
    select_rows,
    select_rows_copy,
    trim_completion_columns,
)


@dataclass
class SignalState:
    """What the signal tools carry from round to round (written only by this module; saved in checkpoints)."""

    #: training rounds decided so far (MI runs on rounds 0, mi_every, 2 * mi_every, ...)
    rounds: int = 0
    #: rounds in a row in which the filter kept nothing (read by the empty-round stop)
    consecutive_empty: int = 0
    #: MI-ZScore-EMA state per scope
    ema: dict[str, mi.EmaState] = field(default_factory=dict)
    #: MI pair sampling
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    #: token id -> text, a decode cache (not saved)
    token_text: dict[int, str] = field(default_factory=dict)
    #: random copies that pad kept rows to whole update batches (``filter_update_steps="proportional"``)
    copy_generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))

    @classmethod
    def for_process(cls, seed: int, process_index: int) -> SignalState:
        """A fresh state whose MI sampling differs across processes but is reproducible per run."""
        return cls(
            rng=np.random.default_rng(int(seed) + int(process_index)),
            copy_generator=torch.Generator().manual_seed(int(seed) + int(process_index)),
        )

    def state_dict(self) -> dict[str, Any]:
        """The state as JSON-able data, for checkpoints: a resumed run continues with the same MI cadence,
        EMAs, pair-sampling and copy generators and empty-round count as an uninterrupted one. ``token_text``
        (a decode cache) is left out."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "token_text":
                continue
            if f.name == "rng":
                value = value.bit_generator.state
            elif f.name == "copy_generator":
                value = base64.b64encode(value.get_state().numpy().tobytes()).decode("ascii")
            elif f.name == "ema":
                value = {k: asdict(e) for k, e in value.items()}
            out[f.name] = value
        return out

    def load_state_dict(self, data: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (keys it does not know are ignored)."""
        known = {f.name for f in fields(self)} - {"token_text"}
        for name, value in data.items():
            if name not in known:
                continue
            if name == "rng":
                bit_generator = np.random.PCG64()
                bit_generator.state = value
                value = np.random.Generator(bit_generator)
            elif name == "copy_generator":
                raw = np.frombuffer(base64.b64decode(value), dtype=np.uint8).copy()
                gen = torch.Generator()
                gen.set_state(torch.from_numpy(raw))
                value = gen
            elif name == "ema":
                value = {k: mi.EmaState(**e) for k, e in value.items()}
            setattr(self, name, value)


@dataclass
class RoundDecision:
    """What the signal tools decided for one training round; the trainer applies it and logs ``metrics``."""

    #: the training round (0-based)
    index: int
    #: the rows the loss will see: the kept groups (padded to whole micro-batches), or every row with the
    #: dropped ones masked (``filter_drop="mask"``)
    batch: dict
    #: nothing was kept: the round's optimizer steps must not change the weights
    skip: bool = False
    #: the ``filter_loss_scaling`` multiplier for the round's final advantages (1 when not filtering)
    loss_scale: float = 1.0
    #: ``filter_update_steps="proportional"``: micro-batches of the round that carry rows (the rest are empty)
    update_micro_batches: int | None = None
    #: ``snr/*`` and ``mi/*`` metrics of the round
    metrics: dict[str, float] = field(default_factory=dict)


def decide_round(trainer: Any, batch: dict, rewards: np.ndarray, state: SignalState) -> RoundDecision:
    """MI metrics and the gradient analysis on the unfiltered batch (at their cadences), then the SNR filter's
    decision.

    ``rewards`` are the round's episode rewards over all processes, in process order (NaN = unscorable).
    Advantages are left as they are: the trainer multiplies them by ``loss_scale`` once they are final.
    """
    args = trainer.args
    index = state.rounds
    state.rounds += 1
    metrics: dict[str, float] = {}
    if args.mi_every and index % args.mi_every == 0 and (args.mi_first_turn or args.mi_trajectory):
        metrics.update(mi_metrics(trainer, batch, state))
    every = getattr(args, "gradient_analysis_every", 0)
    if every and index % every == 0:
        metrics.update(gradient_analysis.analyse_round(trainer, batch, rewards, index))
    start = time.perf_counter()
    decision = _filter(trainer, batch, np.asarray(rewards, dtype=np.float64), state, index)
    decision.metrics = {**metrics, **decision.metrics, "snr/filter_seconds": time.perf_counter() - start}
    return decision


def _filter(trainer: Any, out: dict, rewards: np.ndarray, st: SignalState, index: int) -> RoundDecision:
    args = trainer.args
    acc = trainer.accelerator
    G = trainer.num_generations
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
        ddof=args.filter_variance_ddof,
    )
    lo = acc.process_index * n_local
    keep_local = torch.from_numpy(dec.keep_rows(G)[lo : lo + n_local].copy())
    filtering = args.filter_strategy != "off"
    skip = filtering and dec.skip
    st.consecutive_empty = st.consecutive_empty + 1 if skip else 0

    n_pad = 0
    update_micro_batches = None
    loss_scale = snr.loss_scale(dec.kept_frac, args.filter_loss_scaling) if filtering else 1.0
    if filtering:
        spg = int(getattr(args, "steps_per_generation", None) or 1)
        if args.filter_update_steps == "proportional":
            # RAGEN: pad the kept rows with random copies to whole update batches; only those optimizer steps
            # update. Every process takes the same number (the most any process needs), for the collectives.
            ga = int(args.gradient_accumulation_steps)
            step_rows = int(args.per_device_train_batch_size) * ga
            most = int(dec.keep_rows(G).reshape(acc.num_processes, n_local).sum(1).max())
            steps = -(-most // step_rows)
            # nothing kept: one micro-batch of masked rows stands in (every step of the round is empty)
            target = steps * step_rows or int(args.per_device_train_batch_size)
            out, n_pad = select_rows_copy(out, keep_local, target, st.copy_generator)
            out, _ = trim_completion_columns(out)
            update_micro_batches = steps * ga
            # TRL's token-mean ("dapo") normaliser assumes every micro-batch of the round shares the tokens:
            # scale it so one real optimizer step is normalised by its own share
            total = acc.gather(loss_mask(out).sum()).sum()
            out["num_items_in_batch"] = total * spg / max(steps * ga, 1)
        elif args.filter_drop == "remove":
            # Every process keeps the same number of rows (the most any process kept, in whole micro-batches):
            # TRL gathers per-row loss metrics, and unequal shapes break that collective (gloo aborts).
            most = int(dec.keep_rows(G).reshape(acc.num_processes, n_local).sum(1).max())
            rows_per_process = max(spg, -(-most // spg) * spg)
            if not bool(keep_local.all()) or n_local % spg:
                out, n_pad = select_rows(out, keep_local, multiple=rows_per_process)
                out, _ = trim_completion_columns(out)
        elif not bool(keep_local.all()):
            out = mask_rows(out, keep_local)
        if args.filter_update_steps != "proportional":
            out["num_items_in_batch"] = acc.gather(loss_mask(out).sum()).sum()

    rows = (
        acc.gather(torch.tensor([out["completion_ids"].shape[0], n_pad], device=acc.device))
        .view(-1, 2)
        .sum(0)
    )
    var = dec.variances
    kept = dec.keep_groups
    spread = snr.variance_spread(var)
    metrics = {
        "snr/num_groups": kept.size,
        "snr/kept_groups": kept.sum(),
        "snr/kept_frac": dec.kept_frac,
        "snr/group_var_before": var.mean() if var.size else math.nan,
        "snr/group_var_after": var[kept].mean() if kept.any() else math.nan,
        # RAGEN's rollout/in_group_reward_std (what its reward-variance early stop watches)
        "snr/group_std_before": np.sqrt(var).mean() if var.size else math.nan,
        # RAGEN-2 Table 8's Std(RV)/Mean(RV) over the round's groups: high (bimodal) where filtering helped
        "snr/group_var_std": spread[0],
        "snr/group_var_cv": spread[1],
        "snr/zero_var_frac": (var <= snr.ZERO_TOL).mean() if var.size else math.nan,
        "snr/skipped": float(skip),
        "snr/consecutive_empty": st.consecutive_empty,
        "snr/update_rows": int(rows[0]),
        "snr/padding_rows": int(rows[1]),
    }
    if update_micro_batches is not None:
        metrics["snr/update_steps"] = update_micro_batches // int(args.gradient_accumulation_steps)
    return RoundDecision(
        index=index,
        batch=out,
        skip=skip,
        loss_scale=loss_scale,
        update_micro_batches=update_micro_batches,
        metrics={k: float(v) for k, v in metrics.items()},
    )


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


def episodes_from_batch(
    trainer: Any, out: dict, st: SignalState, turn_spans: list | None = None
) -> list[mi.Episode]:
    """Local samples as ``Episode`` records, with the reasoning span of every turn.

    Turn spans come from ``turn_spans`` (the rollout's, one list per row) when given and aligned with the
    batch, else from the runs of 1s in the loss mask.
    """
    args = trainer.args
    G = trainer.num_generations
    tok = trainer.processing_class
    tok = getattr(tok, "tokenizer", tok)
    n = out["completion_ids"].shape[0]
    base = trainer.accelerator.process_index * n
    if turn_spans is not None and len(turn_spans) != n:
        turn_spans = None
    pids, pmask = out["prompt_ids"].tolist(), out["prompt_mask"].tolist()
    cids, lmask = out["completion_ids"].tolist(), loss_mask(out).int().tolist()
    episodes = []
    for b in range(n):
        prompt = [t for t, m in zip(pids[b], pmask[b]) if m]
        comp = cids[b]
        spans = (
            _runs(lmask[b])
            if turn_spans is None
            else [(int(s), min(int(e), len(comp))) for s, e in turn_spans[b]]
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


def mi_metrics(trainer: Any, out: dict, st: SignalState) -> dict[str, float]:
    """Cross-score the batch's (prompt, reasoning) pairs; returns ``mi/<scope>/<key>`` (scopes: first turn,
    trajectory), each the mean over processes of its finite values. Every process runs the same number of
    forwards."""
    from llm_gym.trainer.deprecations import old_checkpointing_names
    from trl.models.utils import disable_gradient_checkpointing

    args, acc = trainer.args, trainer.accelerator
    tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    rollout = trainer.last_rollout
    episodes = episodes_from_batch(trainer, out, st, rollout.turn_spans if rollout is not None else None)
    scopes = [("first_turn", mi.sample_first_turn)] if args.mi_first_turn else []
    scopes += [("trajectory", mi.sample_trajectory)] if args.mi_trajectory else []
    metrics: dict[str, float] = {}
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
            old_checkpointing_names(),  # TRL toggles checkpointing through transformers' deprecated names
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
                    trainer.sequence_logps,
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
        row = torch.tensor([result.get(k, math.nan) for k in MI_KEYS], dtype=torch.float64, device=acc.device)
        merged = acc.gather(row.unsqueeze(0)).view(-1, len(MI_KEYS))
        for key, column in zip(MI_KEYS, merged.unbind(1)):
            finite = column[~torch.isnan(column)]
            if finite.numel():
                metrics[f"mi/{name}/{key}"] = float(finite.mean().item())
    return metrics


__all__ = ["MI_KEYS", "RoundDecision", "SignalState", "decide_round", "episodes_from_batch", "mi_metrics"]
