"""``llmgym-train --warm_start random|expert|PATH``: supervised fine-tuning first, then RL, in one command.

1. **Data**: episodes of the random valid-action policy (``random``: the answer format without a policy), of the
   solver (``expert``; ``--warm_start_expert_fraction f`` mixes in random episodes, a partial expert), played on
   seeds ``warm_start_seed ..`` in the run's own chat format and written to ``output_dir/warm_start/data.jsonl``;
   or ``llmgym export`` output at PATH. Data whose seeds overlap the evaluation seeds is refused (exit 2), before
   any model loads.
2. **Base evaluation**: the model before the warm start, on the evaluation seeds (the run's chat, temperature and
   limits; played through :class:`~llm_gym.trainer.policies.HFPolicy`, as ``llmgym-eval``).
3. **Warm start**: :func:`llm_gym.trainer.sft.train_sft` into ``output_dir/warm_start`` (a LoRA warm start is
   merged, so RL can put its own adapter on it).
4. **RL** from ``output_dir/warm_start/final``: ``llmgym-train``'s own run, whose evaluation before training is
   the warm start's and after training the RL model's. With ``beta > 0`` the KL reference is the warm start:
   TRL builds it from the model RL starts from (a frozen copy; with LoRA, the model with the adapter disabled,
   and a LoRA warm start is merged into that model), and logs the term as ``kl``.

The three evaluations, on the same seeds, are printed beside the random valid-action policy, the best constant
answer and the optimum (Wilson 95% intervals) and added to ``output_dir/eval_report.json`` (``warm_start``,
``constant_actions``). With ``--resume`` a finished warm start (``warm_start/final/llmgym_sft.json``) is reused,
and the base evaluation when its settings are unchanged (:func:`base_evaluation`).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Subfolder of output_dir that holds the warm start (data, base evaluation, SFT run and its final model).
WARM_START_DIR = "warm_start"
BASE_EVAL_FILE = "base_eval.json"
BASE_EVAL_SETTINGS_FILE = "base_eval_settings.json"  # what the saved base evaluation was run with


def evaluate_model(
    model: str,
    env_id: str,
    seeds: Sequence[int],
    *,
    env_kwargs: dict[str, Any],
    chat: Any,
    temperature: float,
    max_new_tokens: int,
    samples: int = 1,
    dtype: str = "float32",
    batch_size: int = 32,
    device: str | None = None,
    records_path: str | Path | None = None,
) -> dict[str, Any]:
    """Play ``seeds`` (``samples`` episodes each) with ``model`` through :class:`HFPolicy` and return
    :func:`~llm_gym.agent.baselines.outcome_summary` plus the action counts of valid replies; the records go to
    ``records_path`` when given. The torch seed is fixed, so every model evaluated sees the same sampling stream."""
    import torch
    from llm_gym.trainer.policies import HFPolicy, SamplingParams

    from llm_gym.agent.baselines import outcome_summary
    from llm_gym.agent.records import write_records
    from llm_gym.agent.rollout import rollout

    torch.manual_seed(0)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    policy = HFPolicy.from_pretrained(
        model,
        SamplingParams(temperature, 1.0, max_new_tokens),
        batch_size=batch_size,
        device=device,
        dtype=dtype,
    )
    records = rollout(env_id, list(seeds), policy, group_size=samples, env_kwargs=env_kwargs, chat=chat)
    if records_path is not None:
        write_records(records_path, records, append=False)
    del policy
    gc.collect()
    return {**outcome_summary(records), "actions": action_counts(records)}


def action_counts(records: Sequence[Any]) -> dict[str, int]:
    """How often each action was executed in the valid turns of ``records`` (the template a collapsed model
    plays shows as one action taking nearly all)."""
    counts: dict[str, int] = {}
    for r in records:
        for t in r.turns:
            if t.info.get("action_is_valid", False):
                for a in t.info.get("actions") or []:
                    counts[str(a)] = counts.get(str(a), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def warm_start_rows(config: Any) -> tuple[Sequence[dict[str, Any]], str]:
    """The warm start's data rows and a description of where they come from."""
    from llm_gym.trainer.sft import load_rows

    fraction = config.warm_start_fraction
    if fraction is None:
        return load_rows(config.warm_start), f"data {config.warm_start}"
    from llm_gym.agent.export import export_episodes

    seeds = range(config.warm_start_seed, config.warm_start_seed + config.warm_start_episodes)
    result = export_episodes(
        config.env,
        seeds,
        env_kwargs=config.make_env_kwargs(),
        chat=config.chat_format(),
        expert_fraction=fraction,
        rng_seed=int(config.seed),
    )
    if not result.rows:
        raise ValueError(
            f"--warm_start {config.warm_start}: no episode of seeds {seeds.start}..{seeds.stop - 1}"
        )
    what = "random valid-action" if fraction == 0 else f"expert (fraction {fraction:g})"
    return result.rows, f"{what} episodes on seeds {seeds.start}..{seeds.stop - 1}"


def check_rows(config: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Refuse malformed rows, data from another environment, or played on the run's evaluation seeds
    (``DataError``)."""
    from llm_gym.trainer.sft import DataError, check_seeds
    from llm_gym.trainer.sft import check_rows as check_data

    settings = check_data(rows)
    if settings["env"] != config.env:
        raise DataError(
            f"the warm-start data is for {settings['env'] or 'several environments'}, not {config.env}"
        )
    check_seeds(rows, eval_seeds(config))


def chat_differences(config: Any, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The chat settings (config names) in which the rows, as rendered, differ from the run's: a warm start on
    them learns a chat that RL and the evaluations do not show. Empty when the rows record no chat."""
    from llm_gym.trainer.sft import data_settings

    differ = chat_mismatch(config, data_settings(rows)["chat"])
    return [f"{k} (data {d!r}, run {r!r})" for k, (d, r) in differ.items()]


def chat_mismatch(config: Any, recorded: Mapping[str, Any] | None) -> dict[str, tuple[Any, Any]]:
    """Setting -> (data's, run's) for each chat setting in which data rendered with ``recorded`` (config names,
    as ``llmgym-sft`` records them) differs from the run's; empty when nothing is recorded."""
    from llm_gym.agent.chat import CHAT_SETTINGS, chat_format_from_settings, chat_settings

    if not recorded:
        return {}
    data, run = chat_settings(chat_format_from_settings(dict(recorded))), chat_settings(config.chat_format())
    if not data["one_shot_example"] and not run["one_shot_example"]:
        data["demonstration"] = run["demonstration"]  # no demonstration shown: what it would answer is moot
    return {k: (data[k], run[k]) for k in CHAT_SETTINGS if data[k] != run[k]}


def model_chat_warnings(config: Any, model: str) -> list[str]:
    """A warning when ``model`` is an ``llmgym-sft`` output whose data was rendered in another chat than this
    run's (e.g. the CPU settings' format demonstration over data exported without one): the policy then meets
    prompts it never saw, and its success can fall by half (the organism on FrozenLake: 0.63 -> 0.33)."""
    from llm_gym.trainer.sft import SFT_FILE

    try:
        recorded = json.loads((Path(model) / SFT_FILE).read_text(encoding="utf-8"))["data"]["chat"]
        differ = chat_mismatch(config, recorded)
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
    ):  # not an llmgym-sft folder, or one without a chat record
        return []
    if not differ:
        return []
    settings = "; ".join(f"{k} (data {d!r}, run {r!r})" for k, (d, r) in differ.items())
    flags = " ".join(f"--{k} {d}" for k, (d, _) in differ.items())
    return [
        f"--model {model} was fine-tuned on data rendered in another chat than this run's: {settings}; "
        f"pass {flags} to show it the chat it learned"
    ]


def eval_seeds(config: Any) -> range:
    return range(config.eval_seed, config.eval_seed + config.num_eval_seeds)


def sft_config(config: Any, folder: Path, data: Path) -> Any:
    """The ``LLMGymSFTConfig`` of the warm start: its own steps, rate and batch; the run's precision, device,
    gradient checkpointing, seed, LoRA and evaluation seeds."""
    from llm_gym.trainer.config import LLMGymSFTConfig
    from llm_gym.trainer.lora import LORA_FIELDS

    micro = config.warm_start_micro_batch_size
    return LLMGymSFTConfig(
        output_dir=str(folder),
        data=str(data),
        eval_seed=config.eval_seed,
        num_eval_seeds=config.num_eval_seeds,
        learning_rate=config.warm_start_learning_rate,
        lr_scheduler_type=config.warm_start_lr_scheduler_type,
        format_loss_weight=config.warm_start_format_loss_weight,
        max_steps=config.warm_start_max_steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=config.warm_start_batch_size // micro,
        bf16=bool(config.bf16),
        use_cpu=bool(config.use_cpu),
        gradient_checkpointing=bool(config.gradient_checkpointing),
        seed=int(config.seed),
        logging_steps=max(1, config.warm_start_max_steps // 20),
        disable_tqdm=bool(config.disable_tqdm),
        **{name: getattr(config, name) for name in LORA_FIELDS if hasattr(config, name)},
    )


def run_with_warm_start(
    rl_run: Callable[[Any, dict[str, Any]], int], config: Any, meta: dict[str, Any], log=print
) -> int:
    """Warm start, then ``rl_run(config, meta)`` (``llmgym-train``'s run) from the warm-started model; returns
    its exit code. Bad data is a usage error (exit 2) before any model loads."""
    from llm_gym.trainer.models import ModelError
    from llm_gym.trainer.sft import SFT_FILE, DataError, train_sft

    from llm_gym.agent.export import write_jsonl

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        print(
            "llmgym-train: error: --warm_start runs in one process; with several, run llmgym-sft first and pass its "
            "output_dir/final as --model",
            file=sys.stderr,
        )
        return 2
    out = Path(config.output_dir)
    folder = out / WARM_START_DIR
    cpu_layer = dict(meta.get("layers") or ()).get("cpu settings") or {}
    if config.one_shot_example and cpu_layer.get("one_shot_example"):
        # The CPU settings' demonstration is for an untrained model; the warm start teaches the format, and a
        # warm-started model answers validly without it (docs/learning-study.md).
        from llm_gym.trainer.output import write_run_file

        config.one_shot_example = False
        write_run_file(out, config)
        log("llmgym-train: --warm_start: no format demonstration (pass --one_shot_example True to keep one)")
    if meta.get("overwrite_output_dir") and folder.is_dir():
        shutil.rmtree(folder)
    done = (folder / "final" / SFT_FILE).is_file()
    if not done and (folder / "final").exists():
        shutil.rmtree(folder / "final")  # a warm start killed while saving: train it again
    try:
        rows, what = warm_start_rows(config)
        check_rows(config, rows)
    except (DataError, ValueError) as e:
        print(f"llmgym-train: error: --warm_start: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    differ = chat_differences(config, rows)
    if differ:
        log(
            "llmgym-train: warning: --warm_start: the data was rendered in another chat than this run's: "
            f"{'; '.join(differ)}; the warm start learns a chat that RL and the evaluations do not show"
        )
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data.jsonl"
    seeds = eval_seeds(config)
    base = None
    if len(seeds) and config.eval_before_after:
        base = base_evaluation(config, str(meta["model"]), seeds, folder, log)
    if done:
        log(f"llmgym-train: reusing the warm start in {folder / 'final'}")
        sft = json.loads((folder / "final" / SFT_FILE).read_text(encoding="utf-8"))
    else:
        write_jsonl(rows, data)
        log(f"llmgym-train: warm start on {len(rows)} {what} ({data})")
        try:
            sft = train_sft(
                sft_config(config, folder, data),
                str(meta["model"]),
                rows,
                merge_lora=bool(config.use_peft),
                log=log,
            )
        except (DataError, ModelError) as e:
            print(f"llmgym-train: error: --warm_start: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        gc.collect()
    meta = {**meta, "model": str(folder / "final")}
    if float(getattr(config, "beta", 0.0) or 0.0) != 0.0:
        # TRL builds the reference from the model RL starts from (a copy of it, or with LoRA the model with the
        # adapter disabled): the KL term pulls towards the warm start, not the base model
        log(f"llmgym-train: KL (beta {config.beta:g}, logged as kl) to the warm start {folder / 'final'}")
    rc = rl_run(config, meta)
    if rc == 0 and base is not None:
        report_three(config, base, sft, log)
    return rc


def report_three(config: Any, base: dict[str, Any], sft: dict[str, Any], log=print) -> dict[str, Any] | None:
    """Add the base model's evaluation, the warm start's summary and the constant-answer baselines to
    ``eval_report.json`` and print base, warm start and RL beside the baselines."""
    from llm_gym.trainer.defaults import EVAL_REPORT_FILE

    from llm_gym.agent.baselines import NoBaseline, constant_action_success, format_outcomes, format_rate

    path = Path(config.output_dir) / EVAL_REPORT_FILE
    if not path.is_file():
        return None
    report = json.loads(path.read_text(encoding="utf-8"))
    evals = report.get("evals") or []
    if len(evals) < 2:
        return None
    seeds = list(eval_seeds(config))
    try:
        const = constant_action_success(config.env, seeds, config.make_env_kwargs())
    except NoBaseline:
        const = None
    report["constant_actions"] = const
    report["warm_start"] = {
        "base": base,
        "warm_start": evals[0],
        "after_rl": evals[-1],
        "sft": {
            k: sft.get(k)
            for k in ("data", "settings", "steps", "train_seconds", "tokens_per_second", "loss_last")
        },
    }
    _write_json(path, report)
    n = len(seeds)
    for label, ev in (("base model", base), ("warm start", evals[0]), ("after RL", evals[-1])):
        log(f"llmgym-train: {label:<10} ({n} seeds): {format_outcomes(ev)}")
    parts = []
    b = report.get("baseline") or {}
    if b.get("random"):
        parts.append(f"random valid {format_rate(b['random'])}")
    if const:
        action, rate = max(const.items(), key=lambda kv: kv[1]["rate"])
        parts.append(f"best constant (always {action}) {format_rate(rate)}")
    if b.get("optimum"):
        parts.append(f"optimum {format_rate(b['optimum'])}")
    if parts:
        log(f"llmgym-train: baselines on the same seeds and limits: {', '.join(parts)}")
    return report


def base_evaluation(
    config: Any, model: str, seeds: Sequence[int], folder: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The base model's evaluation on ``seeds``, saved in ``folder``; a resumed run reuses the saved one only when
    everything it depends on (model, env and its kwargs, seeds, chat, sampling, precision) is unchanged."""
    key = json.loads(
        json.dumps(
            {
                "model": model,
                "env": config.env,
                "seeds": [int(s) for s in seeds],
                "env_kwargs": config.make_env_kwargs(),
                "chat": repr(config.chat_format()),
                "temperature": config.eval_temperature,
                "max_new_tokens": config.max_new_tokens,
                "samples": int(config.num_generations_eval or 1),
                "bf16": bool(config.bf16),
            },
            default=repr,
        )
    )
    base_file, key_file = folder / BASE_EVAL_FILE, folder / BASE_EVAL_SETTINGS_FILE
    if base_file.is_file():
        if _read_json_or_none(key_file) == key:
            return json.loads(base_file.read_text(encoding="utf-8"))
        log("llmgym-train: --warm_start: the saved base evaluation used other settings: evaluating again")
    log(f"llmgym-train: evaluating the base model {model} on {len(seeds)} seeds")
    base = evaluate_model(
        model,
        config.env,
        seeds,
        env_kwargs=config.make_env_kwargs(),
        chat=config.chat_format(),
        temperature=config.eval_temperature,
        max_new_tokens=config.max_new_tokens,
        samples=int(config.num_generations_eval or 1),
        dtype="bfloat16" if config.bf16 else "float32",
        records_path=folder / "base_episodes.jsonl",
    )
    _write_json(base_file, base)
    _write_json(key_file, key)
    return base


def _read_json_or_none(path: Path) -> Any:
    """A small JSON file of ours, or None when it is missing or unreadable (then the caller recomputes)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: Any) -> None:
    from llm_gym.safe_io import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


__all__ = [
    "action_counts",
    "base_evaluation",
    "evaluate_model",
    "report_three",
    "run_with_warm_start",
    "warm_start_rows",
]
