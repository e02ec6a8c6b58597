"""MkDocs hook: the tables of the RAGEN-2 claims study from ``docs/data/ragen2_claims.json`` (written by
``benchmarks/ragen2_claims.py --publish``).

A page writes a marker on a line of its own and the build replaces it: ``<!-- ragen2-claims-arms -->`` (success,
steps to the threshold, step time per arm), ``-collapse`` (answer concentration, MI-ZScore, retrieval accuracy),
``-spearman`` (MI and entropy against success, beside the paper's), ``-gradient`` (|g_task| per reward-variance
bucket), ``-table8`` (Std(RV)/Mean(RV) against the filter's effect for every env, beside RAGEN-2 Table 8) and
``-status`` (what ran, what is missing and the CPU it needs) render Bandit's part; ``-fl-arms``,
``-fl-crossings``, ``-fl-collapse``, ``-fl-spearman``, ``-fl-gradient`` and ``-fl-status`` the same for
FrozenLake's.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "data" / "ragen2_claims.json"
ENV = "llmgym/Bandit-v0"
FL_ENV = "llmgym/CoordFrozenLake-v0"
ENV_LABELS = {ENV: "Bandit", FL_ENV: "FrozenLake"}


def _marker(name: str) -> re.Pattern[str]:
    return re.compile(rf"^<!--\s*ragen2-claims-{name}\s*-->[ \t]*$", flags=re.M)


def _f(v: Any, fmt: str = ".3f") -> str:
    return "–" if v is None else format(v, fmt)


def _ci(ci: list[float] | None, fmt: str = ".3f") -> str:
    return "" if not ci else f" [{format(ci[0], fmt)}, {format(ci[1], fmt)}]"


def _arms(data: dict[str, Any], env: str = ENV) -> dict[str, Any]:
    return data["envs"].get(env, {})


def _summary(data: dict[str, Any], env: str = ENV) -> dict[str, Any]:
    """One env's summary (pilot, Spearman, gradient split, runs)."""
    return data["per_env"][env]


def arms_table(data: dict[str, Any], env: str = ENV) -> str:
    """Per arm: held-out success (mean over seeds, bootstrap interval), the paired difference to no filter, steps to
    the pilot's threshold, step time and its ratio to no filter's, the kept share of groups and valid answers."""
    thr = _summary(data, env)["pilot"]["threshold"]
    lines = [
        f"| arm | seeds | held-out success, mean [95% bootstrap] | vs no filter (paired) | steps to {_f(thr, '.2f')} "
        "(median, reached) | step time s (vs no filter) | CPU-s a run (vs no filter) | filter's own cost | groups kept "
        "| valid |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, a in _arms(data, env).items():
        s, d, t = a["success"], a["delta_vs_no_filter"], a["steps_to_threshold"]
        if not a["seeds"]:
            lines.append(f"| `{key}` | 0 of {len(a['planned_seeds'])} | not run | | | | | | | |")
            continue
        delta = "" if d is None else f"{d['mean']:+.3f}{_ci(d['ci'], '+.3f')}"
        ratio = a["step_time"]["vs_no_filter"]
        time_ = _f(a["step_time"]["mean"], ".2f") + ("" if ratio is None else f" ({ratio:.2f}x)")
        cpu_ratio = a["cpu_vs_no_filter"]
        cpu = _f(a["cpu_seconds"], ".0f") + ("" if cpu_ratio is None else f" ({cpu_ratio:.2f}x)")
        steps = f"{_f(t['median'], '.0f')} ({t['reached']}/{len(a['seeds'])})"
        kept = _f(a["kept_frac"], ".2f") if a["arm"] != "off" else "1"
        share = a["step_time"]["filter_cost_share"]
        cost = "–" if share is None or a["arm"] == "off" else f"{100 * share:.3f}%"
        lines.append(
            f"| `{key}` | {len(a['seeds'])} | **{_f(s['mean'])}**{_ci(s['ci'])} | {delta} | {steps} | {time_} | "
            f"{cpu} | {cost} | {kept} | {_f(a['valid'], '.2f')} |"
        )
    ws = [a["warm_start_success"] for a in _arms(data, env).values() if a["seeds"]]
    if ws:
        lines += ["", f"The warm start on the same held-out seeds: {sum(ws) / len(ws):.3f}."]
    return "\n".join(lines)


def crossings_table(data: dict[str, Any], env: str = ENV) -> str:
    """Each KL / entropy-bonus crossing against the same filter without it (paired by seed)."""
    lines = [
        "| arm | seeds | held-out success | vs the same filter without KL / entropy bonus (paired) |",
        "|---|---|---|---|",
    ]
    for key, a in _arms(data, env).items():
        d = a.get("delta_vs_plain")
        if not (a["beta"] or a["entropy_coef"]) or not a["seeds"]:
            continue
        delta = "" if d is None else f"{d['mean']:+.3f}{_ci(d['ci'], '+.3f')}"
        lines.append(
            f"| `{key}` | {len(a['seeds'])} | {_f(a['success']['mean'])}{_ci(a['success']['ci'])} | {delta} |"
        )
    return "\n".join(lines)


#: The final evaluation's concentration columns per env: (header, key, format).
COLLAPSE_COLUMNS = {
    ENV: (
        ("top answer share", "top_answer_share", ".3f"),
        ("answer MI (bits)", "answer_mi_bits", ".2f"),
        ("first-listed arm", "first_listed_share", ".2f"),
    ),
    FL_ENV: (
        ("top first-move share", "top_move_share", ".3f"),
        ("first move's MI with the goal's direction (bits)", "move_mi_bits", ".2f"),
        ("first moves toward the goal", "toward_goal_share", ".2f"),
    ),
}


def collapse_table(data: dict[str, Any], env: str = ENV) -> str:
    """Per arm: the final evaluation's answer (Bandit) or first-move (FrozenLake) concentration, MI-ZScore and
    retrieval accuracy at the first and the last checkpoint, the seeds that ended below their warm start's interval,
    that ended collapsed, and the recovered dips."""
    cols = COLLAPSE_COLUMNS[env]
    lines = [
        "| arm | "
        + " | ".join(h for h, _, _ in cols)
        + " | MI-ZScore first -> last | retrieval acc. first -> last | seeds below warm start | "
        "seeds collapsed (median onset step) | recovered dips |",
        "|---|" + "---|" * (len(cols) + 5),
    ]
    for key, a in _arms(data, env).items():
        if not a["seeds"]:
            continue
        c = a["collapse"]
        lines.append(
            f"| `{key}` | "
            + " | ".join(_f(c.get(k), fmt) for _, k, fmt in cols)
            + f" | {_f(c['mi_zscore_first'], '.4f')} -> {_f(c['mi_zscore_last'], '.4f')} | "
            f"{_f(c['retrieval_acc_first'], '.2f')} -> {_f(c['retrieval_acc_last'], '.2f')} | "
            f"{c['below_warm_start']} of {len(a['seeds'])} | {c['collapsed_seeds']} of {len(a['seeds'])}"
            + ("" if c["collapse_step_median"] is None else f" ({c['collapse_step_median']:.0f})")
            + f" | {c.get('recovered_dips', 0)} |"
        )
    return "\n".join(lines)


def spearman_table(data: dict[str, Any], env: str = ENV) -> str:
    """Spearman correlation with success over checkpoints: pooled, and the mean of the per-run correlations."""
    sp = _summary(data, env)["spearman"]
    paper = {"mi": "+0.39 (trajectory MI-ZScore)", "entropy": "-0.11 to -0.14 (reasoning entropy)"}
    lines = [
        "| proxy | Spearman with success, pooled (checkpoints) | per run: mean [95% bootstrap] (runs) | RAGEN-2 Fig. 8 |",
        "|---|---|---|---|",
    ]
    for name, s in sp.items():
        if name == "paper":
            continue
        lines.append(
            f"| `{s['metric']}` | {_f(s['rho'], '+.2f')} ({s['n_checkpoints']}) | "
            f"{_f(s['within_run_mean'], '+.2f')}{_ci(s['within_run_ci'], '+.2f')} ({s['runs']}) | {paper.get(name, '')} |"
        )
    return "\n".join(lines)


def gradient_table(data: dict[str, Any], env: str = ENV) -> str:
    """Mean |g_task| (and |g_reg| where a regulariser is on) per reward-variance bucket, and the bound's constant."""
    sm = _summary(data, env)
    g = sm["gradient"]
    lines = [
        "| bucket (1: lowest Var(R\\|X)) | mean sqrt(Var(R\\|X)) | mean \\|g_task\\| | mean \\|g_reg\\| | points |",
        "|---|---|---|---|---|",
    ]
    for b, v in g["by_bucket"].items():
        lines.append(
            f"| {b} | {_f(v['sqrt_reward_var'])} | {_f(v['task_norm'], '.4f')} | {_f(v['reg_norm'], '.4f')} | {v['n']} |"
        )
    rho = g["spearman_task_vs_sqrt_rv"]
    ran = [a for a in _arms(data, env).values() if a.get("seeds")]
    ga = [a["step_time"]["grad_analysis_seconds"] for a in ran if a["step_time"]["grad_analysis_seconds"]]
    st = [a["step_time"]["mean"] for a in ran if a["step_time"]["mean"]]
    cost = (
        f" One analysis took {sum(ga) / len(ga):.2f} s on average against a {sum(st) / len(st):.2f} s training "
        f"step ({sum(ga) / len(ga) / (sum(st) / len(st)):.2f}x a step, on one round in {sm.get('gradient_every', 10)})."
        if ga and st
        else ""
    )
    lines += [
        "",
        f"Over {g['points']} bucket points: Spearman(|g_task|, sqrt(Var(R|X))) {_f(rho, '+.2f')}; the ratio "
        f"|g_task| / sqrt(Var(R|X)) has median {_f(g['c_median'], '.3f')}, 95th percentile "
        f"{_f(g.get('c_p95'), '.3f')} and maximum {_f(g['c_max'], '.3f')}; "
        f"the {g['zero_rv_points']} zero-variance bucket points have |g_task| at most {_f(g['zero_rv_task_norm_max'], '.2g')}."
        + cost,
    ]
    return "\n".join(lines)


def table8(data: dict[str, Any]) -> str:
    """Std(RV)/Mean(RV) (mean over rounds and seeds) against the filter's effect, beside RAGEN-2 Table 8."""
    lines = ["| setting | Std(RV)/Mean(RV) | filter's effect on success (points) |", "|---|---|---|"]
    for env, label in ENV_LABELS.items():
        if env not in data["envs"]:
            continue
        for r in _summary(data, env)["when_filter_helps"]:
            pts = None if r["delta"] is None else 100 * r["delta"]
            ci = None if not r["delta_ci"] else [100 * x for x in r["delta_ci"]]
            lines.append(
                f"| organism {label}, `{r['cell']}` | {_f(r['std_over_mean'], '.2f')} | "
                f"{_f(pts, '+.1f')}{_ci(ci, '+.1f')} |"
            )
    for r in data["ragen2_table8"]:
        lines.append(
            f"| RAGEN-2 Table 8: {r['setting']} | {r['std_over_mean']:.2f} | {r['delta'].rstrip('%')} |"
        )
    return "\n".join(lines)


def status(data: dict[str, Any], env: str = ENV) -> str:
    """What ran and what is missing, with the CPU the missing runs need at the measured cost per run."""
    sm = _summary(data, env)
    cpu = sm["cpu_seconds_per_run"]
    label = ENV_LABELS[env]
    lines = [
        f"Recorded {data['date']} ({data['cpus']} cores, shared): {label}, {sm['runs_done']} of "
        f"{sm['runs_planned']} planned runs, {sm['steps']} GRPO steps each, {_f(cpu, '.0f')} CPU-s per run on "
        f"average; {sm['cpu_seconds_total'] / 3600:.2f} CPU-hours and {sm['wall_seconds_total'] / 3600:.2f} hours "
        "wall in all (pilot included, niced, beside other work)."
    ]
    if sm["missing"]:
        missing = "; ".join(f"`{k}` seeds {', '.join(map(str, v))}" for k, v in sm["missing"].items())
        need = (
            f": about {sm['missing_cpu_seconds'] / 3600:.1f} CPU-hours more at the measured cost"
            if sm["missing_cpu_seconds"]
            else ""
        )
        lines.append(f"**Missing:** {missing}{need} (rerun the same command; finished parts are kept).")
    else:
        lines.append(f"Every planned {label} run finished.")
    return "\n\n".join(lines)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "arms": arms_table,
    "crossings": crossings_table,
    "collapse": collapse_table,
    "spearman": spearman_table,
    "gradient": gradient_table,
    "table8": table8,
    "status": status,
    **{
        f"fl-{name}": functools.partial(render, env=FL_ENV)
        for name, render in (
            ("arms", arms_table),
            ("crossings", crossings_table),
            ("collapse", collapse_table),
            ("spearman", spearman_table),
            ("gradient", gradient_table),
            ("status", status),
        )
    },
}


def expand(markdown: str, data_file: Path = DATA) -> str:
    found = {name: render for name, render in RENDERERS.items() if _marker(name).search(markdown)}
    if not found:
        return markdown
    data = json.loads(data_file.read_text(encoding="utf-8"))
    for name, render in found.items():
        markdown = _marker(name).sub(lambda _, render=render: render(data), markdown)
    return markdown


def on_page_markdown(markdown: str, **kwargs) -> str:
    return expand(markdown)
