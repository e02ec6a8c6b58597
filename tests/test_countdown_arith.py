"""The safe expression evaluator and the exact Countdown solver (llm_gym.envs.countdown.arith)."""

from __future__ import annotations

import itertools
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gym.envs.countdown.arith import Reachable, evaluate, format_number, reachable, solve


@pytest.mark.parametrize(
    ("text", "value", "numbers"),
    [
        ("1+2*3", 7, (1, 2, 3)),
        ("(1+2)*3", 9, (1, 2, 3)),
        ("8/3", Fraction(8, 3), (8, 3)),
        ("6/(1-3/4)", 24, (6, 1, 3, 4)),
        ("-3+5", 2, (3, 5)),
        ("2*-3", -6, (2, 3)),
        ("- - 4", 4, (4,)),
        ("10-2-3", 5, (10, 2, 3)),
        ("64/4/2", 8, (64, 4, 2)),
        ("  ( 7 )  ", 7, (7,)),
        ("007", 7, (7,)),
    ],
)
def test_evaluate_values(text, value, numbers):
    result = evaluate(text)
    assert result.ok, result.error
    assert result.value == value
    assert result.numbers == numbers


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("2**3", "powers"),
        ("2^3", "powers"),
        ("1/0", "division by zero"),
        ("5/(3-3)", "division by zero"),
        ("3.5+1", "decimal"),
        ("x+1", "names"),
        ("__import__('os')", "names"),
        ("abs(-3)", "names"),
        ("\u0661+2", "ASCII digits"),  # Arabic-Indic one
        ("\uff11+2", "ASCII digits"),  # fullwidth one
        ("1+2=3", "'='"),
        ("9" * 13, "digits"),
        ("(" * 40 + "1" + ")" * 40, "nested"),
        ("-" * 40 + "1", "nested"),
        ("1+" * 200 + "1", "longer than"),
        ("(1+2", "unbalanced"),
        ("1+2)", "unbalanced"),
        ("", "empty"),
        ("1 2", "two numbers"),
        ("+3", "unary plus"),
        ("3+", "ends unexpectedly"),
        ("999999999999*" * 15 + "9", "too large"),
        ("1,000", "unexpected character"),
        ("1\u00a0+2", "unexpected character"),
    ],
)
def test_evaluate_rejects_with_reason(text, reason):
    result = evaluate(text)
    assert not result.ok
    assert result.value is None
    assert reason in result.error


def test_evaluate_decimals_when_allowed():
    assert evaluate("0.1+0.2", allow_decimals=True).value == Fraction(3, 10)
    assert evaluate(".5", allow_decimals=True).value == Fraction(1, 2)
    assert evaluate("2.", allow_decimals=True).value == 2


def test_evaluate_non_str():
    assert evaluate(None).error.startswith("expression must be a str")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- random well-formed trees
def _trees(max_leaves: int = 6):
    leaf = st.integers(0, 50).map(lambda n: (str(n), Fraction(n)))

    def extend(children):
        def build(op, a, b):
            (sa, va), (sb, vb) = a, b
            if op == "/":
                if vb == 0:
                    return (f"({sa})+({sb})", va + vb)
                return (f"({sa})/({sb})", va / vb)
            value = {"+": va + vb, "-": va - vb, "*": va * vb}[op]
            return (f"({sa}){op}({sb})", value)

        neg = children.map(lambda t: (f"-({t[0]})", -t[1]))
        return st.one_of(st.builds(build, st.sampled_from("+-*/"), children, children), neg)

    return st.recursive(leaf, extend, max_leaves=max_leaves)


@settings(max_examples=300, deadline=None)
@given(_trees())
def test_evaluate_matches_tree_value(tree):
    text, value = tree
    result = evaluate(text, max_length=10_000, max_depth=100)
    assert result.ok, (text, result.error)
    assert result.value == value


_ALPHABET = st.sampled_from(
    list("0123456789+-*/()^.= x\t\n\u0661\uff11") + ["**", "99999999999999", "(((", ")))"]
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=300), st.lists(_ALPHABET, max_size=200).map("".join)))
def test_evaluate_never_raises_and_is_fast(text):
    start = time.perf_counter()
    result = evaluate(text)
    assert time.perf_counter() - start < 0.05
    assert (result.value is None) == (result.error is not None)
    if result.ok:
        assert isinstance(result.value, Fraction)


def test_evaluate_worst_case_inputs_are_fast():
    hostile = [
        "9" * 1_000_000,
        "(" * 100_000,
        "-" * 100_000 + "1",
        "1*" * 127 + "1",
        "(999999999999*999999999999)*" * 9 + "1",
        "1/" * 127 + "1",
    ]
    for text in hostile:
        start = time.perf_counter()
        result = evaluate(text)
        assert time.perf_counter() - start < 0.2
        assert result.error is not None or result.value is not None


# ------------------------------------------------------------------------------------------ solver
def _brute_force(nums: list[int], allow_unused: bool = False) -> set[Fraction]:
    """Every value of every expression tree over every ordering of the numbers (independent of arith)."""

    def values(seq: tuple[Fraction, ...]) -> set[Fraction]:
        if len(seq) == 1:
            return {seq[0]}
        out = set()
        for cut in range(1, len(seq)):
            for a in values(seq[:cut]):
                for b in values(seq[cut:]):
                    out.update((a + b, a - b, a * b))
                    if b != 0:
                        out.add(a / b)
        return out

    result: set[Fraction] = set()
    sizes = range(1, len(nums) + 1) if allow_unused else [len(nums)]
    for k in sizes:
        for combo in itertools.combinations(range(len(nums)), k):
            for perm in itertools.permutations([Fraction(nums[i]) for i in combo]):
                result |= values(perm)
    return result


@pytest.mark.parametrize("allow_unused", [False, True])
def test_solver_agrees_with_brute_force(allow_unused):
    rng = np.random.default_rng(0)
    cases = [[int(x) for x in rng.integers(0, 13, size=k)] for k in (1, 2, 2, 3, 3, 3, 3, 4, 4)]
    cases += [[3, 3, 8, 8], [1, 1, 1, 1], [0, 5, 5], [7, 7, 7]]
    for nums in cases:
        expected = _brute_force(nums, allow_unused)
        got = set(Reachable(nums).values(allow_unused))
        assert got == expected, nums
        for target in range(-30, 61):
            expr = solve(nums, target, allow_unused)
            assert (expr is not None) == (target in expected), (nums, target)
            if expr is not None:
                result = evaluate(expr)
                assert result.value == target
                used = sorted(result.numbers)
                if allow_unused:
                    assert all(used.count(n) <= nums.count(n) for n in used)
                else:
                    assert used == sorted(nums)


def test_reachable_expressions_are_exact():
    nums = [3, 3, 8, 8]
    table = reachable(nums)
    assert 24 in table and evaluate(table[24]).value == 24  # 8 / (3 - 8 / 3)
    for value, expr in table.items():
        result = evaluate(expr)
        assert result.value == value
        assert sorted(result.numbers) == nums


def test_solve_known_puzzles():
    assert evaluate(solve([1, 3, 4, 6], 24)).value == 24
    assert solve([1, 1, 1, 1], 24) is None
    assert solve([5], 5) == "5"
    assert solve([2, 5], 5) is None and solve([2, 5], 5, allow_unused=True) == "5"


def test_solver_input_validation():
    with pytest.raises(ValueError):
        solve([1, -2], 3)
    with pytest.raises(ValueError):
        solve([], 3)
    with pytest.raises(ValueError):
        solve([1] * 7, 7)
    with pytest.raises(ValueError):
        solve([1.5, 2], 3)  # type: ignore[list-item]


def test_format_number():
    assert format_number(Fraction(5, 2)) == "5/2"
    assert format_number(-3) == "-3"
