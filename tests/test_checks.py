"""One definition of "an integer" and "a number" for every argument check (``llm_gym.core.checks``)."""

from __future__ import annotations

import ast
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_gym.core.checks import is_int, is_number

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "value, as_int, as_python_int, as_number",
    [
        (3, True, True, True),
        (-(2**80), True, True, True),
        (np.int64(3), True, False, False),
        (np.uint8(3), True, False, False),
        (True, False, False, False),
        (False, False, False, False),
        (np.bool_(True), False, False, False),
        (3.0, False, False, True),
        (float("nan"), False, False, True),  # finiteness is the caller's check
        (np.float64(3.0), False, False, True),  # a float subclass
        ("3", False, False, False),
        (None, False, False, False),
        (Fraction(3), False, False, False),
    ],
)
def test_truth_table(value, as_int, as_python_int, as_number):
    assert is_int(value) is as_int
    assert is_int(value, numpy=False) is as_python_int
    assert is_number(value) is as_number


@given(st.one_of(st.integers(), st.booleans(), st.floats(), st.text(max_size=3), st.none()))
def test_an_int_is_never_a_bool_and_always_a_number(value):
    if is_int(value, numpy=False):
        assert type(value) is not bool and is_number(value) and int(value) == value
    if isinstance(value, bool):
        assert not is_int(value) and not is_number(value)


#: Where a bool/int pair of checks is not the integer idiom.
ALLOWED = {
    # A JSON record field's declared type decides whether true/false is allowed (bool is refused unless asked).
    "llm_gym/agent/records.py",
}


def _isinstance_of(node: ast.AST, names: tuple[str, ...]) -> bool:
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "isinstance"
        and len(node.args) == 2
        and any(n in ast.unparse(node.args[1]) for n in names)
    )


def idiom_sites(source: str) -> list[int]:
    """Lines of ``a and/or b`` expressions that pair an ``isinstance(x, bool)`` with an int or float check."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BoolOp):
            parts = node.values
            has_bool = any(_isinstance_of(p, ("bool",)) for p in parts)
            has_number = any(_isinstance_of(p, ("int", "float", "integer")) for p in parts)
            if has_bool and has_number:
                lines.append(node.lineno)
    return lines


def test_the_idiom_scan_sees_each_spelling():
    src = (
        "a = isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1\n"
        "b = not isinstance(v, bool) and isinstance(v, int)\n"
        "c = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)\n"
        "d = isinstance(think, (bool, np.bool_))\n"
        "e = is_int(v) and v >= 1\n"
    )
    assert idiom_sites(src) == [1, 2, 3]


def test_no_module_repeats_the_bool_int_idiom():
    found = []
    for folder in ("llm_gym", "trainer"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "llm_gym/core/checks.py" or rel in ALLOWED:
                continue
            found += [f"{rel}:{line}" for line in idiom_sites(path.read_text(encoding="utf-8"))]
    assert not found, "use llm_gym.core.checks.is_int / is_number instead:\n" + "\n".join(found)
