"""MetaMathQA: answer a math word problem, with optional retries at a halved reward (RAGEN's MetaMathQA)."""

from __future__ import annotations

import os
from typing import Any

from llm_gym.assets import asset_path
from llm_gym.core import AnyText, ExpertMove, RagenPrompt, RewardSpec, TextEnv
from llm_gym.core.checks import is_int
from llm_gym.core.env import check_answer_sep
from llm_gym.envs.metamathqa.math_check import extract_gold, is_equivalent
from llm_gym.envs.metamathqa.math_verify_checker import math_verify_equivalent, require_math_verify
from llm_gym.envs.task_data import load_records, pick_index

#: The Hugging Face id of the full data set (395k items).
HUB_DATASET = "meta-math/MetaMathQA"
#: The bundled sample (40 grade-school problems in the MetaMathQA schema), selected with ``dataset="sample"``.
SAMPLE_PATH = asset_path("metamathqa_sample.jsonl")
#: Questions longer than this are cut (with a marker) so that every observation fits the observation space.
QUESTION_MAX_LENGTH = 16000
#: Answer checkers: ours (default) and the opt-in math-verify package.
CHECKERS = ("builtin", "math-verify")
#: Longest reasoning the expert copies from an item's worked solution.
MAX_THINK_CHARS = 4000
# RAGEN's whole instruction for MetamathQA, verbatim (config/envs.yaml:193, max_tokens 100 at :194).
_RAGEN_TEXT = "You are solving Math problems. "
CORRECT_TEXT = "Correct!"
INCORRECT_TEXT = "Incorrect. Please think again."
OFFLINE_HINT = (
    "To work offline pass dataset='path/to/file.jsonl' (a local .json/.jsonl/.parquet file with the fields "
    "query, response, type) or dataset='sample' (the bundled 40-problem sample)."
)


def resolve_source(dataset: str | os.PathLike) -> str | os.PathLike:
    """``"sample"`` -> the bundled file; anything else unchanged."""
    return SAMPLE_PATH if dataset == "sample" else dataset


class MetaMathQAEnv(TextEnv):
    """Answer a math word problem from MetaMathQA.

    ## Description
    A question drawn from MetaMathQA (``query``) with ``np_random``; the gold answer is the text after
    "The answer is:" in the item's ``response``. The agent answers; a wrong answer may be retried up to
    ``max_attempts`` times, each correct answer being worth half as much as one attempt earlier (RAGEN-2).

    ## Action
    The final answer inside ``<answer>...</answer>``. By default answers are compared after unwrapping
    ``\\boxed{}``, ``$...$`` and "The answer is", numerically when the gold answer is a number (``0.5`` =
    ``1/2`` = ``\\frac{1}{2}``, ``1,000`` = ``1000``, ``3.0`` = ``3``), allowing words or units around one lone
    number ("12 dollars"). ``strict=True`` uses RAGEN's rule: equality after lowercasing and deleting whitespace.
    ``checker="math-verify"`` (opt-in, ``pip install "llm-gym[math]"``) asks Hugging Face's ``math_verify``
    instead (symbolic, e.g. ``x^2+2x+1`` = ``(x+1)^2``), run in a time-limited worker process so that a hostile
    answer cannot hang the env; a check that times out counts as wrong.

    ## Observation
    The question; after a wrong answer ``Incorrect. Please think again.``, after a right one ``Correct!``
    (RAGEN's feedback). May contain any unicode character (``AnyText`` space).

    ## Starting state
    An item of the data set drawn with ``np_random`` (or the item ``options={"index": i}``); no attempt made.

    ## Rewards
    ``correct`` 1.0 times ``1/2**k`` for a correct answer after ``k`` wrong ones (1, 0.5, 0.25, ...);
    ``incorrect`` 0.0 per wrong answer; ``format_penalty`` -0.1 per response without the tags.

    ## Episode end
    Terminated on a correct answer, or when ``max_attempts`` wrong answers are used up (a game rule, so
    ``terminated``, not ``truncated``). Truncated after ``max_turns`` responses (default ``max(5, max_attempts)``);
    responses without the tags use turns but not attempts.

    ## Information
    ``reset`` adds ``index`` (the item), ``type`` (its MetaMathQA type) and ``gold_answer``; every ``info`` adds
    ``attempts`` and ``correct`` (the last answer's verdict, ``None`` before the first).

    ## Arguments
    * ``dataset``: ``"meta-math/MetaMathQA"`` (default; a hub id), a ``.json``/``.jsonl``/``.parquet`` path, or
      ``"sample"`` (the bundled 40 problems). Without network and cache the hub id fails at construction with a
      ``RuntimeError`` naming both ways out.
    * ``split``: default ``"train"``.
    * ``max_attempts``: default 1 (RAGEN's effective setting, see the docs).
    * ``strict``: RAGEN's exact-match rule, default False.
    * ``checker``: ``"builtin"`` (default) or ``"math-verify"``.
    * ``max_turns``: default ``None`` (``max(5, max_attempts)``).
    * ``action_sep``: default ``None`` (the whole answer is graded); ``"||"`` splits the answer on it and grades
      only the first part, as RAGEN does. And the common ``TextEnv`` arguments.

    ## Version history
    * v0: initial version; ``action_sep`` added later (its default keeps v0's behaviour).
    """

    game_reward_spec = RewardSpec.of(
        ("correct", 1.0, "a correct answer, halved for every earlier wrong attempt"),
        ("incorrect", 0.0, "each wrong answer"),
    )
    action_names = None
    action_sep = None
    obs_max_length = QUESTION_MAX_LENGTH + 64
    expert_name = "gold-answer"
    data_kwargs = {"dataset": ("sample",)}
    # checker (math-verify grades with sympy) and split (another part of the data) stay the server operator's
    light_kwargs = ("max_attempts", "strict", "action_sep")
    reset_options = ("index",)

    def __init__(
        self,
        *,
        dataset: str | os.PathLike = HUB_DATASET,
        split: str = "train",
        max_attempts: int = 1,
        strict: bool = False,
        checker: str = "builtin",
        max_turns: int | None = None,
        action_sep: str | None = None,
        **kwargs: Any,
    ):
        self.action_sep = check_answer_sep(action_sep)
        if not is_int(max_attempts) or max_attempts < 1:
            raise ValueError(f"max_attempts must be a positive integer, got {max_attempts!r}")
        self.max_attempts = int(max_attempts)
        self.strict = bool(strict)
        if checker not in CHECKERS:
            raise ValueError(f"checker must be one of {CHECKERS}, got {checker!r}")
        if checker == "math-verify":
            if self.strict:
                raise ValueError(
                    "strict=True is RAGEN's exact-match rule; it cannot be combined with math-verify"
                )
            require_math_verify()
        self.checker = checker
        for name in ("max_actions_per_turn", "max_actions"):
            if name in kwargs:
                raise ValueError(f"{name} is fixed for MetaMathQA; use max_attempts to allow retries")
        self.dataset = dataset
        self.data = load_records(
            resolve_source(dataset),
            split=split,
            fields=("query", "response"),
            optional=("type",),
            hint=OFFLINE_HINT,
        )
        if max_turns is None:
            max_turns = max(5, self.max_attempts)
        super().__init__(max_turns=max_turns, max_actions_per_turn=1, max_actions=self.max_attempts, **kwargs)
        self.index = 0
        self.question = ""
        self.gold = ""
        self.kind = ""
        self.attempts = 0
        self.solved = False
        self.last_answer = ""
        self.last_correct: bool | None = None

    def _make_observation_space(self) -> AnyText:
        return AnyText(self.obs_max_length)

    def _rules(self) -> str:
        retry = (
            f" You have {self.max_attempts} attempts; each retry halves the reward."
            if self.max_attempts > 1
            else " You have one attempt."
        )
        return (
            "Solve the math problem. Give only the final answer (a number or expression) as your answer."
            + retry
        )

    def example_response(self) -> str:
        answer = "<answer>42</answer>"
        return f"<think>...</think>{answer}" if self.think else answer

    def ragen_prompt(self) -> RagenPrompt | None:
        return RagenPrompt(_RAGEN_TEXT, None, 100)

    def _reset_game(self, options: dict[str, Any]) -> dict[str, Any]:
        index = pick_index(self.np_random, len(self.data), options.get("index"))
        row = self.data[index]
        gold = extract_gold(row["response"])
        if gold is None or not isinstance(row["query"], str):
            raise ValueError(f"dataset item {int(index)} has no 'The answer is:' marker in its response")
        question = row["query"]
        if len(question) > QUESTION_MAX_LENGTH:
            question = question[:QUESTION_MAX_LENGTH] + " [...]"
        self.index, self.question, self.gold = int(index), question, gold
        self.kind = str(row.get("type", "") or "")
        self.attempts = 0
        self.solved = False
        self.last_answer = ""
        self.last_correct = None
        return {"index": self.index, "type": self.kind, "gold_answer": self.gold}

    def _apply_action(self, action: str) -> tuple[dict[str, float], bool]:
        self.last_answer = action
        if self.checker == "math-verify":
            correct = math_verify_equivalent(action, self.gold)
        else:
            correct = is_equivalent(action, self.gold, strict=self.strict)
        self.last_correct = correct
        earlier = self.attempts
        self.attempts += 1
        if correct:
            self.solved = True
            return {"correct": self.reward_spec["correct"] / 2**earlier}, True
        return {"incorrect": self.reward_spec["incorrect"]}, True

    def _observation(self) -> str:
        if self.last_correct is None:
            return self.question
        return CORRECT_TEXT if self.last_correct else INCORRECT_TEXT

    def _is_terminated(self) -> bool:
        return self.solved or self.attempts >= self.max_attempts

    def _is_success(self) -> bool:
        return self.solved

    def _extra_info(self) -> dict[str, Any]:
        return {"attempts": self.attempts, "correct": self.last_correct}

    def expert_move(self) -> ExpertMove | None:
        """The data set's gold answer, with the item's worked solution (up to "The answer is") as the reasoning."""
        response = self.data[self.index].get("response", "")
        think = ""
        if isinstance(response, str) and extract_gold(response) is not None:
            lower = response.lower()
            think = response[: lower.rfind("the answer is")].strip()[-MAX_THINK_CHARS:]
        return ExpertMove(think, [self.gold])

    def card(self) -> dict[str, str]:
        """The renderer's view: title, question, the last answer and its verdict."""
        if self.last_correct is None:
            verdict = ""
        elif self.last_correct:
            verdict = f"correct ({self.reward_spec['correct'] / 2 ** (self.attempts - 1):g})"
        else:
            verdict = f"incorrect (attempt {self.attempts}/{self.max_attempts})"
        return {
            "title": "MetaMathQA",
            "question": self.question,
            "answer": self.last_answer,
            "verdict": verdict,
        }
