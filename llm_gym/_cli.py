"""Conventions every llm-gym command shares (``llmgym``, ``llmgym-train``, ``llmgym-eval``, ...): exit codes and
TRL's snake_case flag style.

A module of its own, below every command: the trainer's commands import it without importing ``llmgym``'s
command line (which imports the trainer for ``check-template``).
"""

from __future__ import annotations

import argparse

#: Exit codes of ``llmgym``, ``llmgym-train`` and ``llmgym-eval``.
EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2
#: 2: the command line cannot work as given (a bad option or value; an environment, profile, model or endpoint
#: named on it that cannot be used). 1: a failure while working (I/O, a file's contents, a replay mismatch).
EXIT_CODES_HELP = (
    "exit codes: 0 success, 1 runtime or I/O error, 2 usage or configuration error (a bad option or value, "
    "or an environment, model or endpoint named on the command line that cannot be used)"
)


def env_help(text: str) -> str:
    """An ``--env`` option's help with the registry's families named (a new family shows up by itself)."""
    from llm_gym.registration import family_names

    return f"{text} Families: {', '.join(family_names())}."


def snake_case_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """TRL's flag style on every llm-gym command: ``--num_eval_seeds``, not ``--num-eval-seeds``.

    Each dashed long option becomes its snake_case spelling in help and errors; the dashed spelling still
    parses as a hidden, deprecated alias (older scripts keep working). Applies to sub-commands too.
    """
    for action in list(parser._actions):
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                snake_case_options(sub)
            continue
        renamed = []
        for opt in action.option_strings:
            if opt.startswith("--") and "-" in opt[2:]:
                snake = "--" + opt[2:].replace("-", "_")
                parser._option_string_actions[snake] = action  # the dashed one stays registered (hidden)
                renamed.append(snake)
            else:
                renamed.append(opt)
        action.option_strings = list(dict.fromkeys(renamed))
    return parser


__all__ = ["EXIT_CODES_HELP", "EXIT_OK", "EXIT_RUNTIME", "EXIT_USAGE", "env_help", "snake_case_options"]
