"""A run's learning curve: training success per logged step, every evaluation with its Wilson interval, and the
random valid-action baseline's interval on the same seeds, drawn to a PNG at the end of ``llmgym-train``.

:func:`curve` is pure (the trainer's log history and ``eval_report.json`` in, plotted series out); :func:`plot`
only draws it. The episode GIF of the same run (:func:`episode_gif`) replays one episode of the last evaluation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llm_gym.core.checks import is_number


def curve(log_history: Sequence[Mapping[str, Any]], report: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"train": [(step, success), ...], "evals": [(step, rate, lo, hi), ...], "random": (lo, hi) | None}``
    from TRL's log history (rows with ``env/success``) and the run's evaluation report (``evals`` and
    ``baseline.random``, either may be missing). After a warm start, the step-0 evaluation is the warm start's."""
    train = [
        (int(r["step"]), float(r["env/success"]))
        for r in log_history
        if is_number(r.get("step")) and is_number(r.get("env/success"))
    ]
    evals: list[tuple[int, float, float, float]] = []
    random_ci = None
    if report:
        for ev in report.get("evals") or []:
            s = ev.get("success") or {}
            if is_number(ev.get("step")) and is_number(s.get("rate")) and len(s.get("ci") or ()) == 2:
                evals.append((int(ev["step"]), float(s["rate"]), float(s["ci"][0]), float(s["ci"][1])))
        rnd = ((report.get("baseline") or {}).get("random") or {}).get("ci")
        random_ci = (float(rnd[0]), float(rnd[1])) if rnd and len(rnd) == 2 else None
    return {"train": train, "evals": evals, "random": random_ci}


def plot(data: Mapping[str, Any], out: str | os.PathLike, title: str = "") -> str:
    """Draw :func:`curve`'s series to ``out`` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    if data["random"]:
        lo, hi = data["random"]
        ax.axhspan(lo, hi, color="0.85", label="random valid moves (95% CI)")
    if data["train"]:
        xs, ys = zip(*data["train"])
        ax.plot(xs, ys, color="tab:blue", alpha=0.6, label="training success (sampled)")
    if data["evals"]:
        steps, rates, los, his = zip(*data["evals"])
        err = [[r - lo for r, lo in zip(rates, los)], [hi - r for r, hi in zip(rates, his)]]
        ax.errorbar(
            steps, rates, yerr=err, fmt="o-", color="tab:red", capsize=4, label="held-out success (95% CI)"
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title or "learning curve")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return str(out)


def last_eval_episode(records: Sequence[Any]) -> Any | None:
    """The first episode of the last evaluation among ``records`` (episode records with ``meta.mode``/``step``)."""
    evals = [
        r for r in records if (r.meta or {}).get("mode") == "eval" and is_number((r.meta or {}).get("step"))
    ]
    if not evals:
        return None
    last = max(r.meta["step"] for r in evals)
    return next(r for r in evals if r.meta["step"] == last)


def episode_gif(records_path: str | os.PathLike, out: str | os.PathLike) -> str | None:
    """Render the last evaluation's first episode of ``records_path`` (the run's ``episodes.jsonl``) to ``out``;
    ``None`` when there is no evaluation episode. Needs the ``render`` extra (pygame)."""
    from llm_gym.agent.records import read_records
    from llm_gym.render.export import export_episode

    record = last_eval_episode(list(read_records(Path(records_path))))
    if record is None:
        return None
    export_episode(record, Path(out), hold_last=2)
    return str(out)
