"""Defaults and choices that the trainer's config shares with commands that must not load torch.

``llmgym-eval`` and the evaluation policies use the same evaluation seed, temperature and token budget as
``llmgym-train``; they import the numbers from here (this module imports only the standard library), and
:mod:`llm_gym.trainer.config` builds its fields from them, so each number is written once.
"""

from __future__ import annotations

import os
from pathlib import Path

# ------------------------------------------------------------------------------------------ shared defaults
#: First validation seed (RAGEN's ``seed.val``), away from the training seeds.
EVAL_SEED = 123
#: First training seed (RAGEN's ``seed.train``): group g of round s plays ``TRAIN_SEED + s * P + g``.
TRAIN_SEED = 10000
#: Sampling temperature in evaluation (RAGEN-2 evaluates with T = 0.5).
EVAL_TEMPERATURE = 0.5
#: Nucleus sampling in evaluation (1.0 = off).
EVAL_TOP_P = 1.0
#: Tokens the model may generate per turn (RAGEN: ``max_tokens`` 400).
MAX_NEW_TOKENS = 400
#: ``llmgym-train --profile``'s default: our recommended settings per environment (``trainer/profiles/recommended``).
DEFAULT_PROFILE = "recommended"
#: Episode records file name (the :mod:`llm_gym.agent.records` JSONL the viewer reads).
EPISODES_FILE = "episodes.jsonl"
#: Written to output_dir after llmgym-train's before/after evaluation (and read by the warm start's report):
#: baselines and success among valid answers.
EVAL_REPORT_FILE = "eval_report.json"
#: First seed of the warm start's data episodes: away from the training (10000..), evaluation (123..), the
#: learning study's pilot (5000..) and held-out (200000..) seeds.
WARM_START_SEED = 50_000
#: Learning rate of supervised warm starts (pilots in docs/learning-study.md).
SFT_LEARNING_RATE = 1e-4


def cache_dir() -> Path:
    """Where converted models (``smollm2``) and built organisms are kept (``$LLM_GYM_CACHE`` or
    ``~/.cache/llm_gym``)."""
    return Path(os.environ.get("LLM_GYM_CACHE", Path.home() / ".cache" / "llm_gym")).expanduser()


# ------------------------------------------------------------------------------------------ choices
# Allowed values of the config's string-valued fields (checked by the config's validation). The filter
# strategies are the SNR filter's own (``snr_filter.STRATEGIES``), the chat styles the chat format's
# (``llm_gym.agent.chat.CHAT_STYLES``).
FILTER_METRICS = ("variance", "std")
FILTER_DROPS = ("remove", "mask")
FILTER_LOSS_SCALINGS = ("none", "linear", "sqrt")
FILTER_UPDATE_STEPS = ("fixed", "proportional")
GROUP_DYNAMICS = ("independent", "shared")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
CRITIC_MODELS = ("head", "separate")
MI_REASONING = ("think", "turn")
MI_MARGINALS = ("code", "paper")
MI_SCORERS = ("cached", "trl")
GRADIENT_ANALYSIS_BUCKET_MODES = ("quantile", "fixed_rv")

__all__ = [
    "CRITIC_MODELS",
    "DEFAULT_PROFILE",
    "EPISODES_FILE",
    "cache_dir",
    "EVAL_REPORT_FILE",
    "EVAL_SEED",
    "EVAL_TEMPERATURE",
    "EVAL_TOP_P",
    "FILTER_DROPS",
    "FILTER_LOSS_SCALINGS",
    "FILTER_METRICS",
    "FILTER_UPDATE_STEPS",
    "GRADIENT_ANALYSIS_BUCKET_MODES",
    "GROUP_DYNAMICS",
    "LOSS_AGG_MODES",
    "MAX_NEW_TOKENS",
    "MI_MARGINALS",
    "MI_REASONING",
    "MI_SCORERS",
    "SFT_LEARNING_RATE",
    "TRAIN_SEED",
    "WARM_START_SEED",
]
