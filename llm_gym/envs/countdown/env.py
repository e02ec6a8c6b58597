"""Countdown: reach a target number with arithmetic over given numbers (RAGEN's Countdown, checked exactly)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from llm_gym.core import RewardSpec, TextEnv
from llm_gym.envs.countdown.arith import Reachable, evaluate, format_number, solve
from llm_gym.envs.task_data import load_records, pick_index

#: The RAGEN data set (Hugging Face id); pass it as ``dataset=`` to play its tasks.
RAGEN_DATASET = "Jiayi-Pan/Countdown-Tasks-3to4"
#: Most numbers in a generated puzzle; data-mode items with more get no reference solution (too slow to search).
SOLUTION_MAX_NUMBERS = 5
_MAX_ANSWER_LENGTH = 256


def _int_pair(name: str, value: Any, low: int) -> tuple[int, int]:
    try:
        a, b = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (min, max), got {value!r}") from None
    for v in (a, b):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must hold integers, got {value!r}")
    if not low <= a <= b:
        raise ValueError(f"{name} must satisfy {low} <= min <= max, got {value!r}")
    return int(a), int(b)


def generate_puzzle(
    rng: np.random.Generator,
    num_count: tuple[int, int] = (3, 4),
    number_range: tuple[int, int] = (1, 99),
    target_range: tuple[int, int] = (10, 100),
    allow_unused: bool = False,
    max_tries: int = 20,
) -> tuple[list[int], int, str]:
    """``(nums, target, solution)``: a solvable puzzle drawn from ``rng``.

    Draws the numbers, computes every value they reach exactly, and picks the target uniformly among the
    distinct integers reachable in ``target_range``. If ``max_tries`` draws reach no integer in range (rare,
    e.g. a narrow range), the last draw keeps the reachable integer nearest the range, so generation always ends.
    """
    best: tuple[int, list[int], Reachable, dict] | None = None
    lo, hi = target_range
    for _ in range(max_tries):
        k = int(rng.integers(num_count[0], num_count[1] + 1))
        nums = [int(x) for x in rng.integers(number_range[0], number_range[1] + 1, size=k)]
        solver = Reachable(nums)
        values = solver.values(allow_unused)
        ints = sorted(v for v in values if isinstance(v, int))
        candidates = [v for v in ints if lo <= v <= hi]
        if candidates:
            target = candidates[int(rng.integers(len(candidates)))]
            return nums, target, solver.expression(target, values[target])
        # The sum is always reachable, so ``ints`` is never empty.
        nearest = min(ints, key=lambda v: (max(lo - v, v - hi, 0), v))
        best = (nearest, nums, solver, values)
    assert best is not None
    target, nums, solver, values = best
    return nums, target, solver.expression(target, values[target])


@dataclass(frozen=True)
class Verdict:
    """How an answer scored: ``kind`` is ``"correct"``, ``"wrong_value"`` or ``"invalid"``."""

    kind: str
    value: Fraction | None = None
    error: str | None = None


def check_answer(answer: str, nums: Sequence[int], target: int, allow_unused: bool = False) -> Verdict:
    """Score a Countdown answer: an expression, optionally followed by ``= number`` (ignored when scoring)."""
    if not isinstance(answer, str):
        return Verdict("invalid", error="answer must be a str")
    if len(answer) > _MAX_ANSWER_LENGTH:
        return Verdict("invalid", error=f"answer longer than {_MAX_ANSWER_LENGTH} characters")
    expr = answer
    if "=" in answer:
        expr, _, claim = answer.partition("=")
        if "=" in claim:
            return Verdict("invalid", error="at most one '=' is allowed (expression = value)")
        stated = evaluate(claim.strip())
        if not stated.ok or len(stated.numbers) != 1:
            return Verdict("invalid", error="after '=' only the resulting number may follow")
    result = evaluate(expr)
    if not result.ok:
        return Verdict("invalid", error=result.error)
    if allow_unused:
        extra = Counter(result.numbers) - Counter(int(n) for n in nums)
        if extra:
            shown = ", ".join(format_number(x) for x in sorted(extra.elements()))
            return Verdict("invalid", error=f"uses numbers that are not available: [{shown}]")
    elif sorted(result.numbers) != sorted(nums):
        shown = ", ".join(format_number(x) for x in result.numbers)
        return Verdict(
            "invalid",
            error=f"uses [{shown}] but must use each of {sorted(int(n) for n in nums)} exactly once",
        )
    if result.value == target:
        return Verdict("correct", result.value)
    return Verdict("wrong_value", result.value)


class CountdownEnv(TextEnv):
    """Combine the given numbers with ``+ - * /`` and parentheses to reach the target.

    ## Description
    RAGEN's Countdown. By default puzzles are generated from ``np_random``: 3 to 4 numbers in 1..99, and an
    integer target in 10..100 chosen uniformly among the integers those numbers reach, so every puzzle is
    solvable (an exact rational solver checks it; a reference solution is in the reset ``info["solution"]``).
    With ``dataset=`` the tasks come from a file or a Hugging Face data set instead (RAGEN uses
    ``Jiayi-Pan/Countdown-Tasks-3to4``).

    ## Action
    One arithmetic expression in ``<answer>...</answer>``, e.g. ``(44 - 19) * 4``: non-negative integer literals,
    ``+ - * /`` (exact division), parentheses and unary minus. It must use each given number exactly once
    (``allow_unused=True``: at most once). A trailing ``= value`` is accepted and ignored. It is evaluated by
    llm-gym's own parser, never ``eval``; powers, decimals, names, unicode digits, division by zero, more than
    256 characters or 32 nesting levels score 0 with the reason in ``info["answer_error"]``.

    ## Observation
    ``Target: 50, nums: [6, 4, 5]``; after the answer a second line gives the points and why.

    ## Rewards
    ``correct`` 1.0 when the expression equals the target; ``format_score`` 0.1 for a valid expression with the
    right numbers but another value; 0 otherwise; ``format_penalty`` -0.1 for a response without the tags.

    ## Episode end
    Terminated after the first well-formed answer (one action per episode); truncated after ``max_turns``
    (default 5, RAGEN's base config; the RAGEN-2 paper uses 1) responses without one.

    ## Arguments
    ``num_count`` ((3, 4), at most 5), ``number_range`` ((1, 99)), ``target_range`` ((10, 100)),
    ``allow_unused`` (False), ``dataset`` (None: generate; a ``.json``/``.jsonl``/``.parquet`` path or a hub id
    with ``target`` and ``nums`` fields), ``split`` ("train"), ``max_turns`` (5) and the common ``TextEnv``
    arguments.
    ``reset(options={"nums": [...], "target": t})`` plays a given puzzle; ``options={"index": i}`` a given
    data-set item.

    ## Version history
    * v0: initial version.
    """

    game_reward_spec = RewardSpec.of(
        ("correct", 1.0, "the expression reaches the target"),
        ("format_score", 0.1, "valid expression with the right numbers but a different value"),
    )
    action_names = None
    action_sep = None

    def __init__(
        self,
        *,
        num_count: tuple[int, int] = (3, 4),
        number_range: tuple[int, int] = (1, 99),
        target_range: tuple[int, int] = (10, 100),
        allow_unused: bool = False,
        dataset: str | os.PathLike | None = None,
        split: str = "train",
        max_turns: int = 5,
        **kwargs: Any,
    ):
        self.num_count = _int_pair("num_count", num_count, 1)
        if self.num_count[1] > SOLUTION_MAX_NUMBERS:
            raise ValueError(f"num_count allows at most {SOLUTION_MAX_NUMBERS} numbers, got {num_count!r}")
        self.number_range = _int_pair("number_range", number_range, 0)
        self.target_range = _int_pair("target_range", target_range, -(10**9))
        self.allow_unused = bool(allow_unused)
        for name in ("max_actions_per_turn", "max_actions"):
            if kwargs.pop(name, 1) != 1:
                raise ValueError(f"{name} is fixed to 1 for Countdown (one answer per episode)")
        self.data = None
        if dataset is not None:
            self.data = load_records(
                dataset,
                split=split,
                fields=("target", "nums"),
                hint="Use a local file instead: dataset='path/to/tasks.jsonl' (fields target, nums), "
                "or dataset=None to generate puzzles.",
            )
        super().__init__(max_turns=max_turns, max_actions_per_turn=1, max_actions=1, **kwargs)
        self.nums: list[int] = []
        self.target = 0
        self.index: int | None = None
        self.solution: str | None = None
        self.last_answer = ""
        self.verdict: Verdict | None = None

    # ------------------------------------------------------------------------------------------- game
    def _rules(self) -> str:
        use = "at most once" if self.allow_unused else "exactly once"
        return (
            "Countdown: combine the given numbers with +, -, *, / and parentheses so that the expression equals "
            f"the target. Use each number {use}. Answer with the expression only, e.g. (44 - 19) * 4."
        )

    def example_response(self) -> str:
        answer = "<answer>(6 + 4) * 5</answer>"
        return f"<think>...</think>{answer}" if self.think else answer

    def _reset_game(self, options: dict[str, Any]) -> dict[str, Any]:
        self.index = None
        if "nums" in options or "target" in options:
            self.nums, self.target = self._task(options.get("nums"), options.get("target"), "options")
            self.solution = self._solve()
        elif self.data is not None:
            self.index = pick_index(self.np_random, len(self.data), options.get("index"))
            row = self.data[self.index]
            self.nums, self.target = self._task(row["nums"], row["target"], f"record {self.index}")
            self.solution = self._solve()
        else:
            self.nums, self.target, self.solution = generate_puzzle(
                self.np_random, self.num_count, self.number_range, self.target_range, self.allow_unused
            )
        self.last_answer = ""
        self.verdict = None
        return {"solution": self.solution, "index": self.index}

    @staticmethod
    def _task(nums: Any, target: Any, where: str) -> tuple[list[int], int]:
        def is_int(x: Any) -> bool:
            return not isinstance(x, bool) and isinstance(x, (int, np.integer))

        if isinstance(nums, np.ndarray):
            nums = nums.tolist()
        if (
            not isinstance(nums, (list, tuple, np.ndarray))
            or not nums
            or not all(is_int(x) and x >= 0 for x in nums)
        ):
            raise ValueError(f"{where}: nums must be a non-empty list of non-negative integers, got {nums!r}")
        if not is_int(target):
            raise ValueError(f"{where}: target must be an integer, got {target!r}")
        return [int(x) for x in nums], int(target)

    def _solve(self) -> str | None:
        if len(self.nums) > SOLUTION_MAX_NUMBERS:
            return None
        return solve(self.nums, self.target, self.allow_unused)

    def _apply_action(self, action: str) -> tuple[dict[str, float], bool]:
        self.last_answer = action
        self.verdict = check_answer(action, self.nums, self.target, self.allow_unused)
        spec = self.reward_spec
        if self.verdict.kind == "correct":
            return {"correct": spec["correct"]}, True
        if self.verdict.kind == "wrong_value":
            return {"format_score": spec["format_score"]}, True
        return {}, True

    def _points(self) -> float:
        spec = self.reward_spec
        kind = self.verdict.kind if self.verdict else ""
        return {"correct": spec["correct"], "wrong_value": spec["format_score"]}.get(kind, 0.0)

    def _feedback(self) -> str:
        v = self.verdict
        assert v is not None
        if v.kind == "correct":
            why = "it reaches the target."
        elif v.kind == "wrong_value":
            shown = format_number(v.value)
            why = f"it equals {shown if len(shown) <= 40 else 'another value'}, not {self.target}."
        else:
            why = f"invalid answer: {v.error}."
        return f"Your answer scores {self._points():g}: {why}"

    def _observation(self) -> str:
        head = f"Target: {self.target}, nums: {self.nums}"
        return head if self.verdict is None else f"{head}\n{self._feedback()}"

    def _is_terminated(self) -> bool:
        return self.verdict is not None

    def _is_success(self) -> bool:
        return self.verdict is not None and self.verdict.kind == "correct"

    def _extra_info(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "target": self.target,
            "nums": list(self.nums),
            "answer_error": v.error if v is not None else None,
            "answer_value": format_number(v.value) if v is not None and v.value is not None else None,
        }

    def card(self) -> dict[str, str]:
        """The renderer's view: title, question, the last answer and its verdict."""
        v = self.verdict
        if v is None:
            verdict = ""
        elif v.kind == "correct":
            verdict = "correct"
        elif v.kind == "wrong_value":
            verdict = f"incorrect ({self._points():g})"
        else:
            reason = v.error or ""
            verdict = f"invalid: {reason if len(reason) <= 60 else reason[:57] + '...'}"
        return {
            "title": "Countdown",
            "question": f"Target: {self.target}, nums: {self.nums}",
            "answer": self.last_answer,
            "verdict": verdict,
        }
