"""``llmgym-train``: RL training of an LLM agent on an llm-gym environment.

The settings come from six layers (the ``--algo`` preset, the ``--profile``, CPU settings, ``--config``, flags,
``--set``), merged by :mod:`llm_gym.trainer.resolve`; the flags and ``--help`` are :mod:`llm_gym.trainer.flags`'.
This module runs the command: it resolves and checks the configuration, claims the output folder (one run per
folder; with several processes rank 0 chooses the checkpoint to resume), trains, and reports.

Exit codes (as every llm-gym command): 0 success, 1 runtime or I/O error, 2 usage or configuration error (a bad
option or value; an environment, profile or model that cannot be used).

Everything is validated (environment, batch divisibility, model, chat template present) before the model is
loaded; the chat template's token-level fitness is probed when the trainer is built, before any evaluation.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from llm_gym.trainer.defaults import EVAL_REPORT_FILE
from llm_gym.trainer.flags import build_parser
from llm_gym.trainer.resolve import ConfigError, has_gpu, resolve_config

from llm_gym._cli import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE


def _num(value: Any) -> str:
    """A metric for the summary lines: ``n/a`` when it is missing or not a finite number (TRL logs a NaN reward
    as None in its log history, e.g. when every reward function returned NaN)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return "n/a"
    return f"{x:.3f}" if x == x and abs(x) != float("inf") else "n/a"


def _eval_summary(metrics: dict[str, Any]) -> str:
    """One line of evaluation results (TRL prefixes eval metrics with ``eval_``)."""
    parts = []
    for key, label in (
        ("success", "success"),
        ("valid_action_rate", "valid actions"),
        ("episode_reward", "reward"),
    ):
        value = metrics.get(f"eval_env/{key}")
        if value is not None:
            parts.append(f"{label} {_num(value)}")
    return ", ".join(parts) or "no metrics"


def _eval_report(config: Any) -> dict[str, Any]:
    """The random valid-action baseline and solver optimum on the evaluation seeds (same limits), and each
    evaluation's success / valid answers / success among valid answers (Wilson 95%) from the episode records
    (none when records are off); written to ``output_dir/eval_report.json``."""
    import json

    from llm_gym.agent.baselines import evaluation_report
    from llm_gym.agent.records import read_records

    path = Path(config.output_dir) / config.episode_records if config.episode_records else None
    records = (
        [r for r in read_records(path) if r.meta.get("mode") == "eval"] if path and path.is_file() else []
    )
    seeds = list(range(config.eval_seed, config.eval_seed + config.num_eval_seeds))
    samples = int(getattr(config, "num_generations_eval", 1) or 1)
    report = evaluation_report(config.env, seeds, config.make_env_kwargs(), records, samples=samples)
    from llm_gym.safe_io import atomic_write_text

    atomic_write_text(Path(config.output_dir) / EVAL_REPORT_FILE, json.dumps(report, indent=2) + "\n")
    return report


def _error(msg: str, code: int = EXIT_USAGE) -> int:
    print(f"llmgym-train: error: {msg}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``llmgym-train``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if "-h" in argv or "--help" in argv:
        build_parser().print_help()
        return EXIT_OK
    from llm_gym.trainer.models import ModelError

    from llm_gym.safe_io import OutputLockedError

    rank, world_size = _launch_rank()
    log = print if rank == 0 else (lambda *_: None)
    if "--dry_run" in argv:
        return _dry_run(argv, log)
    try:
        config, meta = _checked_config(argv, log)
        lock = _claim_output_dir(config, meta, rank, world_size, log)
    except (ConfigError, ModelError, OutputLockedError, ValueError) as e:
        return _error(str(e))
    except OSError as e:  # an output folder under a file, a full disk, ...
        return _error(_os_error(e), EXIT_RUNTIME)
    try:
        if config.warm_start:  # supervised fine-tuning first, then this run from its model
            from llm_gym.trainer.warm_start import run_with_warm_start

            return run_with_warm_start(run, config, meta, log=log)
        return run(config, meta)
    except Exception as e:
        from llm_gym.agent.templates import ChatTemplateError

        if isinstance(e, ChatTemplateError):  # a template that fails on a later turn's chat: one line too
            return _error(str(e), EXIT_RUNTIME)
        if not _is_io_failure(e):
            raise
        return _error(_os_error(e), EXIT_RUNTIME)
    finally:
        if lock is not None:
            lock.release()


def _dry_run(argv: list[str], log: Any) -> int:
    """``--dry_run``: the GPU settings resolved on any machine, printed with their sources; nothing is loaded."""
    from llm_gym.trainer.dry_run import dry_run

    try:
        config, meta = resolve_config(argv, gpu=True, log=log, dry_run=True)
        return dry_run(config, meta)
    except (ConfigError, ValueError) as e:
        return _error(str(e))


def _checked_config(argv: list[str], log: Any) -> tuple[Any, dict[str, Any]]:
    """The resolved configuration, with what can fail before the model loads checked now: the model exists and
    has a chat template, a LoRA adapter is not given to ``--use_peft``, the environment takes its kwargs, and
    ``--resume`` has a folder to resume from."""
    from llm_gym.trainer.models import adapter_base, check_model

    config, meta = resolve_config(argv, log=log)
    from llm_gym.trainer.organism import materialize

    # An organism is built (once, cached) for this run's env and seed; from here on it is a model folder.
    meta["model"] = materialize(str(meta["model"]), config.env, config.make_env_kwargs(), seed=config.seed)
    resolved = check_model(str(meta["model"]), chat_template=config.chat_template)
    if config.use_peft and Path(resolved).is_dir() and adapter_base(resolved) is not None:
        raise ConfigError(
            f"{meta['model']} is a LoRA adapter: without --use_peft llmgym-train continues training it; "
            "to train a new adapter, pass its base model (or a merged model) as --model"
        )
    _check_env(config)
    if meta["resume"] == "latest" and not Path(config.output_dir).is_dir():
        raise ConfigError(f"--resume: output folder {config.output_dir} does not exist")
    return config, meta


def _claim_output_dir(config: Any, meta: dict[str, Any], rank: int, world_size: int, log: Any) -> Any:
    """Rank 0 locks the output folder (one run per folder, held until this process ends or :func:`main` releases
    it), prepares it for a fresh or resumed run and chooses the checkpoint (``meta["resume"]``); with several
    processes the others read that choice after a barrier. Returns the lock (None on the other ranks); on an
    error the lock is released before the error propagates."""
    from llm_gym.trainer.output import (
        prepare_output_dir,
        publish_resume_choice,
        read_resume_choice,
        write_run_file,
    )

    from llm_gym.safe_io import OutputLock, OutputLockedError

    several = world_size > 1
    lock = None
    try:
        if rank == 0:
            lock = OutputLock(config.output_dir, "training run").acquire()
            try:
                meta["resume"] = prepare_output_dir(
                    config, meta["resume"], bool(meta.get("overwrite_output_dir")), log=log
                )
                write_run_file(config.output_dir, config)
            except (ValueError, OSError) as e:
                if several:  # the other ranks wait for rank 0's choice: tell them why there is none
                    publish_resume_choice(config.output_dir, None, error=str(e))
                    _wait_for_ranks()
                raise
            if several:
                publish_resume_choice(config.output_dir, meta["resume"])
        if several:
            # Rank 0 alone chooses the checkpoint (and deletes incomplete ones); the others read its choice
            # after this barrier instead of looking at a folder rank 0 may be changing.
            _wait_for_ranks()
            if rank != 0:
                meta["resume"] = read_resume_choice(config.output_dir)
    except (ValueError, OSError, OutputLockedError):
        if lock is not None:
            lock.release()
        raise
    return lock


def _launch_rank() -> tuple[int, int]:
    """This process's rank and the number of processes, as the launcher (accelerate, torchrun) set them."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _wait_for_ranks() -> None:
    """A barrier over the launched processes (before the trainer exists; accelerate's shared state sets up the
    process group the trainer reuses)."""
    from accelerate import PartialState

    PartialState().wait_for_everyone()


def _is_io_failure(e: BaseException) -> bool:
    """An ``OSError``, or a writer's own error for one (torch.save's ``PytorchStreamWriter failed writing``,
    safetensors' ``IoError``): a full disk while saving a checkpoint surfaces as these."""
    if isinstance(e, OSError):
        return True
    text = str(e)
    if isinstance(e, RuntimeError) and "failed writing" in text:
        return True
    return type(e).__name__ == "SafetensorError" and ("IoError" in text or "No space" in text)


def _check_env(config: Any) -> None:
    """Make the environment once with the run's kwargs, so an unknown or out-of-range kwarg
    (``--env_kwargs '{"bogus": 1}'``) is a usage error now rather than a traceback after the model loaded."""
    from llm_gym.registration import make_env

    if not getattr(config, "env_url", None):
        make_env(config.env, config.make_env_kwargs()).close()
        return
    from llm_gym.serve.client import check_servers

    # sessions open at once: a round's episodes (generation_batch_size, over all processes) or an evaluation batch
    evals = config.num_eval_seeds * (config.num_generations_eval or 1)
    at_once = max(
        config.generation_batch_size, min(evals, config.per_device_eval_batch_size * config.world_size)
    )
    try:  # every server serves the id as a local run would play it, with room for the run's sessions
        check_servers(
            config.env_url, [config.env], config.make_env_kwargs(), sessions=at_once, command="llmgym-train"
        )
    except ConnectionError as e:  # a server named on the command line that cannot be used: exit 2
        raise ValueError(str(e)) from None


def _os_error(e: BaseException) -> str:
    """One line for an I/O error (``[Errno 28] No space left on device: 'path'``)."""
    return " ".join(str(e).split())


def run(config: Any, meta: dict[str, Any]) -> int:
    """Load the model (the heavy part) and train; prints success before and after training."""
    from llm_gym.trainer.algorithms import trainer_class
    from llm_gym.trainer.chat_templates import ChatTemplateError
    from llm_gym.trainer.models import ModelError
    from llm_gym.trainer.precision import load_for_training

    t0 = time.time()
    try:
        # float32 master weights (bf16 = autocast); a LoRA adapter folder as --model keeps training its adapter
        model, tokenizer, _ = load_for_training(str(meta["model"]), config, gpu=has_gpu())
        cls = trainer_class(meta["algo"])
        # The rollout function probes the chat template here, before any training or evaluation.
        trainer = cls(model=model, args=config, processing_class=tokenizer)
    except (ModelError, ChatTemplateError) as e:  # the named model cannot be used: configuration
        return _error(str(e), EXIT_USAGE)
    except OSError as e:
        return _error(str(e), EXIT_RUNTIME)
    is_main = trainer.accelerator.is_main_process
    say = print if is_main else (lambda *a, **k: None)
    say(
        f"llmgym-train: {config.env} | model {meta['model']} | algo {meta['algo']} | "
        f"{config.num_prompts_per_round} seeds x {config.num_generations} rollouts per round | "
        f"output {config.output_dir}"
    )
    from llm_gym.trainer.organism import small_model_warnings
    from llm_gym.trainer.warm_start import model_chat_warnings

    warnings = small_model_warnings(sum(p.numel() for p in model.parameters()), config.entropy_coef)
    for line in warnings + model_chat_warnings(config, str(meta["model"])):
        say(f"llmgym-train: warning: {line}")
    do_eval = config.eval_before_after and config.num_eval_seeds > 0
    before = trainer.evaluate() if do_eval else {}
    if before:
        say(f"llmgym-train: before training: {_eval_summary(before)}")
    from llm_gym.trainer.output import (
        checkpoint_step,
        load_finished_checkpoint,
        save_final,
        training_finished,
    )

    # main() resolved --resume to a complete checkpoint folder; one at max_steps trains no further step
    resume = meta.get("resume") or None
    if resume and training_finished(checkpoint_step(resume), config.max_steps):
        load_finished_checkpoint(trainer, resume, log=say)
    else:
        trainer.train(resume_from_checkpoint=resume)
    after = trainer.evaluate() if do_eval else {}
    save_final(trainer, config)  # written beside and renamed: final/ is whole or absent
    if is_main:
        sharing = getattr(trainer, "prefix_sharing", None)
        turns = getattr(trainer, "turn_cache", None)
        _report(config, trainer.state.log_history, before, after, time.time() - t0, sharing, turns)
    # Tear the process group down before exit: left to interpreter shutdown, gloo's threads sometimes abort the
    # process ("terminate called without an active exception") after a run that finished and saved.
    trainer.accelerator.end_training()
    return EXIT_OK


def _report(
    config: Any,
    log_history: list[dict],
    before: dict[str, Any],
    after: dict[str, Any],
    seconds: float,
    prefix_sharing: Any = None,
    turn_cache: Any = None,
) -> None:
    """The closing lines: evaluation after training, both evaluations beside the baselines on the same seeds
    (also written to ``eval_report.json``), the summary line, what prefix sharing and the turn cache saved, and
    the collapse plot."""
    last: dict[str, Any] = next((r for r in reversed(log_history) if "reward" in r), {})
    summary = [f"llmgym-train: done in {seconds:.0f}s"]
    report: dict[str, Any] | None = None
    if after:
        print(f"llmgym-train: after training: {_eval_summary(after)}")
    if before and after:
        from llm_gym.agent.baselines import format_baseline, format_outcomes

        report = _eval_report(config)
        for label, ev in zip(("before", "after"), report["evals"][:1] + report["evals"][-1:]):
            print(f"llmgym-train: {label} training ({config.num_eval_seeds} seeds): {format_outcomes(ev)}")
        base = format_baseline(report["baseline"])
        print(f"llmgym-train: baseline on the same seeds and limits: {base}")
        summary.append(
            f"success before {_num(before.get('eval_env/success'))} -> "
            f"after {_num(after.get('eval_env/success'))} ({base})"
        )
    if last:
        summary.append(f"last train reward {_num(last['reward'])}, success {_num(last.get('env/success'))}")
    print(" | ".join(summary))
    if prefix_sharing is not None:
        from llm_gym.trainer.prefix_sharing import summary_line

        print(f"llmgym-train: {summary_line(prefix_sharing)}")
    if turn_cache is not None:
        from llm_gym.trainer import turn_cache as tc

        print(f"llmgym-train: {tc.summary_line(turn_cache)}")
    if config.collapse_report:
        _collapse_png(config)
    if config.learning_curve:
        from llm_gym.trainer import learning_curve

        out = learning_curve.plot(
            learning_curve.curve(log_history, report),
            Path(config.output_dir) / config.learning_curve,
            f"{config.env}: {Path(config.output_dir).name}",
        )
        print(f"llmgym-train: learning curve {out}")
    if config.episode_gif and config.episode_records:
        _episode_gif(config)


def _episode_gif(config: Any) -> None:
    """Render one episode of the last evaluation as a GIF, or say why not in one line."""
    from llm_gym.trainer import learning_curve

    records = Path(config.episode_records)
    records = records if records.is_absolute() else Path(config.output_dir) / records
    try:
        out = learning_curve.episode_gif(records, Path(config.output_dir) / config.episode_gif)
    except ImportError as e:  # pygame is the render extra's
        print(f"llmgym-train: no episode GIF ({e}; pip install 'llm-gym[render]')")
        return
    except (OSError, ValueError) as e:
        print(f"llmgym-train: no episode GIF ({type(e).__name__}: {e})")
        return
    print(f"llmgym-train: episode {out}" if out else "llmgym-train: no episode GIF (no evaluation episode)")


def _collapse_png(config: Any) -> None:
    """Plot the run's collapse series (MI, entropies, reward variance) next to it as a PNG."""
    from llm_gym.trainer.collapse_report import plot, read_series

    path = Path(config.output_dir) / config.collapse_report
    rows = read_series(path) if path.is_file() else []
    if rows:
        out = plot(rows, path.with_suffix(".png"), f"collapse report: {Path(config.output_dir).name}")
        print(f"llmgym-train: collapse report {out}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
