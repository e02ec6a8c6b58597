"""RAGEN-2's claims measured on the model organism: the SNR filter across many training seeds, KL to the warm start
and the entropy bonus, MI against entropy as predictors of success, and the task-gradient bound per reward-variance
bucket (arXiv 2604.06268, Secs. 3-4, Table 5, Table 8, Fig. 3, Fig. 8), on Bandit and on a multi-turn env.

Two envs (:data:`STUDIES`), each run trained from its env's one shared warm start with one arm's flags:

* **Bandit** (:data:`BANDIT`): the README's main job (``llmgym-train --profile organism --env Bandit``) from the
  main job's own warm start (``benchmarks/organism_learning.py``'s ``bandit`` part), 40 steps;
* **FrozenLake** (:data:`FROZENLAKE`): 3x3 deterministic CoordFrozenLake, three turns of one move, the organism's
  multi-turn profile (``--profile organism --env CoordFrozenLake``) RL only, 100 steps, from the SFT run ``w0.1``
  of ``organism_learning.py`` (built here by :func:`fl_warm_start`, or copied with ``--fl-warm-start``).

Arms: no filter; our top-p 0.9; RAGEN's upstream rule (``upstream_top_p`` 0.9, masked as the upstream PRs do);
top-k 0.5 (RAGEN-2 Table 9's better top-k). On Bandit crossed (:data:`STAGES`) with KL beta 0.01 / 0.04 to the
warm start (the run's ``--model``, TRL's reference) and the entropy bonus 0.001, for no filter and top-p (and
top-k with KL 0.01); on FrozenLake (:data:`FL_STAGES`) no filter and top-p first, then the other two, then no
filter and top-p with KL 0.01, with the entropy bonus and with KL 0.04, each at 10 seeds.

Seeds: each env's pilot runs (no filter and top-p on pilot seeds, :data:`PILOT_SEEDS` and :data:`FL_PILOT_SEEDS`,
evaluated on seeds 300,000..) set its steps-to-threshold threshold; training seeds 0.. each play their
own env seeds (:meth:`Study.train_seed`); every study run is evaluated on the same 512 held-out seeds 200,000..
(disjoint from the pilots', the training and the warm-start data's). Every run logs each round's success, step
time and SNR spread, and periodically the MI proxies, the gradient split by reward variance
(``--gradient_analysis_every``, bitwise neutral) and episode records (answer or first-move concentration).

Parts, each its own file under ``--work-dir`` (``runs/<name>.json``, FrozenLake's ``runs/fl_<name>.json``; a
finished part is skipped, so rerunning the same command resumes and ``--aggregate-only`` picks up whatever
finished, even while another invocation runs); ``--stages`` picks stages of either env:

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/ragen2_claims.py --work-dir /tmp/ragen2_claims
    OMP_NUM_THREADS=1 python benchmarks/ragen2_claims.py --work-dir /tmp/ragen2_claims --aggregate-only --publish
    OMP_NUM_THREADS=1 python benchmarks/ragen2_claims.py --quick --work-dir /tmp/ragen2_quick   # pipeline check

``--publish`` writes ``docs/data/ragen2_claims.json`` (per env and arm ``envs[env][arm]`` with ``seeds`` and
``success`` with ``mean`` and a bootstrap ``ci`` over seeds; per env ``per_env[env]`` with its pilot, ``spearman``,
gradient split, runs done and ``missing``; top-level ``spearman`` with ``mi`` and ``entropy``, Bandit's) and the
plots ``docs/img/ragen2_claims_*.png``; ``--quick`` never writes into ``docs/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline, single-threaded)
import organism_learning as ol  # noqa: E402
from learning_study import part  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "docs" / "data" / "ragen2_claims.json"
PLOTS = ROOT / "docs" / "img"
ENV = "llmgym/Bandit-v0"
#: The multi-turn env of the study: 3x3 deterministic CoordFrozenLake, one move a turn, three turns (the organism
#: page's FrozenLake, ``organism_learning.py``'s FL_ENV and FL_KWARGS).
FL_ENV = ol.FL_ENV

#: Filter arms: name -> llmgym-train flags.
ARMS: dict[str, list[str]] = {
    "off": ["--filter_strategy", "off"],
    "top_p": ["--filter_strategy", "top_p", "--filter_value", "0.9"],
    "upstream_top_p": [
        "--filter_strategy",
        "upstream_top_p",
        "--filter_value",
        "0.9",
        "--filter_drop",
        "mask",
    ],
    "top_k": ["--filter_strategy", "top_k", "--filter_value", "0.5"],
}
ARM_LABELS = {
    "off": "no filter",
    "top_p": "top-p 0.9 (ours)",
    "upstream_top_p": "RAGEN's upstream rule (0.9, masked)",
    "top_k": "top-k 0.5",
}


@dataclass(frozen=True)
class Cell:
    """One arm of the study: a filter crossed with a KL coefficient and an entropy bonus."""

    arm: str
    beta: float = 0.0
    entropy: float = 0.0

    @property
    def key(self) -> str:
        kl = f"+kl{self.beta:g}" if self.beta else ""
        ent = f"+ent{self.entropy:g}" if self.entropy else ""
        return f"{self.arm}{kl}{ent}"

    @property
    def reference(self) -> Cell:
        """The no-filter cell with the same KL and entropy settings (what the filter's effect is measured against)."""
        return Cell("off", self.beta, self.entropy)

    def flags(self) -> list[str]:
        return [*ARMS[self.arm], "--beta", f"{self.beta:g}", "--entropy_coef", f"{self.entropy:g}"]


#: Stages in run order: (cells, training seeds). Seed-major within a stage, so a stage cut short leaves every
#: cell with about the same seed count.
STAGES: dict[str, tuple[tuple[Cell, ...], tuple[int, ...]]] = {
    "core": (tuple(Cell(a) for a in ARMS), tuple(range(10))),
    "kl": (tuple(Cell(a, b) for b in (0.01, 0.04) for a in ("off", "top_p")), tuple(range(5))),
    "entropy": (tuple(Cell(a, 0.0, 0.001) for a in ("off", "top_p")), tuple(range(5))),
    # KL 0.01 (the crossing's strongest contrast in the first 5 seeds) to 10 seeds
    "kl_seeds": (tuple(Cell(a, 0.01) for a in ("off", "top_p")), tuple(range(5, 10))),
    # the other crossings (KL 0.04, the entropy bonus) to 10 seeds
    "cross_seeds": (
        (Cell("off", 0.04), Cell("top_p", 0.04), Cell("off", 0.0, 0.001), Cell("top_p", 0.0, 0.001)),
        tuple(range(5, 10)),
    ),
    # top-k crossed with KL 0.01 (the crossing where top-p lost clearly)
    "top_k_kl": ((Cell("top_k", 0.01),), tuple(range(10))),
}
PILOT_CELLS = (Cell("off"), Cell("top_p"))
PILOT_SEEDS = (100, 101)
PILOT_EVAL_SEED, PILOT_EVAL_N = 300_000, 256
EVAL_SEED, EVAL_N = 200_000, 512
#: RL steps per run: the profile's 40 (the pilot's mean curve still rises at 40: see the page).
STEPS = 40
#: Trailing window (steps) of the training-success curve steps-to-threshold reads.
SMOOTH = 5
MI_EVERY, GRAD_EVERY, RECORDS_EVERY = 5, 10, 5
#: The MI proxy and the entropies the Spearman correlations are computed for (collapse.jsonl keys).
MI_KEY = "mi/trajectory/mi_zscore"
ENTROPY_KEY = "entropy"
SPEARMAN_KEYS = {
    "mi": MI_KEY,
    "entropy": ENTROPY_KEY,
    "retrieval_acc": "mi/trajectory/retrieval_acc",
    "mi_first_turn": "mi/first_turn/mi_zscore",
    "cond_entropy": "mi/trajectory/cond_entropy",
}
#: RAGEN-2 Table 8 (when filtering helps), beside our Std(RV)/Mean(RV).
TABLE8 = (
    {"setting": "Sokoban 14B", "delta": "+4.6%", "std_over_mean": 1.29},
    {"setting": "Sokoban 3B", "delta": "+3.2%", "std_over_mean": 1.16},
    {"setting": "FrozenLake 3B GRPO", "delta": "-5.0%", "std_over_mean": 0.33},
)
QUICK_STEPS, QUICK_EVAL_N, QUICK_SEEDS = 3, 16, (0, 1)
BOOT = 10_000


def train_seed(seed: int) -> int:
    """First env seed of a training seed's Bandit rounds (40 rounds x 16 groups stay below the next one's)."""
    return 20_000 + 1_000 * seed


#: FrozenLake stages, each at 10 training seeds (the issue's minimum): no filter and our top-p first; top-k and RAGEN's
#: upstream rule next; then KL 0.01, the entropy bonus and KL 0.04, each crossed with no filter and top-p.
FL_STAGES: dict[str, tuple[tuple[Cell, ...], tuple[int, ...]]] = {
    "fl_core": ((Cell("off"), Cell("top_p")), tuple(range(10))),
    "fl_more": ((Cell("top_k"), Cell("upstream_top_p")), tuple(range(10))),
    # the KL crossing at beta 0.01 (Bandit's strongest contrast), no filter against top-p
    "fl_kl": ((Cell("off", 0.01), Cell("top_p", 0.01)), tuple(range(10))),
    # the entropy bonus (the grpo preset's 0.001), no filter against top-p
    "fl_entropy": ((Cell("off", 0.0, 0.001), Cell("top_p", 0.0, 0.001)), tuple(range(10))),
    # the KL crossing's stronger beta, 0.04, completing Bandit's grid of betas for these two arms
    "fl_kl04": ((Cell("off", 0.04), Cell("top_p", 0.04)), tuple(range(10))),
}
#: FrozenLake's organism profile (``trainer/profiles/organism/coordfrozenlake.yaml``), RL only from one warm start.
FL_JOB = ol.profile_job("coordfrozenlake")
#: RL steps per FrozenLake run: the multi-turn recipe's tuning run (``docs/training/organism.md``) gained about 0.06
#: greedy success in 100 (a 400-step run is 4x the CPU this study has).
FL_STEPS = 100
#: Instruments per FrozenLake run: MI every 10 rounds (each pass costs about a step), the gradient split every 25,
#: episode records every 10.
FL_MI_EVERY, FL_GRAD_EVERY, FL_RECORDS_EVERY = 10, 25, 10
#: The FrozenLake warm start, shared by every run: ``organism_learning.py``'s SFT run ``w0.1`` (format tokens at
#: 0.1, 300 steps of 32 at lr 1e-3 constant, seed 0, on its solver episodes), 0.615 held-out.
FL_WARM_RUN = "w0.1"
#: FrozenLake's pilot: no filter and top-p (:data:`PILOT_CELLS`) from the study's warm start on one pilot seed (its
#: rounds play env seeds 600,000..), evaluated on 128 seeds 300,000..; they set FrozenLake's steps to threshold.
FL_PILOT_SEEDS = (100,)
#: First env seed of FrozenLake training seed ``s``: 100,000 + 5,000 s (room for 312 rounds of 16 groups each,
#: below the evaluation seeds 200,000.., the pilot evaluation's 300,000.. and the warm start's solver data
#: 1,000,000..; pilot seed 100 trains on 600,000..).
FL_TRAIN_SEED, FL_TRAIN_STRIDE = 100_000, 5_000


# ----------------------------------------------------------------------------------------------- pure statistics
def bootstrap_ci(values: Sequence[float], n_boot: int = BOOT, seed: int = 0) -> list[float] | None:
    """Percentile 95% bootstrap interval of the mean over ``values`` (None for fewer than 2)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)
    return [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]


def rankdata(x: Sequence[float]) -> np.ndarray:
    """Ranks 1..n, ties given their average rank."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="stable")
    ranks = np.empty(a.size)
    ranks[order] = np.arange(1, a.size + 1)
    for value in np.unique(a):
        tied = a == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation over the pairs where both are finite (None below 3 pairs or a constant side)."""
    pairs = [
        (a, b)
        for a, b in zip(x, y)
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
    ]
    if len(pairs) < 3:
        return None
    rx, ry = rankdata([p[0] for p in pairs]), rankdata([p[1] for p in pairs])
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def trailing_mean(values: Sequence[float], window: int = SMOOTH) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def steps_to(steps: Sequence[int], success: Sequence[float], threshold: float) -> int | None:
    """The first step whose trailing-:data:`SMOOTH` mean training success reaches ``threshold`` (None: never)."""
    for step, value in zip(steps, trailing_mean(success)):
        if value >= threshold - 1e-12:
            return int(step)
    return None


#: Valid-answer rate at or below which a round (or the final evaluation) counts as collapsed: the replies stopped
#: naming a shown arm, one invalid template for every prompt.
COLLAPSE_VALID = 0.05


def collapse_step(steps: Sequence[int], valid: Sequence[float | None]) -> int | None:
    """The step from which every later round's training valid-answer rate stays at or below
    :data:`COLLAPSE_VALID` to the end of the run (None when the last round is above it)."""
    onset = None
    for step, v in zip(steps, valid):
        if v is None:
            continue
        if v <= COLLAPSE_VALID:
            onset = int(step) if onset is None else onset
        else:
            onset = None
    return onset


def dipped(valid: Sequence[float | None]) -> bool:
    """Whether any round's valid-answer rate fell to :data:`COLLAPSE_VALID` or below."""
    return any(v is not None and v <= COLLAPSE_VALID for v in valid)


def pilot_threshold(curves: Sequence[Sequence[float]]) -> float:
    """Half the pilot's gain: per pilot run, its first :data:`SMOOTH` steps' mean training success plus half the way
    to the best trailing-:data:`SMOOTH` mean it reached (its peak, not its end: a run may collapse after learning),
    averaged over the pilot runs and rounded to 0.01."""
    return round(
        float(
            np.mean(
                [np.mean(c[:SMOOTH]) + 0.5 * (max(trailing_mean(c)) - np.mean(c[:SMOOTH])) for c in curves]
            )
        ),
        2,
    )


def _entropy_bits(counts: Iterable[int], total: int) -> float:
    return -sum(c / total * math.log2(c / total) for c in counts if c)


def concentration(pairs: Sequence[tuple[Any, Any]]) -> dict[str, float]:
    """Over (context, answer) pairs: the most common answer's share, distinct answers, the answer entropy and the
    plug-in mutual information between context and answer, in bits (0 for an answer that ignores the context)."""
    n = len(pairs)
    answers = Counter(a for _, a in pairs)
    h = _entropy_bits(answers.values(), n)
    by_context: dict[Any, Counter] = {}
    for ctx, a in pairs:
        by_context.setdefault(ctx, Counter())[a] += 1
    h_given = sum(
        sum(c.values()) / n * _entropy_bits(c.values(), sum(c.values())) for c in by_context.values()
    )
    return {
        "top_share": max(answers.values()) / n,
        "distinct": len(answers),
        "entropy_bits": h,
        "mi_bits": max(h - h_given, 0.0),
    }


_ARMS_SHOWN = re.compile(r"The two arms are: (\S{1,64}) and (\S{1,64})\. ")


def answer_stats(episodes: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Template-collapse measures over Bandit episodes: the most common answer's share (an invalid answer counts
    as one answer, ``None``), distinct answers, the answer entropy and the plug-in mutual information between the
    arms shown (in order) and the answer, in bits, and the share of valid answers naming the first arm shown."""
    pairs: list[tuple[tuple[str, str] | None, str | None]] = []
    for ep in episodes:
        turns = ep.get("turns") or []
        info = turns[0].get("info", {}) if turns else {}
        shown = _ARMS_SHOWN.match(str(ep.get("initial_observation", ""))[:300])
        pairs.append(((shown.group(1), shown.group(2)) if shown else None, info.get("chosen_arm")))
    if not pairs:
        return {"episodes": 0}
    c = concentration(pairs)
    valid = [(ctx, a) for ctx, a in pairs if a is not None and ctx is not None]
    return {
        "episodes": len(pairs),
        "top_answer_share": c["top_share"],
        "distinct_answers": c["distinct"],
        "answer_entropy_bits": c["entropy_bits"],
        "answer_mi_bits": c["mi_bits"],
        "first_listed_share": (sum(a == ctx[0] for ctx, a in valid) / len(valid)) if valid else math.nan,
    }


_COORD = re.compile(r"^(Start|Goal): \((\d{1,2}), (\d{1,2})\)$", flags=re.M)
#: FrozenLake's moves as (row, column) steps.
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def goal_direction(observation: str) -> tuple[int, int] | None:
    """The goal's direction from the start, (sign of the row step, sign of the column step), read from a
    CoordFrozenLake observation's ``Start:`` and ``Goal:`` lines (None when either is missing)."""
    found = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in _COORD.finditer(observation[:1000])}
    if "Start" not in found or "Goal" not in found:
        return None
    (r0, c0), (r1, c1) = found["Start"], found["Goal"]
    return _sign(r1 - r0), _sign(c1 - c0)


def move_stats(episodes: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Template-collapse measures over FrozenLake episodes, on the first move of each (an invalid reply counts as
    one move, ``None``): the most common move's share, distinct moves, the move entropy, the plug-in mutual
    information between the goal's direction from the start and the move, in bits (a template that ignores the
    board has 0), and the share of valid first moves that step toward the goal."""
    pairs: list[tuple[tuple[int, int] | None, str | None]] = []
    for ep in episodes:
        turns = ep.get("turns") or []
        info = turns[0].get("info", {}) if turns else {}
        actions = info.get("actions") or [None]
        move = actions[0] if info.get("action_is_valid") and actions[0] in MOVES else None
        pairs.append((goal_direction(str(ep.get("initial_observation", ""))), move))
    if not pairs:
        return {"episodes": 0}
    c = concentration(pairs)
    valid = [(d, m) for d, m in pairs if d is not None and m is not None]
    toward = [MOVES[m][0] * d[0] > 0 or MOVES[m][1] * d[1] > 0 for d, m in valid]
    return {
        "episodes": len(pairs),
        "top_move_share": c["top_share"],
        "distinct_moves": c["distinct"],
        "move_entropy_bits": c["entropy_bits"],
        "move_mi_bits": c["mi_bits"],
        "toward_goal_share": (sum(toward) / len(toward)) if toward else math.nan,
    }


def _quote(arg: str) -> str:
    return arg if arg else "''"


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def summarise_run(
    run: Path, stats: Callable[[Iterable[dict[str, Any]]], dict[str, float]] = answer_stats
) -> dict[str, Any]:
    """One finished run folder -> its part: evaluations, the per-step series, MI checkpoints, gradient points and
    collapse measures (``stats`` over the episodes: :func:`answer_stats` for Bandit, :func:`move_stats` for
    FrozenLake) (pure reading of ``eval_report.json``, ``collapse.jsonl`` and ``episodes.jsonl``)."""
    report = json.loads((run / "eval_report.json").read_text(encoding="utf-8"))
    first, last = report["evals"][0], report["evals"][-1]
    rows = [
        json.loads(line) for line in (run / "collapse.jsonl").read_text(encoding="utf-8").splitlines() if line
    ]
    by_step: dict[int, dict[str, Any]] = {}
    for r in rows:  # one line per logging step (logging_steps 1); a resumed run may repeat one: the last wins
        by_step.setdefault(int(r["step"]), {}).update(r)
    steps = sorted(by_step)
    series = {
        k: [by_step[s].get(k) for s in steps]
        for k in (
            "env/success",
            "env/valid_action_rate",
            "step_time",
            "snr/kept_frac",
            "snr/group_var_cv",
            "kl",
        )
    }
    series[ENTROPY_KEY] = [by_step[s].get(ENTROPY_KEY) for s in steps]
    plain = [
        by_step[s]["step_time"]
        for s in steps
        if _finite(by_step[s].get("step_time"))
        and not any(k.startswith(("mi/", "grad_analysis/")) for k in by_step[s])
    ]
    filter_share = [
        by_step[s]["snr/filter_seconds"] / by_step[s]["step_time"]
        for s in steps
        if _finite(by_step[s].get("snr/filter_seconds"))
        and _finite(by_step[s].get("step_time"))
        and by_step[s]["step_time"] > 0
    ]
    checkpoints = [
        {
            "step": s,
            "success": by_step[s].get("env/success"),
            **{n: by_step[s].get(k) for n, k in SPEARMAN_KEYS.items()},
        }
        for s in steps
        if MI_KEY in by_step[s]
    ]
    grad = []
    for s in steps:
        r = by_step[s]
        for b in sorted({k.split("/")[1] for k in r if k.startswith("grad_analysis/bucket_")}):
            p = f"grad_analysis/{b}/"
            grad.append(
                {
                    "step": s,
                    "bucket": int(b.split("_")[1]),
                    "sqrt_reward_var": r.get(p + "sqrt_reward_var"),
                    "task_norm": r.get(p + "task_norm"),
                    "reg_norm": r.get(p + "reg_norm"),
                }
            )
    grad_seconds = [
        by_step[s]["grad_analysis/seconds"] for s in steps if "grad_analysis/seconds" in by_step[s]
    ]
    eval_eps: list[dict[str, Any]] = []
    train_eps: dict[int, list[dict[str, Any]]] = {}
    records = run / "episodes.jsonl"
    final_step = int(last["step"])
    if records.is_file():
        with records.open(encoding="utf-8") as f:
            for line in f:
                ep = json.loads(line)
                meta = ep.get("meta", {})
                if meta.get("mode") == "eval":
                    if int(meta.get("step", -1)) == final_step:
                        eval_eps.append(ep)
                else:
                    train_eps.setdefault(int(meta.get("step", -1)), []).append(ep)
    # the final step may hold a periodic and the closing evaluation of the same episodes: count each seed once
    seen: set[Any] = set()
    unique_eval = []
    for ep in eval_eps:
        if ep.get("seed") not in seen:
            seen.add(ep.get("seed"))
            unique_eval.append(ep)
    return {
        "warm_start": {k: first[k] for k in ("success", "valid")},
        "after": {k: last[k] for k in ("success", "valid", "success_given_valid") if k in last},
        "rl_steps": final_step,
        "steps": steps,
        "series": series,
        "step_time_plain": float(np.mean(plain)) if plain else None,
        "step_time_all": float(np.mean([v for v in series["step_time"] if _finite(v)])) if steps else None,
        "filter_cost_share": float(np.mean(filter_share)) if filter_share else None,
        "grad_seconds": float(np.mean(grad_seconds)) if grad_seconds else None,
        "checkpoints": checkpoints,
        "grad": grad,
        "collapse": {
            "final_eval": stats(unique_eval),
            "train": [{"step": s, **stats(eps)} for s, eps in sorted(train_eps.items())],
        },
    }


# ----------------------------------------------------------------------------------------------- the two envs
@dataclass(frozen=True)
class Study:
    """One env of the study: its command, run names, stages, length, seeds and collapse measure."""

    env: str
    #: the run's command up to its arm flags (``--model WARM_START --warm_start none`` follow it)
    job: tuple[str, ...]
    #: run-name prefix (Bandit's runs have none, so the parts recorded before FrozenLake joined keep their names)
    prefix: str
    stages: dict[str, tuple[tuple[Cell, ...], tuple[int, ...]]]
    steps: int
    first_train_seed: int
    train_stride: int
    collapse_stats: Callable[[Iterable[dict[str, Any]]], dict[str, float]]
    pilot_cells: tuple[Cell, ...]
    pilot_seeds: tuple[int, ...]
    pilot_eval_n: int
    mi_every: int
    grad_every: int
    records_every: int

    def train_seed(self, seed: int) -> int:
        return self.first_train_seed + self.train_stride * seed


BANDIT = Study(
    env=ENV,
    job=tuple(ol.MAIN_JOB),
    prefix="",
    stages=STAGES,
    steps=STEPS,
    first_train_seed=train_seed(0),
    train_stride=train_seed(1) - train_seed(0),
    collapse_stats=answer_stats,
    pilot_cells=PILOT_CELLS,
    pilot_seeds=PILOT_SEEDS,
    pilot_eval_n=PILOT_EVAL_N,
    mi_every=MI_EVERY,
    grad_every=GRAD_EVERY,
    records_every=RECORDS_EVERY,
)
FROZENLAKE = Study(
    env=FL_ENV,
    job=tuple(FL_JOB),
    prefix="fl_",
    stages=FL_STAGES,
    steps=FL_STEPS,
    first_train_seed=FL_TRAIN_SEED,
    train_stride=FL_TRAIN_STRIDE,
    collapse_stats=move_stats,
    pilot_cells=PILOT_CELLS,
    pilot_seeds=FL_PILOT_SEEDS,
    pilot_eval_n=128,
    mi_every=FL_MI_EVERY,
    grad_every=FL_GRAD_EVERY,
    records_every=FL_RECORDS_EVERY,
)
STUDIES = {BANDIT.env: BANDIT, FROZENLAKE.env: FROZENLAKE}


# ----------------------------------------------------------------------------------------------- running
def run_name(cell: Cell, seed: int, study: Study = BANDIT) -> str:
    return f"{study.prefix}{cell.key}_s{seed}"


def run_cell(
    work: Path, warm: Path, cell: Cell, seed: int, *, pilot: bool, quick: bool, study: Study = BANDIT
) -> dict[str, Any]:
    """Train one (cell, seed) from the warm start, summarise it, keep the small files (the part)."""
    name = ("pilot_" if pilot else "") + run_name(cell, seed, study)

    def compute() -> dict[str, Any]:
        out = work / "runs" / name
        eval_seed, eval_n = (PILOT_EVAL_SEED, study.pilot_eval_n) if pilot else (EVAL_SEED, EVAL_N)
        flags = [*cell.flags(), "--seed", str(seed), "--train_seed", str(study.train_seed(seed))]
        flags += ["--eval_seed", str(eval_seed), "--num_eval_seeds", str(QUICK_EVAL_N if quick else eval_n)]
        flags += ["--max_steps", str(QUICK_STEPS if quick else study.steps), "--logging_steps", "1"]
        flags += ["--mi_every", str(study.mi_every), "--gradient_analysis_every", str(study.grad_every)]
        flags += ["--records_every", str(study.records_every), "--learning_curve", "", "--episode_gif", ""]
        head = [*study.job, "--model", str(warm), "--warm_start", "none"]
        cmd = [ol._bin(head[0]), *head[1:], *flags, "--output_dir", str(out), "--overwrite_output_dir"]
        timing = ol._timed(cmd, work / "runs" / f"{name}.log")
        result = {
            "name": name,
            "env": study.env,
            "cell": cell.key,
            "arm": cell.arm,
            "beta": cell.beta,
            "entropy_coef": cell.entropy,
            "seed": seed,
            "train_seed": study.train_seed(seed),
            "eval_seed": eval_seed,
            "pilot": pilot,
            "quick": quick,
            "command": " ".join(
                [*study.job, "--model", "WARM_START", "--warm_start", "none", *map(_quote, flags)]
            ),
            **timing,
            **summarise_run(out, study.collapse_stats),
        }
        # the run folder's bulky files go (model weights, episode records); the summary above keeps what is used
        shutil.rmtree(out / "final", ignore_errors=True)
        (out / "episodes.jsonl").unlink(missing_ok=True)
        return result

    return part(work / "runs" / f"{name}.json", compute)


def warm_start(work: Path, quick: bool) -> Path:
    """The main job's warm start (organism_learning.py's ``bandit`` part, run here once)."""
    ol.part_bandit(work, quick)
    return work / "bandit" / "warm_start" / "final"


def fl_warm_start(work: Path, quick: bool, given: Path | None = None) -> Path:
    """FrozenLake's shared warm start: ``given`` copied once into the work dir, or built there by the command of
    ``organism_learning.py``'s SFT run :data:`FL_WARM_RUN` (``llmgym-sft`` on its solver episodes)."""
    out = work / "frozenlake_warm_start"
    final = out / "final"
    if (final / "config.json").is_file():
        return final
    if given is not None:
        shutil.copytree(given, final, dirs_exist_ok=True)
        return final
    weight, steps = ol.FL_RUNS[FL_WARM_RUN]
    data = ol.frozenlake_data(work, quick)
    cmd = [ol._bin("llmgym-sft"), *ol.fl_sft_args(data, out, weight, 4 if quick else steps)]
    ol._timed(cmd, work / "frozenlake_warm_start.log")
    return final


def planned(quick: bool, study: Study = BANDIT) -> list[tuple[str, Cell, int]]:
    """Every (stage, cell, seed) of one env's study in run order (``quick``: its first stage on 2 seeds)."""
    out = []
    first = next(iter(study.stages))
    for stage, (cells, seeds) in study.stages.items():
        if quick and stage != first:
            continue
        for seed in QUICK_SEEDS if quick else seeds:
            out += [(stage, cell, seed) for cell in cells]
    return out


# ----------------------------------------------------------------------------------------------- aggregation
def load_runs(work: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The finished parts under ``work/runs``: (pilot runs, study runs)."""
    runs = []
    for p in sorted((work / "runs").glob("*.json")):
        try:
            runs.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue  # a part being written by a running invocation is written atomically; anything else is skipped
    return [r for r in runs if r.get("pilot")], [r for r in runs if not r.get("pilot")]


def _mean(values: Iterable[Any]) -> float | None:
    v = [x for x in values if _finite(x)]
    return float(np.mean(v)) if v else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _paired_delta(runs: dict[int, dict[str, Any]], ref: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    seeds = sorted(set(runs) & set(ref))
    if not seeds:
        return None
    d = [runs[s]["after"]["success"]["rate"] - ref[s]["after"]["success"]["rate"] for s in seeds]
    return {"mean": float(np.mean(d)), "ci": bootstrap_ci(d), "seeds": seeds}


def _env_of(run: dict[str, Any]) -> str:
    return str(run.get("env", ENV))


def aggregate_env(
    study: Study, pilot: list[dict[str, Any]], runs: list[dict[str, Any]], quick: bool = False
) -> dict[str, Any]:
    """One env's part of the result from its finished parts: ``arms`` (per cell) and ``summary`` (pilot, Spearman,
    gradient split, Table 8 comparison, runs done and missing, CPU)."""
    pilot = [r for r in pilot if _env_of(r) == study.env]
    runs = [r for r in runs if _env_of(r) == study.env]
    curves = [r["series"]["env/success"] for r in pilot]
    threshold = pilot_threshold(curves) if curves else None
    by_cell: dict[str, dict[int, dict[str, Any]]] = {}
    for r in runs:
        by_cell.setdefault(r["cell"], {})[int(r["seed"])] = r
    plan = planned(quick, study)
    planned_seeds: dict[str, list[int]] = {}
    for _, cell, seed in plan:
        planned_seeds.setdefault(cell.key, []).append(seed)
    cells = {c.key: c for _, c, _ in plan}
    arms: dict[str, Any] = {}
    for key, cell in cells.items():
        got = by_cell.get(key, {})
        seeds = sorted(got)
        rates = [got[s]["after"]["success"]["rate"] for s in seeds]
        ref = by_cell.get(cell.reference.key, {})
        ttt = (
            {s: steps_to(got[s]["steps"], got[s]["series"]["env/success"], threshold) for s in seeds}
            if threshold
            else {}
        )
        reached = [v for v in ttt.values() if v is not None]
        off_time = _mean(r["step_time_plain"] for r in ref.values())
        time_ = _mean(got[s]["step_time_plain"] for s in seeds)
        # the process CPU of a whole run (start-up and evaluations included): unlike the wall step time, it does not
        # move with the machine's load when arms ran in different stages
        off_cpu = _mean(r["cpu_seconds"] for r in ref.values())
        cpu = _mean(got[s]["cpu_seconds"] for s in seeds)
        filtered = cell.arm != "off"
        # collapsed: the run ended with (almost) no valid answer on the held-out seeds; its onset is the step
        # from which training rounds stayed so; a dip: some round fell so low and the run recovered
        ended = {s for s in seeds if got[s]["after"]["valid"]["rate"] <= COLLAPSE_VALID}
        onset = [
            collapse_step(got[s]["steps"], got[s]["series"]["env/valid_action_rate"]) if s in ended else None
            for s in seeds
        ]
        collapsed = [v for v in onset if v is not None]
        dips = sum(dipped(got[s]["series"]["env/valid_action_rate"]) for s in seeds if s not in ended)
        # a seed collapsed when its interval lies wholly below its own warm start's
        below = sum(
            got[s]["after"]["success"]["ci"][1] < got[s]["warm_start"]["success"]["ci"][0] for s in seeds
        )
        final_mi = [(got[s]["checkpoints"] or [{}])[-1] for s in seeds]
        first_mi = [(got[s]["checkpoints"] or [{}])[0] for s in seeds]
        arms[key] = {
            "arm": cell.arm,
            "label": ARM_LABELS[cell.arm],
            "flags": " ".join(cell.flags()),
            "beta": cell.beta,
            "entropy_coef": cell.entropy,
            "seeds": seeds,
            "planned_seeds": planned_seeds[key],
            "success": {
                "mean": _mean(rates),
                "ci": bootstrap_ci(rates),
                "per_seed": rates,
                "n_eval": got[seeds[0]]["after"]["success"]["n"] if seeds else None,
            },
            "valid": _mean(got[s]["after"]["valid"]["rate"] for s in seeds),
            "warm_start_success": _mean(got[s]["warm_start"]["success"]["rate"] for s in seeds),
            "delta_vs_no_filter": None if cell.arm == "off" else _paired_delta(got, ref),
            # the crossing's own effect: the same filter without KL and entropy bonus, paired by seed
            "delta_vs_plain": None
            if not (cell.beta or cell.entropy)
            else _paired_delta(got, by_cell.get(Cell(cell.arm).key, {})),
            "steps_to_threshold": {
                "threshold": threshold,
                "per_seed": [ttt.get(s) for s in seeds],
                "reached": len(reached),
                "median": float(np.median(reached)) if reached else None,
            },
            "step_time": {
                "mean": time_,
                "vs_no_filter": _ratio(time_, off_time) if filtered else None,
                "filter_cost_share": _mean(got[s]["filter_cost_share"] for s in seeds),
                "grad_analysis_seconds": _mean(got[s]["grad_seconds"] for s in seeds),
            },
            "kept_frac": _mean(_mean(got[s]["series"]["snr/kept_frac"]) for s in seeds),
            "group_var_cv": _mean(_mean(got[s]["series"]["snr/group_var_cv"]) for s in seeds),
            "collapse": {
                **{
                    k: _mean(got[s]["collapse"]["final_eval"].get(k) for s in seeds)
                    for k in _stat_keys(got[s]["collapse"]["final_eval"] for s in seeds)
                },
                "mi_zscore_first": _mean(c.get("mi") for c in first_mi),
                "mi_zscore_last": _mean(c.get("mi") for c in final_mi),
                "retrieval_acc_first": _mean(c.get("retrieval_acc") for c in first_mi),
                "retrieval_acc_last": _mean(c.get("retrieval_acc") for c in final_mi),
                "below_warm_start": below,
                "collapsed_seeds": len(ended),
                "recovered_dips": dips,
                "collapse_step_per_seed": onset,
                "collapse_step_median": float(np.median(collapsed)) if collapsed else None,
            },
            "cpu_seconds": cpu,
            "cpu_vs_no_filter": _ratio(cpu, off_cpu) if filtered else None,
            "wall_seconds": _mean(got[s]["wall_seconds"] for s in seeds),
        }
    points = [c for r in runs for c in r["checkpoints"]]
    spear: dict[str, Any] = {}
    for name in SPEARMAN_KEYS:
        per_run = [
            spearman([c[name] for c in r["checkpoints"]], [c["success"] for c in r["checkpoints"]])
            for r in runs
        ]
        per_run = [v for v in per_run if v is not None]
        spear[name] = {
            "metric": SPEARMAN_KEYS[name],
            "rho": spearman([c[name] for c in points], [c["success"] for c in points]),
            "n_checkpoints": sum(1 for c in points if _finite(c.get(name)) and _finite(c.get("success"))),
            "within_run_mean": _mean(per_run),
            "within_run_ci": bootstrap_ci(per_run),
            "runs": len(per_run),
        }
    spear["paper"] = {"mi": 0.39, "entropy": [-0.14, -0.11]}
    grad = [g for r in runs for g in r["grad"] if _finite(g["sqrt_reward_var"]) and _finite(g["task_norm"])]
    nonzero = [g for g in grad if g["sqrt_reward_var"] > 0]
    buckets: dict[int, list[dict[str, Any]]] = {}
    for g in grad:
        buckets.setdefault(g["bucket"], []).append(g)
    gradient = {
        "points": len(grad),
        "spearman_task_vs_sqrt_rv": spearman(
            [g["sqrt_reward_var"] for g in grad], [g["task_norm"] for g in grad]
        ),
        "zero_rv_points": len(grad) - len(nonzero),
        "zero_rv_task_norm_max": max(
            (g["task_norm"] for g in grad if g["sqrt_reward_var"] == 0), default=None
        ),
        "c_max": max((g["task_norm"] / g["sqrt_reward_var"] for g in nonzero), default=None),
        "c_median": float(np.median([g["task_norm"] / g["sqrt_reward_var"] for g in nonzero]))
        if nonzero
        else None,
        "c_p95": float(np.quantile([g["task_norm"] / g["sqrt_reward_var"] for g in nonzero], 0.95))
        if nonzero
        else None,
        "by_bucket": {
            str(b): {
                "sqrt_reward_var": _mean(g["sqrt_reward_var"] for g in gs),
                "task_norm": _mean(g["task_norm"] for g in gs),
                "reg_norm": _mean(g["reg_norm"] for g in gs),
                "n": len(gs),
            }
            for b, gs in sorted(buckets.items())
        },
    }
    helps = [
        {
            "cell": key,
            "std_over_mean": a["group_var_cv"],
            "delta": (a["delta_vs_no_filter"] or {}).get("mean"),
            "delta_ci": (a["delta_vs_no_filter"] or {}).get("ci"),
        }
        for key, a in arms.items()
        if a["arm"] != "off" and a["seeds"]
    ]
    done = sum(len(a["seeds"]) for a in arms.values())
    cpu = _mean(r["cpu_seconds"] for r in runs)
    missing = {
        key: sorted(set(a["planned_seeds"]) - set(a["seeds"]))
        for key, a in arms.items()
        if len(a["seeds"]) < len(a["planned_seeds"])
    }
    return {
        "arms": arms,
        "summary": {
            "steps": QUICK_STEPS if quick else study.steps,
            "mi_every": study.mi_every,
            "gradient_every": study.grad_every,
            "eval_seeds": {"first": EVAL_SEED, "n": QUICK_EVAL_N if quick else EVAL_N},
            "pilot": {
                "seeds": sorted({int(r["seed"]) for r in pilot}),
                "cells": sorted({r["cell"] for r in pilot}),
                "eval_seeds": {"first": PILOT_EVAL_SEED, "n": study.pilot_eval_n},
                "threshold": threshold,
                "rule": f"half the pilot runs' gain in training success, first {SMOOTH} steps to their peak "
                f"{SMOOTH}-step mean",
                "success": {r["name"]: r["after"]["success"]["rate"] for r in pilot},
            },
            "spearman": spear,
            "gradient": gradient,
            "when_filter_helps": helps,
            "runs_done": done,
            "runs_planned": len(plan),
            "missing": missing,
            "cpu_seconds_per_run": cpu,
            "cpu_seconds_total": float(sum(r["cpu_seconds"] for r in runs + pilot)),
            "wall_seconds_total": float(sum(r["wall_seconds"] for r in runs + pilot)),
            "missing_cpu_seconds": (cpu or 0.0) * sum(len(v) for v in missing.values()),
        },
    }


def _stat_keys(finals: Iterable[dict[str, Any]]) -> list[str]:
    """The numeric collapse measures the runs' final evaluations carry, in first-seen order."""
    keys: dict[str, None] = {}
    for f in finals:
        keys.update({k: None for k, v in f.items() if k != "episodes" and isinstance(v, (int, float))})
    return list(keys)


def aggregate(pilot: list[dict[str, Any]], runs: list[dict[str, Any]], quick: bool = False) -> dict[str, Any]:
    """The study's result (``ragen2_claims.json``) from the finished parts: per env ``envs[env]`` (its arms) and
    ``per_env[env]`` (its summary); at the top level ``runs_done`` and ``runs_planned`` over every env, RAGEN-2's
    Table 8 rows (``ragen2_table8``) and ``spearman`` with ``mi`` and ``entropy``: the study's first env's (``env``,
    Bandit), a copy of its ``per_env`` entry kept where the issue's consumers read it."""
    parts = {env: aggregate_env(study, pilot, runs, quick) for env, study in STUDIES.items()}
    first = parts[ENV]["summary"]["spearman"]
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "cpus": os.cpu_count(),
        "quick": quick,
        "envs": {env: p["arms"] for env, p in parts.items()},
        "per_env": {env: p["summary"] for env, p in parts.items()},
        "runs_done": sum(p["summary"]["runs_done"] for p in parts.values()),
        "runs_planned": sum(p["summary"]["runs_planned"] for p in parts.values()),
        "ragen2_table8": list(TABLE8),
        "spearman": {"env": ENV, "mi": first["mi"], "entropy": first["entropy"]},
    }


# ----------------------------------------------------------------------------------------------- plots
#: Plot file suffix and title per env.
PLOT_TAGS = {ENV: ("", "Bandit"), FL_ENV: ("_frozenlake", "FrozenLake 3x3")}


def plot(
    result: dict[str, Any], pilot: list[dict[str, Any]], runs: list[dict[str, Any]], out: Path
) -> list[Path]:
    """Per env with finished runs, four PNGs: success per arm (seeds and bootstrap mean), learning curves with the
    pilot's threshold, the gradient bound scatter, and MI / entropy against success over checkpoints."""
    paths = []
    for env, (tag, title) in PLOT_TAGS.items():
        env_runs = [r for r in runs if _env_of(r) == env]
        if env_runs:
            env_pilot = [r for r in pilot if _env_of(r) == env]
            summary = result["per_env"][env]
            paths += _plot_env(result["envs"][env], summary, env_pilot, env_runs, out, tag, title)
    return paths


def _plot_env(
    arms: dict[str, Any],
    summary: dict[str, Any],
    pilot: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    out: Path,
    tag: str,
    title: str,
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    keys = [k for k, a in arms.items() if a["seeds"]]

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for i, k in enumerate(keys):
        a = arms[k]
        ax.scatter([i] * len(a["success"]["per_seed"]), a["success"]["per_seed"], s=12, alpha=0.5, color="C0")
        ci = a["success"]["ci"] or [a["success"]["mean"]] * 2
        ax.errorbar(
            i + 0.15,
            a["success"]["mean"],
            yerr=[[a["success"]["mean"] - ci[0]], [ci[1] - a["success"]["mean"]]],
            fmt="o",
            color="C3",
        )
    ws = _mean(a["warm_start_success"] for a in arms.values() if a["seeds"])
    if ws is not None:
        ax.axhline(ws, color="grey", ls="--", lw=1, label="warm start")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xticks(range(len(keys)), keys, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("held-out success")
    ax.set_title(
        f"{title}, {summary['steps']} GRPO steps: each seed and the mean (95% bootstrap)", fontsize=9
    )
    fig.tight_layout()
    paths.append(out / f"ragen2_claims_success{tag}.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3.6))
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if r["beta"] == 0 and r["entropy_coef"] == 0:
            by_cell.setdefault(r["cell"], []).append(r)
    for i, (k, rs) in enumerate(sorted(by_cell.items())):
        # a run the filter stopped early (no group kept for 5 rounds) keeps its last value to the end
        n = max(len(r["series"]["env/success"]) for r in rs)
        curves = [trailing_mean([v or 0.0 for v in r["series"]["env/success"]]) for r in rs]
        curve = np.mean([c + [c[-1]] * (n - len(c)) for c in curves], axis=0)
        ax.plot(range(1, n + 1), curve, color=f"C{i}", label=f"{k} ({len(rs)} seeds)")
    for i, r in enumerate(pilot):
        label = "pilot runs" if i == 0 else "_nolegend_"
        ax.plot(
            r["steps"],
            trailing_mean(r["series"]["env/success"]),
            color="grey",
            lw=0.7,
            alpha=0.6,
            label=label,
        )
    if summary["pilot"]["threshold"] is not None:
        ax.axhline(summary["pilot"]["threshold"], color="k", ls=":", lw=1, label="threshold (pilot)")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training success ({SMOOTH}-step mean)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / f"ragen2_claims_curves{tag}.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    pts = [g for r in runs for g in r["grad"] if _finite(g["sqrt_reward_var"]) and _finite(g["task_norm"])]
    sc = ax.scatter(
        [g["sqrt_reward_var"] for g in pts],
        [g["task_norm"] for g in pts],
        c=[g["bucket"] for g in pts],
        cmap="viridis",
        s=10,
    )
    reg = [g for g in pts if _finite(g.get("reg_norm"))]
    if reg:
        ax.scatter(
            [g["sqrt_reward_var"] for g in reg],
            [g["reg_norm"] for g in reg],
            marker="x",
            color="C3",
            s=10,
            label="|g_reg| (KL + entropy)",
        )
        ax.legend(fontsize=8)
    c = summary["gradient"]["c_max"]
    if c:
        xs = np.linspace(0, max(g["sqrt_reward_var"] for g in pts), 20)
        ax.plot(xs, c * xs, "k:", lw=1)
    fig.colorbar(sc, label="bucket (1: lowest variance)")
    ax.set_xlabel("sqrt(Var(R|X)) of the bucket")
    ax.set_ylabel("|g_task|")
    fig.tight_layout()
    paths.append(out / f"ragen2_claims_gradient{tag}.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    pts_c = [c for r in runs for c in r["checkpoints"]]
    for ax, name in zip(axes, ("mi", "entropy")):
        xy = [(c[name], c["success"]) for c in pts_c if _finite(c.get(name)) and _finite(c.get("success"))]
        ax.scatter([p[0] for p in xy], [p[1] for p in xy], s=8, alpha=0.5)
        rho = summary["spearman"][name]["rho"]
        ax.set_title(
            f"{SPEARMAN_KEYS[name]}: Spearman {rho:+.2f}" if rho is not None else SPEARMAN_KEYS[name],
            fontsize=8,
        )
        ax.set_xlabel(SPEARMAN_KEYS[name])
        ax.set_ylabel("training success at the checkpoint")
    fig.tight_layout()
    paths.append(out / f"ragen2_claims_spearman{tag}.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


# ----------------------------------------------------------------------------------------------- main
def summary_lines(result: dict[str, Any]) -> list[str]:
    """The printed report, per env: each arm against no filter (ratios), the Spearman correlations, the bound."""
    lines = []
    for env, arms in result["envs"].items():
        summary = result["per_env"][env]
        lines.append(f"== {env}")
        for key, a in arms.items():
            s = a["success"]
            if not a["seeds"]:
                lines.append(f"{key}: no finished seeds")
                continue
            ci = s["ci"] or [math.nan, math.nan]
            d = a["delta_vs_no_filter"]
            dtxt = (
                f"; vs no filter {d['mean']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
                if d and d["ci"]
                else ""
            )
            t = a["step_time"]
            ttxt = f"; step time {t['vs_no_filter']:.2f}x no filter's" if t["vs_no_filter"] else ""
            lines.append(
                f"{key}: success {s['mean']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] over {len(a['seeds'])} seeds"
                f"{dtxt}{ttxt}"
            )
        for name in ("mi", "entropy"):
            sp = summary["spearman"][name]
            rho = "n/a" if sp["rho"] is None else f"{sp['rho']:+.2f}"
            lines.append(f"Spearman({sp['metric']}, success) = {rho} over {sp['n_checkpoints']} checkpoints")
        g = summary["gradient"]
        if g["points"]:
            lines.append(
                f"|g_task| vs sqrt(Var(R|X)): Spearman {g['spearman_task_vs_sqrt_rv']}, C max {g['c_max']}, "
                f"zero-variance buckets' max |g_task| {g['zero_rv_task_norm_max']}"
            )
        lines.append(f"runs done {summary['runs_done']} of {summary['runs_planned']}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--work-dir", type=Path, required=True, help="runs and finished parts (resumable)")
    ap.add_argument(
        "--quick", action="store_true", help=f"{QUICK_STEPS} steps, 2 seeds, core arms: checks the pipeline"
    )
    ap.add_argument(
        "--publish",
        action="store_true",
        help="write docs/data/ragen2_claims.json and docs/img/ragen2_claims_*.png",
    )
    ap.add_argument("--aggregate-only", action="store_true", help="run nothing: aggregate the finished parts")
    known = [stage for study in STUDIES.values() for stage in study.stages]
    ap.add_argument("--stages", default=",".join(known), help="stages to run, in order (default: all)")
    ap.add_argument(
        "--fl-warm-start",
        type=Path,
        help="FrozenLake's warm start to copy into the work dir (default: built there by llmgym-sft)",
    )
    args = ap.parse_args(argv)
    if args.quick and args.publish:
        ap.error("--quick results are never published")
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(known)
    if unknown:
        ap.error(f"unknown stages {sorted(unknown)}; known: {', '.join(known)}")
    work = args.work_dir
    (work / "runs").mkdir(parents=True, exist_ok=True)
    if not args.aggregate_only:
        for study in STUDIES.values():
            if not set(stages) & set(study.stages):
                continue
            if study is BANDIT:
                warm = warm_start(work, args.quick)
            else:
                warm = fl_warm_start(work, args.quick, args.fl_warm_start)
            for cell in study.pilot_cells:
                for seed in study.pilot_seeds[:1] if args.quick else study.pilot_seeds:
                    run_cell(work, warm, cell, seed, pilot=True, quick=args.quick, study=study)
            for stage, cell, seed in planned(args.quick, study):
                if stage not in stages:
                    continue
                try:
                    r = run_cell(work, warm, cell, seed, pilot=False, quick=args.quick, study=study)
                except SystemExit as e:  # one failed run (its log names why) leaves the others to run
                    print(f"{stage} {run_name(cell, seed, study)}: FAILED: {e}", flush=True)
                    continue
                print(
                    f"{stage} {r['name']}: success {r['after']['success']['rate']:.3f}, "
                    f"{r['cpu_seconds']:.0f} CPU-s",
                    flush=True,
                )
    pilot, runs = load_runs(work)
    result = aggregate(pilot, runs, args.quick)
    text = json.dumps(result, indent=1) + "\n"
    (work / "ragen2_claims.json").write_text(text, encoding="utf-8")
    for line in summary_lines(result):
        print(line)
    if args.publish:
        PUBLISHED.write_text(text, encoding="utf-8")
        for p in plot(result, pilot, runs, PLOTS):
            print(f"wrote {p}")
        print(f"wrote {PUBLISHED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
