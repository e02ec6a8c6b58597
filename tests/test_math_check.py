"""Answer extraction and equivalence for math answers (llm_gym.envs.metamathqa.math_check)."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gym.envs.metamathqa.math_check import (
    clean_answer,
    extract_gold,
    is_equivalent,
    last_boxed,
    lone_number,
    normalize_strict,
    to_number,
)

EQUIVALENT = [
    ("0.5", "1/2"),
    ("1/2", "\\frac{1}{2}"),
    ("\\dfrac{1}{2}", "0.5"),
    ("\\frac12", "0.5"),
    ("1,000", "1000"),
    ("1000", "1,000"),
    ("1,234,567.5", "1234567.5"),
    ("-3", "-3"),
    ("\u22123", "-3"),
    ("-\\frac{3}{4}", "-0.75"),
    ("\\frac{-3}{4}", "-3/4"),
    ("3.0", "3"),
    ("3.", "3"),
    ("03", "3"),
    ("\\boxed{12}", "12"),
    ("The answer is \\boxed{\\frac{5}{6}}", "\\frac{5}{6}"),
    ("$12$", "12"),
    ("\\(12\\)", "12"),
    ("The answer is 12 dollars", "12"),
    ("The answer is: 12", "12"),
    ("12 dollars", "12"),
    ("$12.50", "12.5"),
    ("\\$31.60", "31.60"),
    ("x = 12", "12"),
    ("x = -4", "-4"),
    ("12 square centimeters", "12"),
    ("12.", "12"),
    ("50%", "50"),
    ("50\\%", "50"),
    ("90^\\circ", "90"),
    ("10", "10\\text{ inches}"),
    ("(1, 2)", "(1,2)"),
    ("(0.5, 1)", "(\\frac{1}{2}, 1)"),
    ("\\frac{\\pi}{2}", "\\dfrac{\\pi}{2}"),
    ("9\\pi", "9 \\pi"),
    ("\\left(4, 6\\right)", "(4,6)"),
    ("X", "x"),
    ("\\text{(A)}", "(A)"),
    ("2\\sqrt{3}", "2 \\sqrt{3}"),
    ("3.5", "3\\frac{1}{2}"),  # a mixed number is whole + fraction
    ("7/2", "3\\frac12"),
    ("-3.5", "-3\\frac{1}{2}"),
    ("x = 2\\frac{3}{4}", "2.75"),
]

NOT_EQUIVALENT = [
    ("13", "12"),
    ("2x", "2"),
    ("12 or 13", "12"),
    ("not 12", "12"),
    ("approximately 12", "12"),
    ("between 11 and 13", "12"),
    ("1,2", "12"),
    ("1,2", "1.2"),
    ("2\\pi", "2"),
    ("(1,2)", "(2,1)"),
    ("(1,2)", "12"),
    ("12", "1/0"),
    ("-12", "12"),
    ("12", "x^2+1"),
    ("0.333", "1/3"),
    ("5-3", "2"),
    ("2+3", "5"),
    ("A", "B"),
    ("", "12"),
    ("12", ""),
    ("\\boxed{}", "12"),
    ("12 cm^2", "12"),
    ("x=12, y=3", "12"),
    ("12/", "12"),
    ("0.5", "50%"),
    ("(1,2,3)", "(1,2)"),
    ("[1, 1,000]", "[1, 1000]"),  # inside brackets a comma separates elements
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("\\sqrt{2}", "2"),
    ("15.5", "3\\frac{1}{2}"),  # not "31/2"
    ("31/2", "3\\frac{1}{2}"),
    ("-2.5", "-3\\frac{1}{2}"),
    ("1/23", "\\frac{1}{2}3"),  # a digit after a fraction is not glued on
    ("0.5", "\\frac{1}{2}3"),
]


@pytest.mark.parametrize(("pred", "gold"), EQUIVALENT)
def test_equivalent(pred, gold):
    assert is_equivalent(pred, gold)


@pytest.mark.parametrize(("pred", "gold"), NOT_EQUIVALENT)
def test_not_equivalent(pred, gold):
    assert not is_equivalent(pred, gold)


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("12", "12", True),
        (" 1 2 ", "12", True),  # RAGEN's rule deletes every whitespace character
        ("\\Frac{1}{2}", "\\frac{1}{2}", True),
        ("0.5", "\\frac{1}{2}", False),
        ("\\boxed{12}", "12", False),
        ("1,000", "1000", False),
        ("12 dollars", "12", False),
    ],
)
def test_strict_is_ragens_rule(pred, gold, expected):
    assert is_equivalent(pred, gold, strict=True) is expected
    assert (normalize_strict(pred) == normalize_strict(gold)) is expected


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([p for pair in EQUIVALENT + NOT_EQUIVALENT for p in pair]),
    st.text(" \t\n", max_size=3),
)
def test_lenient_accepts_everything_strict_accepts(text, noise):
    # Case and whitespace changes keep strict equality, so lenient must agree (e.g. "\\Boxed{1}" vs "\\boxed{1}").
    pred = noise + text.upper() + noise
    # An empty gold answer matches nothing in strict mode (RAGEN: ``if self.correct_answer``).
    assert is_equivalent(pred, text, strict=True) == bool(normalize_strict(text))
    assert is_equivalent(pred, text)


def test_extract_gold():
    assert extract_gold("So x = 3.\nThe answer is: \\frac{1}{2}") == "\\frac{1}{2}"
    assert extract_gold("The answer is 5. Wait.\nThe answer is: 7") == "7"
    assert extract_gold("no marker here") is None
    assert extract_gold(None) is None  # type: ignore[arg-type]


def test_helpers():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{3}") == "3"
    assert last_boxed("\\boxed{{1}") is None
    assert last_boxed("\\boxed 3") is None
    assert clean_answer("The answer is $\\boxed{12}$.") == "12"
    assert to_number("\\frac{3}{4}") == Fraction(3, 4)
    assert to_number("1,0000") is None
    assert to_number("1 2") is None
    assert lone_number("about 12 apples") is None
    assert lone_number("12 apples") == 12
    assert is_equivalent(None, "1") is False  # type: ignore[arg-type]


@st.composite
def _fractions(draw):
    num = draw(st.integers(-(10**6), 10**6))
    den = draw(st.sampled_from([1, 2, 4, 5, 8, 10, 20, 25, 100, 1000]))
    return Fraction(num, den)


@settings(max_examples=200, deadline=None)
@given(_fractions())
def test_numeric_spellings_agree(x):
    sign = "-" if x < 0 else ""
    a = abs(x)
    decimal = f"{sign}{float(a):.3f}" if a.denominator > 1 else f"{x.numerator}"
    spellings = [
        f"{x.numerator}/{x.denominator}",
        f"{sign}\\frac{{{a.numerator}}}{{{a.denominator}}}",
        decimal,
        f"$\\boxed{{{decimal}}}$",
        f"The answer is {decimal}.",
    ]
    if a.denominator == 1 and a >= 1000:
        spellings.append(f"{sign}{int(a):,}")
    for p in spellings:
        for g in spellings:
            assert is_equivalent(p, g), (p, g)
    assert not is_equivalent(spellings[0], str(x + 1))


_LATEXISH = st.lists(
    st.sampled_from(
        [
            "\\boxed{",
            "\\frac{",
            "{",
            "}",
            "$",
            "1",
            "2",
            ",",
            ".",
            "-",
            "/",
            " ",
            "x",
            "The answer is",
            "(",
            ")",
            "\\text{",
            "%",
            "\\left(",
            "000",
            "\\",
            "^",
            "\u2212",
            "\u0663",
        ]
    ),
    max_size=60,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=300), _LATEXISH), st.one_of(st.text(max_size=50), _LATEXISH))
def test_checker_never_raises_and_is_fast(pred, gold):
    start = time.perf_counter()
    for strict in (False, True):
        assert is_equivalent(pred, gold, strict=strict) in (True, False)
    assert time.perf_counter() - start < 0.05
    if clean_answer(pred):
        assert is_equivalent(pred, pred)


def test_checker_worst_case_inputs_are_fast():
    hostile = [
        "\\boxed{" * 50_000,
        "{" * 100_000 + "}" * 100_000,
        "9" * 1_000_000,
        "1," * 100_000,
        "(" + "1," * 50_000 + "1)",
        "\\frac{" * 20_000 + "1" + "}{2}" * 20_000,
        " " * 100_000 + "1",
        "The answer is " * 10_000,
    ]
    for text in hostile:
        start = time.perf_counter()
        is_equivalent(text, "12")
        is_equivalent(text, "(1,2)")
        is_equivalent("12", text)
        assert time.perf_counter() - start < 0.5, text[:30]
