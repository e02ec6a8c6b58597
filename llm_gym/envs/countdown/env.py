"""Countdown: reach a target number with arithmetic over given numbers (RAGEN's Countdown, checked exactly)."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from llm_gym.core import ExpertMove, RagenPrompt, RewardSpec, TextEnv
from llm_gym.core.checks import is_int
from llm_gym.core.env import check_answer_sep
from llm_gym.envs.countdown.arith import (
    OPERATORS,
    PLUS_MINUS_MAX_NUMBERS,
    Reachable,
    check_operators,
    evaluate,
    format_number,
    plus_minus_solvable,
    solve,
)
from llm_gym.envs.task_data import load_records, pick_index

#: The RAGEN data set (Hugging Face id); pass it as ``dataset=`` to play its tasks.
RAGEN_DATASET = "Jiayi-Pan/Countdown-Tasks-3to4"
#: Most numbers in a generated puzzle; data-mode items with more get no reference solution (too slow to search).
SOLUTION_MAX_NUMBERS = 5
_MAX_ANSWER_LENGTH = 256
#: Largest number a puzzle may show (``number_range``, data-set and ``options`` numbers): keeps the numbers inside
#: numpy's int64 draws and the solver's exact arithmetic small.
NUMBER_MAX = 10**6
#: Largest target magnitude (``target_range``, data-set and ``options`` targets).
TARGET_MAX = 10**9
#: Reachable values computed over all draws of one generated puzzle (~1 s; a five-number draw computes ~34,000,
#: so wide number ranges that rarely hit ``target_range`` cannot cost 20 such draws, ~14 s, per reset).
GENERATION_WORK_MAX = 100_000
#: Most numbers in a data-set or ``options`` task (generated puzzles are capped by ``SOLUTION_MAX_NUMBERS``).
TASK_MAX_NUMBERS = 64
#: ``dataset="ragen"`` stands for these settings (``ragen/env/countdown/env.py`` and ``config.py``): the hub data,
#: its first 20,000 rows, only puzzles solvable with + and - (``has_solution``), item ``seed % len``.
RAGEN_DATA_SETTINGS: dict[str, Any] = {
    "dataset": RAGEN_DATASET,
    "max_rows": 20_000,
    "operators": "+-",
    "index_by": "seed",
}
# RAGEN's instruction for Countdown, verbatim (RAGEN-2's protocol is defined by it; config/envs.yaml:129, with
# max_tokens 100 at :130). RAGEN's Countdown config has no symbol legend or action lookup.
_RAGEN_TEXT = (
    "You are solving the Countdown puzzle. You should use the num list to create an equation that equals the "
    "target. Example answer format: <think> To find an equation using [3, 5, 2] to get 4. Let's check 2 + 5 = 7, "
    "7 - 3 = 4. So the answer is 2 + 5 - 3 = 4. </think><answer>2 + 5 - 3</answer>"
)
INDEX_MODES = ("random", "seed")
# Row indices kept by (source, split, max_rows, operators): the filter reads every row once per process.
_KEPT: dict[tuple, list[int]] = {}


#: Operators a random answer (:meth:`CountdownEnv.sample_valid_action`) draws from.
_RANDOM_OPS = ("+", "-", "*", "/")


def random_expression(nums: Sequence[int], rng: np.random.Generator, allow_unused: bool) -> str:
    """A random left-nested expression over ``nums`` (all of them, or a random non-empty subset)."""
    order = [int(nums[i]) for i in rng.permutation(len(nums))]
    if allow_unused and len(order) > 1:
        order = order[: int(rng.integers(1, len(order) + 1))]
    expr = str(order[0])
    for i, x in enumerate(order[1:]):
        op = _RANDOM_OPS[int(rng.integers(len(_RANDOM_OPS)))]
        expr = f"({expr} {op} {x})" if i < len(order) - 2 else f"{expr} {op} {x}"
    return expr


def _int_pair(name: str, value: Any, low: int, high: int) -> tuple[int, int]:
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{name} must be a pair (min, max), got {value!r:.60}")
    try:
        a, b = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (min, max), got {value!r:.60}") from None
    for v in (a, b):
        if not is_int(v):
            raise ValueError(f"{name} must hold integers, got {value!r:.60}")
    if not low <= a <= b <= high:
        raise ValueError(f"{name} must satisfy {low} <= min <= max <= {high}, got {value!r:.60}")
    return int(a), int(b)


def reachable_bounds(
    num_count: tuple[int, int], number_range: tuple[int, int], operators: str
) -> tuple[int, int]:
    """``(low, high)`` enclosing every value a puzzle of ``num_count`` numbers from ``number_range`` can reach.

    A value built from ``k`` numbers in ``[0, h]`` is ``p/q`` in lowest terms with ``q >= 1``; ``+`` gives
    ``p1*q2 + p2*q1``, ``*`` and ``/`` products of the parts, so ``|p|`` and ``q`` stay below ``2**(k-1) * h**k``
    (``k*h`` with ``+`` and ``-`` alone). Without ``-`` nothing is negative (the numbers are not)."""
    k, h = num_count[1], max(number_range[1], 1)
    high = k * h if set(operators) <= set("+-") else 2 ** (k - 1) * h**k
    return (-high if "-" in operators else 0), high


def _check_target_range(
    num_count: tuple[int, int], number_range: tuple[int, int], target_range: tuple[int, int], operators: str
) -> None:
    low, high = reachable_bounds(num_count, number_range, operators)
    if target_range[1] < low or target_range[0] > high:
        raise ValueError(
            f"target_range {target_range} is unreachable: {num_count[1]} numbers from {number_range} with "
            f"operators {operators!r} reach only values in [{low}, {high}]"
        )


def generate_puzzle(
    rng: np.random.Generator,
    num_count: tuple[int, int] = (3, 4),
    number_range: tuple[int, int] = (1, 99),
    target_range: tuple[int, int] = (10, 100),
    allow_unused: bool = False,
    max_tries: int = 20,
    operators: str = OPERATORS,
) -> tuple[list[int], int, str]:
    """``(nums, target, solution)``: a solvable puzzle drawn from ``rng``, its target in ``target_range``.

    Draws the numbers, computes every value they reach exactly, and picks the target uniformly among the
    distinct integers reachable in ``target_range``. Work is bounded: at most ``max_tries`` draws and
    :data:`GENERATION_WORK_MAX` reachable values computed over all of them (a draw of five numbers computes
    ~34,000). Raises ``ValueError`` when ``target_range`` cannot be reached at all (decided before drawing, see
    :func:`reachable_bounds`) or was not reached within those bounds: the target is never outside the range.
    ``operators`` restricts the expressions considered (``"+-"``: puzzles solvable with ``+`` and ``-`` alone, the
    offline counterpart of RAGEN's filtered data); the reference solution uses only those operators.
    """
    operators = check_operators(operators)
    _check_target_range(num_count, number_range, target_range, operators)
    lo, hi = target_range
    work = 0
    tries = 0
    while tries < max_tries and work < GENERATION_WORK_MAX:
        tries += 1
        k = int(rng.integers(num_count[0], num_count[1] + 1))
        nums = [int(x) for x in rng.integers(number_range[0], number_range[1] + 1, size=k)]
        solver = Reachable(nums, operators)
        work += sum(len(t) for t in solver.table)
        values = solver.values(allow_unused)
        candidates = sorted(v for v in values if isinstance(v, int) and lo <= v <= hi)
        if candidates:
            target = candidates[int(rng.integers(len(candidates)))]
            return nums, target, solver.expression(target, values[target])
    raise ValueError(
        f"no puzzle with a target in {target_range} found in {tries} draws of {num_count} numbers from "
        f"{number_range} (operators {operators!r}); widen target_range or narrow number_range"
    )


@dataclass(frozen=True)
class Verdict:
    """How an answer scored: ``kind`` is ``"correct"``, ``"wrong_value"`` or ``"invalid"``."""

    kind: str
    value: Fraction | None = None
    error: str | None = None


def check_answer_ragen(answer: str, nums: Sequence[int], target: int) -> Verdict:
    """Score an answer as RAGEN's ``compute_reward`` does (``ragen/env/countdown/env.py``).

    ``check_format``: the integers found in the whole answer (``re.findall(r"\\d+", ...)``, so also after an
    ``=``) sorted must equal the given numbers sorted, else 0 (``invalid``). ``check_correctness``: the answer's
    value must be within 1e-5 of the target (``correct``), else the format score (``wrong_value``); an answer that
    cannot be evaluated gets the format score too (RAGEN's ``eval`` raising). So ``2+3=5`` with numbers
    ``[2, 3, 5]`` gets the format score, and with ``[2, 3]`` gets 0. The value comes from llm-gym's parser, not
    ``eval``: forms only Python accepts (``**``, ``//``, ``%``) count as not evaluable here.
    """
    if not isinstance(answer, str):
        return Verdict("invalid", error="answer must be a str")
    if len(answer) > _MAX_ANSWER_LENGTH:
        return Verdict("invalid", error=f"answer longer than {_MAX_ANSWER_LENGTH} characters")
    found = sorted(int(n) for n in re.findall(r"\d+", answer))
    if found != sorted(int(n) for n in nums):
        shown = ", ".join(str(n) for n in found)
        return Verdict(
            "invalid",
            error=f"the numbers in the answer [{shown}] are not the given ones (RAGEN's check_format)",
        )
    result = evaluate(answer)
    if result.ok and result.value is not None and abs(result.value - target) < Fraction(1, 10**5):
        return Verdict("correct", result.value)
    return Verdict("wrong_value", result.value, None if result.ok else result.error)


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

    ## Starting state
    A puzzle generated from ``np_random``; with ``dataset=``, a data-set item (drawn with ``np_random``, or
    ``seed % len`` with ``index_by="seed"``, or ``options={"index": i}``); or the puzzle given as
    ``options={"nums": [...], "target": t}`` (data-set and ``options`` tasks: at most 64 numbers in [0, 10**6],
    a target in [-10**9, 10**9]).

    ## Rewards
    ``correct`` 1.0 when the expression equals the target; ``format_score`` 0.1 for a valid expression with the
    right numbers but another value; 0 otherwise; ``format_penalty`` -0.1 for a response without the tags.

    ## Episode end
    Terminated after the first well-formed answer (one action per episode); truncated after ``max_turns``
    (default 5, RAGEN's base config; the RAGEN-2 paper uses 1) responses without one.

    ## Information
    ``reset`` adds ``solution`` (a reference expression, ``None`` when none is known) and ``index`` (the data-set
    item, ``None`` for generated and given puzzles); every ``info`` adds ``target``, ``nums``, ``answer_error``
    and ``answer_value``.

    ## Arguments
    * ``num_count``: how many numbers, default ``(3, 4)``, at most 5.
    * ``number_range``: default ``(1, 99)``, within [0, 10**6].
    * ``target_range``: default ``(10, 100)``, within [-10**9, 10**9]. A range those numbers can never reach is a
      ``ValueError`` at construction, and a range no draw reached within the generation budget one at reset:
      the target is always in the range.
    * ``allow_unused``: each number may be used at most once instead of exactly once, default False.
    * ``operators``: default ``"+-*/"``; ``"+-"`` keeps generated puzzles and data-set items solvable with ``+``
      and ``-`` alone (RAGEN's filter; data sets accept only these two values).
    * ``dataset``: ``None`` (generate, default), a ``.json``/``.jsonl``/``.parquet`` path or a hub id with
      ``target`` and ``nums`` fields; ``"ragen"`` means ``dataset=RAGEN_DATASET, max_rows=20000,
      operators="+-", index_by="seed"`` (RAGEN's ``ragen/env/countdown/env.py``; offline it fails with a clear
      error, and ``operators="+-"`` on generated puzzles is the offline counterpart).
    * ``split``: default ``"train"``; ``max_rows``: keep the first rows of the data set, default ``None``.
    * ``index_by``: ``"random"`` (the item drawn from ``np_random``, default) or ``"seed"`` (item ``seed % len``
      as in RAGEN; random when reset without a seed).
    * ``max_turns``: default 5, and the common ``TextEnv`` arguments. With ``parse_mode="ragen"`` answers are
      scored by RAGEN's rule (:func:`check_answer_ragen`): the integers anywhere in the answer must be the given
      ones (so ``2+3=5`` scores 0 with ``[2, 3]`` and the format score 0.1 with ``[2, 3, 5]``), then the value
      must equal the target; ``allow_unused`` does not apply.
    * ``action_sep``: default ``None`` (the whole answer is the expression); ``"||"`` splits the answer on it and
      scores only the first part, as RAGEN does.

    ## Version history
    * v0: initial version; ``action_sep`` added later (its default keeps v0's behaviour).
    """

    game_reward_spec = RewardSpec.of(
        ("correct", 1.0, "the expression reaches the target"),
        ("format_score", 0.1, "valid expression with the right numbers but a different value"),
    )
    action_names = None
    action_sep = None
    expert_name = "reference-solution"
    data_kwargs = {"dataset": ()}  # a file or hub id: nothing bundled
    # num_count, the ranges and operators set the puzzle search's work; they stay the server operator's
    light_kwargs = ("allow_unused", "index_by", "action_sep")
    reset_options = ("index", "nums", "target")

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
        operators: str | None = None,
        max_rows: int | None = None,
        index_by: str | None = None,
        action_sep: str | None = None,
        **kwargs: Any,
    ):
        self.action_sep = check_answer_sep(action_sep)
        if isinstance(dataset, str) and dataset == "ragen":
            given = {"operators": operators, "max_rows": max_rows, "index_by": index_by}
            clash = [k for k, v in given.items() if v is not None and v != RAGEN_DATA_SETTINGS[k]]
            if clash:
                raise ValueError(
                    f"dataset='ragen' fixes {', '.join(clash)}; use dataset={RAGEN_DATASET!r} to vary them"
                )
            dataset, max_rows = RAGEN_DATASET, RAGEN_DATA_SETTINGS["max_rows"]
            operators, index_by = RAGEN_DATA_SETTINGS["operators"], RAGEN_DATA_SETTINGS["index_by"]
        self.operators = check_operators(OPERATORS if operators is None else operators)
        self.index_by = "random" if index_by is None else index_by
        if self.index_by not in INDEX_MODES:
            raise ValueError(f"index_by must be one of {INDEX_MODES}, got {index_by!r}")
        if max_rows is not None and (not is_int(max_rows, numpy=False) or max_rows < 1):
            raise ValueError(f"max_rows must be a positive integer or None, got {max_rows!r}")
        if dataset is not None and self.operators not in (OPERATORS, "+-"):
            raise ValueError(f"data sets can be filtered with operators='+-' only, got {self.operators!r}")
        self.num_count = _int_pair("num_count", num_count, 1, SOLUTION_MAX_NUMBERS)
        self.number_range = _int_pair("number_range", number_range, 0, NUMBER_MAX)
        self.target_range = _int_pair("target_range", target_range, -TARGET_MAX, TARGET_MAX)
        if dataset is None:  # generated puzzles: refuse a range no draw can reach now, not at every reset
            _check_target_range(self.num_count, self.number_range, self.target_range, self.operators)
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
                "or dataset=None to generate puzzles (operators='+-' for puzzles like RAGEN's filtered data).",
            )
        self.max_rows = max_rows
        self._kept: list[int] | None = None
        if self.data is not None and (max_rows is not None or self.operators != OPERATORS):
            assert dataset is not None  # the data was loaded from it
            key = (os.fspath(dataset), split, max_rows, self.operators)
            kept = _KEPT.get(key)
            if kept is None:
                n = len(self.data) if max_rows is None else min(max_rows, len(self.data))
                kept = [i for i in range(n) if self._keep(self.data[i])]
                if not kept:
                    raise ValueError(f"no item of {os.fspath(dataset)!r} is solvable with {self.operators!r}")
                _KEPT[key] = kept
            self._kept = kept
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

    def ragen_prompt(self) -> RagenPrompt | None:
        return RagenPrompt(_RAGEN_TEXT, None, 100)

    def _reset_game(self, options: dict[str, Any]) -> dict[str, Any]:
        self.index = None
        if options.get("index") is not None and self.data is None:  # silently ignoring it hid the mistake
            raise ValueError(
                "options['index'] picks a data-set item; this env generates puzzles (dataset=None)"
            )
        if "nums" in options or "target" in options:
            self.nums, self.target = self._task(options.get("nums"), options.get("target"), "options")
            self.solution = self._solve()
        elif self.data is not None:
            n = len(self.data) if self._kept is None else len(self._kept)
            index = options.get("index")
            if index is None and self.index_by == "seed" and self.reset_seed is not None:
                index = self.reset_seed % n
            self.index = pick_index(self.np_random, n, index)
            row = self.data[self.index if self._kept is None else self._kept[self.index]]
            self.nums, self.target = self._task(row["nums"], row["target"], f"record {self.index}")
            self.solution = self._solve()
        else:
            self.nums, self.target, self.solution = generate_puzzle(
                self.np_random,
                self.num_count,
                self.number_range,
                self.target_range,
                self.allow_unused,
                operators=self.operators,
            )
        self.last_answer = ""
        self.verdict = None
        return {"solution": self.solution, "index": self.index}

    @staticmethod
    def _task(nums: Any, target: Any, where: str) -> tuple[list[int], int]:
        if isinstance(nums, np.ndarray):
            nums = nums.tolist()
        if (
            not isinstance(nums, (list, tuple, np.ndarray))
            or not 0 < len(nums) <= TASK_MAX_NUMBERS
            or not all(is_int(x) and 0 <= x <= NUMBER_MAX for x in nums)
        ):
            raise ValueError(
                f"{where}: nums must be a list of 1 to {TASK_MAX_NUMBERS} non-negative integers of at most {NUMBER_MAX}, "
                f"got {nums!r:.80}"
            )
        if not is_int(target) or abs(target) > TARGET_MAX:
            raise ValueError(
                f"{where}: target must be an integer in [-{TARGET_MAX}, {TARGET_MAX}], got {target!r:.40}"
            )
        return [int(x) for x in nums], int(target)

    def _keep(self, row: Any) -> bool:
        """Whether a data-set row passes the ``operators`` filter (malformed rows are dropped)."""
        if self.operators == OPERATORS:
            return True
        nums, target = row.get("nums"), row.get("target")
        if isinstance(nums, np.ndarray):
            nums = nums.tolist()
        if not isinstance(nums, (list, tuple)) or not 0 < len(nums) <= PLUS_MINUS_MAX_NUMBERS:
            return False
        if not all(is_int(x) for x in nums):
            return False
        if not is_int(target):
            return False
        return plus_minus_solvable([int(x) for x in nums], int(target))

    def _solve(self) -> str | None:
        if len(self.nums) > SOLUTION_MAX_NUMBERS:
            return None
        return solve(self.nums, self.target, self.allow_unused)

    def _apply_action(self, action: str) -> tuple[dict[str, float], bool]:
        self.last_answer = action
        if self.parse_mode == "ragen":
            self.verdict = check_answer_ragen(action, self.nums, self.target)
        else:
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
        elif v.kind == "wrong_value" and v.value is None:  # RAGEN's rule: right numbers, not evaluable
            why = f"the numbers are right but the answer cannot be evaluated ({v.error})."
        elif v.kind == "wrong_value" and v.value is not None:
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

    # ------------------------------------------------------------------------------- family knowledge
    def _random_answer(self, rng: np.random.Generator, actions_per_turn: int) -> list[str]:
        # A random expression over the shown numbers (one answer per turn, whatever actions_per_turn says).
        if not self.nums:
            raise ValueError("reset the Countdown env before asking for an action")
        return [random_expression(self.nums, rng, self.allow_unused)]

    def optimum_solves(self, info: Mapping[str, Any]) -> bool | None:
        return info.get("solution") is not None

    def expert_move(self) -> ExpertMove | None:
        """The reference expression the exact solver found at reset (``info["solution"]``)."""
        if not self.solution:
            return None
        return ExpertMove(f"{self.solution} = {self.target}, using the numbers {self.nums}.", [self.solution])

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
