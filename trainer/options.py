"""The options ``llmgym-train``, ``llmgym-eval`` and ``llmgym-sft`` share, each declared once, and the layout of
their ``--help``.

The shared options are dataclass fields with their help text in ``metadata`` (TRL's style): the model's dtype
(:class:`ModelArguments`), the environment (:class:`EnvArguments`: id, kwargs, servers, turn and action limits),
the chat the model sees (:class:`PromptArguments`), the evaluation seeds (:class:`EvalSeedArguments`) and how a
run treats its output folder (:class:`OutputOptions`: ``--resume``, ``--overwrite_output_dir``; ``--output_dir``
is TRL's field, ``-o`` everywhere). ``llmgym-train`` and ``llmgym-sft`` mix them into their configs
(:mod:`llm_gym.trainer.config`); ``llmgym-eval`` (no TRL, no torch before a local model loads) adds the same fields
to its ``argparse`` parser with :func:`add_field_options`. One name means one thing in the three commands; the
names ``llmgym-eval`` used before (:data:`DEPRECATED`) still work, with a warning.

This module imports no torch or TRL.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, cast

from llm_gym.trainer.defaults import EVAL_SEED

from llm_gym._cli import env_help
from llm_gym.agent.chat import (
    CHAT_SETTINGS,
    CHAT_STYLES,
    DEFAULT_SYSTEM_PROMPT,
    DEMONSTRATIONS,
    ChatFormat,
    chat_format_from_settings,
)
from llm_gym.core.checks import is_int


def positive_int(value: Any) -> bool:
    return is_int(value, numpy=False) and value >= 1


def nonnegative_int(value: Any) -> bool:
    return is_int(value, numpy=False) and value >= 0


# ------------------------------------------------------------------------------------------ model weights
@dataclass
class ModelArguments:
    """How the model's weights are held while training (see :mod:`llm_gym.trainer.precision`)."""

    dtype: str = field(
        default="float32",
        metadata={
            "help": "dtype the model's weights are loaded in (TRL ModelConfig's name). Training: float32 (default): "
            "float32 master weights on every path; bf16=True then means bfloat16 autocast. bfloat16: opt-in "
            "16-bit weights (half the memory), warned about where it loses updates: with no float32 copy "
            "(one process, DDP) one AdamW step at lr 1e-6 changes 4 in 1,000 of SmolLM2-135M's elements (nearly all "
            "on float32). "
            "Under LoRA it "
            "applies to the frozen base only (PEFT keeps the adapters in float32).",
            "choices": ["float32", "bfloat16"],
        },
    )

    def validate_model_args(self) -> None:
        from llm_gym.trainer.precision import weight_dtype_of

        self.dtype = weight_dtype_of(self)


# ------------------------------------------------------------------------------------------ environment
@dataclass
class EnvArguments:
    """Which environment is played, and its turn and action limits."""

    env: str = field(
        default="llmgym/FrozenLake-v0",
        metadata={
            "help": "Environment: a family's short name, a variant's name or a registered id (`llmgym list` "
            "prints them with their baselines)."
        },
    )
    env_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Extra gym.make kwargs as a dict or JSON string, e.g. '{\"size\": 6}'."},
    )
    max_turns: int | None = field(
        default=None,
        metadata={
            "help": "LLM turns per episode; None keeps the environment's default (RAGEN-2: 5 for grid games)."
        },
    )
    max_actions_per_turn: int | None = field(
        default=None,
        metadata={
            "help": "Actions kept from one response; None keeps the environment's default (RAGEN-2: 2)."
        },
    )
    max_actions: int | None = field(
        default=None,
        metadata={"help": "Actions executed per episode; None keeps the environment's default (10)."},
    )
    think: bool | None = field(
        default=None,
        metadata={
            "help": "Require <think>...</think> before <answer> (True), answer-only format (False), or the "
            "environment's default (None)."
        },
    )
    env_url: list[str] | None = field(
        default=None,
        metadata={
            "help": "Play the environment on `llmgym serve` servers instead of in-process: one URL, or several "
            "(space- or comma-separated) that episodes use in turn. Same seeds, same episodes."
        },
    )

    def validate_env_args(self) -> None:
        from llm_gym.registration import resolve_env_id

        self.env = resolve_env_id(self.env)
        if isinstance(self.env_kwargs, str):
            try:
                parsed = json.loads(self.env_kwargs) if self.env_kwargs.strip() else {}
            except json.JSONDecodeError as e:
                raise ValueError(f"env_kwargs must be a JSON object, got {self.env_kwargs!r}: {e}") from None
            self.env_kwargs = parsed
        if self.env_kwargs is None:
            self.env_kwargs = {}
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs must be a dict, got {type(self.env_kwargs).__name__}")
        for name in ("max_turns", "max_actions_per_turn", "max_actions"):
            value = getattr(self, name)
            if value is not None and not positive_int(value):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        from llm_gym.serve.protocol import parse_env_urls

        self.env_url = parse_env_urls(self.env_url)

    def make_env_kwargs(self) -> dict[str, Any]:
        """gym.make kwargs: the turn/action limits plus ``env_kwargs`` (which win)."""
        kwargs: dict[str, Any] = {}
        for name in ("max_turns", "max_actions_per_turn", "max_actions", "think"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        kwargs.update(cast(dict, self.env_kwargs or {}))  # a dict once validated
        return kwargs


# ------------------------------------------------------------------------------------------ prompt
@dataclass
class PromptArguments:
    """The chat the policy sees: system prompt, demonstration, feedback, template."""

    system_prompt: str = field(
        default=DEFAULT_SYSTEM_PROMPT,
        metadata={"help": "Sentence opening the system message (instructions follow)."},
    )
    one_shot_example: bool = field(
        default=False,
        metadata={
            "help": "Show one demonstration turn (example state + well-formed answer) after the system message."
        },
    )
    demonstration: str = field(
        default="action",
        metadata={
            "help": "What the demonstration (one_shot_example) answers: action (the env's example answer, a fixed "
            "legal action such as Left: a constant policy a model can copy), solver (the solver's move for the "
            "example's own state), several (three example states with different solver moves) or placeholder "
            "(an answer that is no legal action).",
            "choices": list(DEMONSTRATIONS),
        },
    )
    include_instructions: bool = field(
        default=True,
        metadata={
            "help": "Append the environment's instructions (rules, symbols, actions, answer format) to the system "
            "message. False makes every prompt shorter; a model that learned the task (a warm start) needs no rules."
        },
    )
    reward_feedback: bool = field(
        default=False, metadata={"help": "Show the previous turn's reward each turn."}
    )
    chat_template: str | None = field(
        default=None, metadata={"help": "Path to a Jinja chat template that replaces the tokenizer's."}
    )
    chat_style: str = field(
        default="llmgym",
        metadata={
            "help": "Chat text: llmgym (ours) or ragen (RAGEN's exact system/turn text, a Reward: line each turn, and "
            "'<think>' appended to every generation prompt as untrained prompt tokens).",
            "choices": list(CHAT_STYLES),
        },
    )

    def chat_format(self) -> ChatFormat:
        """The ``ChatFormat`` of training and in-training evaluation rollouts: always the full history, so the
        trained sequence is the one that was sampled (``llmgym-eval --history_window`` can shorten it)."""
        return chat_format_from_settings({name: getattr(self, name) for name in CHAT_SETTINGS})


# ------------------------------------------------------------------------------------------ evaluation seeds
@dataclass
class EvalSeedArguments:
    """The fixed evaluation seeds: ``eval_seed .. eval_seed + num_eval_seeds - 1``."""

    eval_seed: int = field(
        default=EVAL_SEED,
        metadata={
            "help": "First evaluation seed (RAGEN's validation seeds start at 123): evaluations play eval_seed .. "
            "eval_seed + num_eval_seeds - 1, and llmgym-sft refuses data rows played on them."
        },
    )
    num_eval_seeds: int = field(
        default=64,
        metadata={
            "help": "Evaluation seeds eval_seed .. eval_seed + n - 1 (llmgym-train: 0 = no evaluation; llmgym-sft: "
            "0 = no overlap check)."
        },
    )

    def validate_eval_seeds(self) -> None:
        if not nonnegative_int(self.eval_seed):
            raise ValueError(f"eval_seed must be a non-negative integer, got {self.eval_seed!r}")
        if not nonnegative_int(self.num_eval_seeds):
            raise ValueError(f"num_eval_seeds must be a non-negative integer, got {self.num_eval_seeds!r}")


# ------------------------------------------------------------------------------------------ the output folder
@dataclass
class OutputOptions:
    """How a run treats its output folder (``--output_dir``, ``-o``): one run per folder. Command options, not
    config fields; ``metadata`` holds the ``--help`` section and the ``argparse`` keywords besides the default."""

    resume: str | None = field(
        default=None,
        metadata={
            "group": "output",
            "nargs": "?",
            "const": "latest",
            "help": "Continue the run in output_dir: from its newest complete checkpoint, or from the checkpoint "
            "folder given (llmgym-train, llmgym-sft: episode records written after it are dropped and played "
            "again); llmgym-eval: after the episodes already in output_dir/episodes.jsonl.",
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "group": "output",
            "action": "store_true",
            "help": "Start afresh in a non-empty output_dir: what a run wrote there (checkpoints, records, "
            "reports, the final model; llmgym-eval: episodes.jsonl) is removed first. Without this or --resume, "
            "a non-empty output_dir is refused.",
        },
    )


#: Old flags of each command -> the shared name that replaced them. They still parse (hidden from ``--help``) and
#: warn (:func:`add_deprecated_aliases`); the dashed spellings of each are covered by ``snake_case_options``.
DEPRECATED: dict[str, dict[str, str]] = {
    "llmgym-eval": {
        "--seed_start": "--eval_seed",
        "--num_seeds": "--num_eval_seeds",
        "--overwrite": "--overwrite_output_dir",
    },
}


# ------------------------------------------------------------------------------------------ building parsers
def parse_bool(value: str) -> bool:
    """A boolean option's value: true / false (also 1/0, yes/no, on/off), as ``HfArgumentParser`` takes them."""
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _field_default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if callable(f.default_factory) else None


def _argparse_kwargs(f: Field, hint: Any) -> dict[str, Any]:
    """``argparse`` keywords for a dataclass field from its type (as ``HfArgumentParser`` reads it): ``X | None``
    is X, a bool takes an optional true/false, a list takes one or more values, a dict is given as JSON text."""
    kwargs: dict[str, Any] = {"default": _field_default(f), "help": f.metadata.get("help")}
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args and typing.get_origin(hint) is not list:  # a union: the first non-None member (dict | str: str)
        hint = str if dict in [typing.get_origin(a) or a for a in args] else args[0]
    origin = typing.get_origin(hint)
    if hint is bool:
        kwargs.update(type=parse_bool, nargs="?", const=True, metavar="BOOL")
    elif origin is list:
        kwargs.update(type=typing.get_args(hint)[0], nargs="+")
    elif hint in (int, float, str):
        kwargs["type"] = hint
    if "choices" in f.metadata:
        kwargs["choices"] = list(f.metadata["choices"])
    for key in ("nargs", "const", "action", "metavar"):  # a command option's own argparse keywords
        if key in f.metadata:
            kwargs[key] = f.metadata[key]
    return kwargs


def add_field_options(
    container: Any,
    cls: type,
    names: Iterable[str] | None = None,
    *,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    unset_default: bool = False,
) -> None:
    """Add an option named after each field (its name with two dashes) to an ``argparse`` parser or group, for the
    fields ``names`` of dataclass ``cls`` (default: all), with the field's type, default, choices and help.
    ``overrides``: per field, ``argparse`` keywords that replace the derived ones (a command's own default,
    ``nargs``; None removes one), and ``help_suffix`` appended to the help. ``unset_default``: the default is None
    (the command fills unset ones from elsewhere) and the help names the field's default."""
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in fields(cls)}
    for name in names if names is not None else list(by_name):
        f = by_name[name]
        kwargs = _argparse_kwargs(f, hints[name])
        if unset_default:
            kwargs["help"] = f"{kwargs['help']} (default: {kwargs['default']})"
            kwargs["default"] = None
        extra = dict((overrides or {}).get(name, {}))
        if "help_suffix" in extra:
            kwargs["help"] = f"{kwargs['help']} {extra.pop('help_suffix')}"
        for key, value in extra.items():  # None drops a derived keyword (argparse's own default applies)
            if value is None:
                kwargs.pop(key, None)
            else:
                kwargs[key] = value
        if kwargs.get("action") in ("store_true", "store_false"):  # a flag takes no value
            for key in ("type", "nargs", "const", "choices", "metavar"):
                kwargs.pop(key, None)
        if name == "env":
            kwargs["help"] = env_help(kwargs["help"])
        container.add_argument(f"--{name}", **kwargs)


def into_sections(
    parser: argparse.ArgumentParser,
    sections: Mapping[str, Any],
    group_of: Mapping[str, str],
    common: Sequence[str] = (),
) -> None:
    """Move the flags whose ``dest`` is in ``group_of`` from argparse's one "options" section into their
    sections (help layout only: the parser's actions stay as they are). Within a section the ``common`` flags
    come first, in that order, then the others in the order they were added."""
    optionals = parser._optionals
    for action in [a for a in optionals._group_actions if a.dest in group_of]:
        optionals._group_actions.remove(action)
        sections[group_of[action.dest]]._group_actions.append(action)
    rank = {name: i for i, name in enumerate(common)}
    for section in sections.values():
        section._group_actions.sort(key=lambda a: rank.get(a.dest, len(rank)))  # stable: the rest keep order


def add_alias(parser: argparse.ArgumentParser, dest: str, alias: str) -> None:
    """Let ``alias`` (a short flag such as ``-o``) set the option ``dest`` too."""
    for action in parser._actions:
        if action.dest == dest:
            action.option_strings = [*action.option_strings, alias]
            parser._option_string_actions[alias] = action
            return
    raise ValueError(f"no option for {dest!r}")


def accept_dashed(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Let every option written with underscores also parse with dashes instead (hidden), as ``HfArgumentParser``
    does for ``llmgym-train`` and ``llmgym-sft``: older scripts written with dashes keep working."""
    for opt, action in list(parser._option_string_actions.items()):
        if opt.startswith("--") and "_" in opt:
            parser._option_string_actions.setdefault("--" + opt[2:].replace("_", "-"), action)
    return parser


def deprecation_message(prog: str, old: str, new: str) -> str:
    return f"{prog}: {old} is deprecated and will be removed; use {new} (same meaning)"


def add_deprecated_aliases(parser: argparse.ArgumentParser, aliases: Mapping[str, str]) -> None:
    """Keep each old flag of ``aliases`` (old -> current) working: it parses as the current flag does (same
    values, same mutually exclusive group), is hidden from ``--help``, and prints a deprecation line to stderr when
    used.
    Its dashed spelling (``--seed-start``) is registered too."""
    for old, new in aliases.items():
        target = parser._option_string_actions[new]
        container: Any = parser
        for group in parser._mutually_exclusive_groups:
            if target in group._group_actions:
                container = group

        class _Deprecated(argparse.Action):
            def __call__(self, parser, namespace, values, option_string=None, _t=target, _new=new):
                # a CLI's line, not a Python warning with a source location
                print(deprecation_message(parser.prog, str(option_string), _new), file=sys.stderr)
                _t(parser, namespace, _t.const if _t.nargs == 0 else values, _t.option_strings[0])

        spellings = list(dict.fromkeys([old, "--" + old[2:].replace("_", "-")]))
        container.add_argument(
            *spellings,
            action=_Deprecated,
            dest=target.dest,
            nargs=target.nargs,
            const=target.const,
            type=target.type,
            choices=target.choices,
            metavar=target.metavar,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )


def env_kwargs_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``gym.make`` kwargs of :class:`EnvArguments` fields given as ``values`` (``env_kwargs`` as a dict or
    JSON text; the turn and action limits; ``env_kwargs`` wins), checked as ``llmgym-train`` checks them."""
    names = {f.name for f in fields(EnvArguments)} - {"env", "env_url"}
    args = EnvArguments(**{k: v for k, v in values.items() if k in names})
    args.validate_env_args()
    return args.make_env_kwargs()


__all__ = [
    "DEPRECATED",
    "EnvArguments",
    "EvalSeedArguments",
    "ModelArguments",
    "OutputOptions",
    "PromptArguments",
    "accept_dashed",
    "add_alias",
    "add_deprecated_aliases",
    "add_field_options",
    "env_help",
    "env_kwargs_of",
    "into_sections",
    "nonnegative_int",
    "parse_bool",
    "positive_int",
]
