"""Exact, safe arithmetic for answer checking, and the exact Countdown solver.

:func:`evaluate` reads an arithmetic expression written by an LLM (non-negative integer literals, ``+ - * /``,
parentheses, unary minus) and computes its value exactly with :class:`fractions.Fraction`. It never calls
``eval``, never raises, and does bounded work: the length, the nesting depth, the digits of each literal and the
size of every intermediate value are capped, so hostile input is rejected quickly with a reason.

:func:`reachable` and :func:`solve` search every expression over a multiset of numbers with rational arithmetic
(no floating point), so "solvable" means exactly solvable.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import cast

from llm_gym.core.checks import is_int

Number = int | Fraction

#: Default limits of :func:`evaluate`.
MAX_LENGTH = 256
MAX_DEPTH = 32
MAX_DIGITS = 12
MAX_BITS = 512

# One token per match: whitespace, a literal, ``**``, an operator or bracket, or any other single character.
# Explicit ASCII classes: ``\d`` and ``\s`` would accept unicode digits and spaces.
_TOKEN = re.compile(r"([ \t\r\n]+)|([0-9]+(?:\.[0-9]*)?|\.[0-9]+)|(\*\*)|([-+*/()])|(.)", re.DOTALL)


@dataclass(frozen=True)
class Evaluation:
    """The outcome of :func:`evaluate`: the exact ``value`` and the literals used, or an ``error``."""

    value: Fraction | None
    numbers: tuple[Number, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class _Reject(Exception):
    """Internal: stops evaluation with a user-facing reason."""


def _describe(ch: str) -> str:
    return f"U+{ord(ch):04X}" if not ch.isascii() or not ch.isprintable() else repr(ch)


def _bad_char(ch: str) -> str:
    if ch == "^":
        return "powers are not allowed"
    if ch.isdigit() or ch.isnumeric():
        return f"only ASCII digits 0-9 are allowed (found {_describe(ch)})"
    if ch.isalpha() or ch == "_":
        return "names and words are not allowed, only numbers and + - * / ( )"
    if ch == "=":
        return "'=' is not allowed inside an expression"
    return f"unexpected character {_describe(ch)}"


def _literal(text: str, allow_decimals: bool, max_digits: int) -> Number:
    if "." in text and not allow_decimals:
        raise _Reject("decimal numbers are not allowed, only integers")
    if len(text) - text.count(".") > max_digits:
        raise _Reject(f"number literal longer than {max_digits} digits")
    if "." in text:
        whole, frac = text.split(".")
        value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
        return value.numerator if value.denominator == 1 else value
    return int(text)


# Fast path: integer-only text made of allowed characters is split by one C-level ``findall``.
_PLAIN = re.compile(r"[0-9+\-*/() \t\r\n]*")
_PIECES = re.compile(r"[0-9]+|[-+*/()]")
#: Token kind of a literal; the token list ends with the sentinel kind ``"end"``.
_NUM = "n"


def _tokenize(text: str, allow_decimals: bool, max_digits: int) -> tuple[list[str], list[Number | None]]:
    kinds: list[str] = []
    values: list[Number | None] = []
    if not allow_decimals and "**" not in text and _PLAIN.fullmatch(text):
        for piece in _PIECES.findall(text):
            if piece[0] in "0123456789":
                if kinds and kinds[-1] == _NUM:
                    raise _Reject("two numbers without an operator between them")
                if len(piece) > max_digits:
                    raise _Reject(f"number literal longer than {max_digits} digits")
                kinds.append(_NUM)
                values.append(int(piece))
            else:
                kinds.append(piece)
                values.append(None)
    else:
        for m in _TOKEN.finditer(text):
            space, num, power, op, other = m.groups()
            if space:
                continue
            if other is not None:
                raise _Reject(_bad_char(other))
            if power:
                raise _Reject("powers are not allowed")
            if num is not None:
                if kinds and kinds[-1] == _NUM:
                    raise _Reject("two numbers without an operator between them")
                kinds.append(_NUM)
                values.append(_literal(num, allow_decimals, max_digits))
            else:
                kinds.append(op)
                values.append(None)
    kinds.append("end")
    values.append(None)
    return kinds, values


def _check(x: Number, max_bits: int) -> Number:
    if isinstance(x, int):
        if x.bit_length() > max_bits:
            raise _Reject("intermediate value too large")
        return x
    if x.numerator.bit_length() > max_bits or x.denominator.bit_length() > max_bits:
        raise _Reject("intermediate value too large")
    return x.numerator if x.denominator == 1 else x


class _Parser:
    """Recursive descent over tokens; depth counts brackets and unary minus signs.

    Values stay ``int`` while integral (fast) and become ``Fraction`` after an inexact division (exact)."""

    def __init__(self, kinds: list[str], values: list[Number | None], max_depth: int, max_bits: int):
        self.kinds, self.values, self.pos, self.depth = kinds, values, 0, 0
        self.max_depth, self.max_bits = max_depth, max_bits
        self.numbers: list[Number] = []

    def expr(self) -> Number:
        value = self.term()
        kinds = self.kinds
        while kinds[self.pos] in ("+", "-"):
            op = kinds[self.pos]
            self.pos += 1
            rhs = self.term()
            value = _check(value + rhs if op == "+" else value - rhs, self.max_bits)
        return value

    def term(self) -> Number:
        value = self.unary()
        kinds = self.kinds
        while kinds[self.pos] in ("*", "/"):
            op = kinds[self.pos]
            self.pos += 1
            rhs = self.unary()
            if op == "*":
                value = _check(value * rhs, self.max_bits)
            elif rhs == 0:
                raise _Reject("division by zero")
            elif isinstance(value, int) and isinstance(rhs, int) and value % rhs == 0:
                value = value // rhs
            else:
                value = _check(Fraction(value) / rhs, self.max_bits)
        return value

    def unary(self) -> Number:
        if self.kinds[self.pos] == "-":
            self.pos += 1
            self.enter()
            value = -self.unary()
            self.depth -= 1
            return value
        return self.primary()

    def primary(self) -> Number:
        kind = self.kinds[self.pos]
        if kind == _NUM:
            value = cast(Number, self.values[self.pos])  # a number token always carries its value
            self.pos += 1
            self.numbers.append(value)
            return value
        if kind == "(":
            self.pos += 1
            self.enter()
            value = self.expr()
            if self.kinds[self.pos] != ")":
                raise _Reject("unbalanced parentheses")
            self.pos += 1
            self.depth -= 1
            return value
        if kind == "end":
            raise _Reject("expression ends unexpectedly")
        if kind == "+":
            raise _Reject("unary plus is not allowed")
        raise _Reject(f"unexpected {kind!r}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > self.max_depth:
            raise _Reject(f"expression nested deeper than {self.max_depth} levels")


def evaluate(
    text: str,
    *,
    allow_decimals: bool = False,
    max_length: int = MAX_LENGTH,
    max_depth: int = MAX_DEPTH,
    max_digits: int = MAX_DIGITS,
    max_bits: int = MAX_BITS,
) -> Evaluation:
    """Evaluate an arithmetic expression exactly; never raises.

    Accepts non-negative integer literals (decimals too when ``allow_decimals``), ``+ - * /``, parentheses and
    unary minus, with ASCII spaces anywhere. Everything else (names, powers, unicode digits, ``=`` ...) is an error.
    Work is bounded by ``max_length`` characters, ``max_depth`` nesting levels, ``max_digits`` digits per
    literal and ``max_bits`` bits in the numerator and denominator of every intermediate value.
    """
    if not isinstance(text, str):
        return Evaluation(None, error=f"expression must be a str, got {type(text).__name__}")
    if len(text) > max_length:
        return Evaluation(None, error=f"expression longer than {max_length} characters")
    try:
        kinds, values = _tokenize(text, allow_decimals, max_digits)
        if len(kinds) == 1:
            return Evaluation(None, error="empty expression")
        parser = _Parser(kinds, values, max_depth, max_bits)
        value = parser.expr()
        kind = kinds[parser.pos]
        if kind != "end":
            raise _Reject("unbalanced parentheses" if kind == ")" else f"unexpected {kind!r}")
    except _Reject as e:
        return Evaluation(None, error=str(e))
    return Evaluation(Fraction(value), tuple(parser.numbers))


def format_number(x: Number) -> str:
    """``7``, ``-3`` or ``5/2``."""
    x = Fraction(x)
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


# ------------------------------------------------------------------------------------------------ solver
# Values are ints while integral (fast) and Fractions otherwise (exact).


def _norm(x: Number) -> Number:
    if isinstance(x, Fraction) and x.denominator == 1:
        return x.numerator
    return x


def _div(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int):
        q, r = divmod(a, b)
        return q if r == 0 else Fraction(a, b)
    return _norm(Fraction(a) / b)


def _combine(a: Number, b: Number) -> Iterator[tuple[str, Number, bool]]:
    """``(op, value, swapped)`` for every way of combining ``a`` and ``b``; ``swapped`` means ``b op a``."""
    yield "+", _norm(a + b), False
    yield "*", _norm(a * b), False
    yield "-", _norm(a - b), False
    yield "-", _norm(b - a), True
    if b != 0:
        yield "/", _div(a, b), False
    if a != 0:
        yield "/", _div(b, a), True


# Precedence of a rendered sub-expression: 3 literal, 2 product/quotient, 1 sum/difference.
def _join(op: str, left: tuple[str, int], right: tuple[str, int]) -> tuple[str, int]:
    (ls, lp), (rs, rp) = left, right
    if op in "*/":
        ls = f"({ls})" if lp < 2 else ls
        rs = f"({rs})" if rp < 2 or (op == "/" and rp < 3) else rs
        return f"{ls} {op} {rs}", 2
    if op == "-" and rp < 2:
        rs = f"({rs})"
    return f"{ls} {op} {rs}", 1


def _check_nums(nums: Sequence[int]) -> list[int]:
    out = []
    for n in nums:
        if not is_int(n):
            raise ValueError(f"numbers must be integers, got {n!r}")
        if int(n) < 0:
            raise ValueError(f"numbers must be non-negative, got {n!r}")
        out.append(int(n))
    if not 1 <= len(out) <= MAX_SOLVER_NUMBERS:
        raise ValueError(f"the solver takes 1 to {MAX_SOLVER_NUMBERS} numbers, got {len(out)}")
    return out


#: The exhaustive solver's size limit (the number of expressions grows super-exponentially).
MAX_SOLVER_NUMBERS = 6
#: Every binary operator of the answer language.
OPERATORS = "+-*/"
#: Most numbers :func:`plus_minus_solvable` accepts (its sum set has up to ``2**n`` elements).
PLUS_MINUS_MAX_NUMBERS = 16


def check_operators(operators: str) -> str:
    """``operators`` as a canonical string (``"+-*/"`` order), or ``ValueError``."""
    if not isinstance(operators, str) or not operators or set(operators) - set(OPERATORS):
        raise ValueError(
            f"operators must be a non-empty string of characters from {OPERATORS!r}, got {operators!r:.40}"
        )
    return "".join(op for op in OPERATORS if op in operators)


def plus_minus_solvable(nums: Sequence[int], target: int) -> bool:
    """Whether signs ``s_i`` in ``{+1, -1}`` give ``sum(s_i * nums[i]) == target`` (every number used once).

    RAGEN's Countdown filter (``has_solution`` in ``ragen/env/countdown/env.py``), which also lets the first
    number be negated; for a positive target that is the same as an expression with only ``+`` and ``-``.
    """
    if len(nums) > PLUS_MINUS_MAX_NUMBERS:
        raise ValueError(
            f"plus_minus_solvable takes at most {PLUS_MINUS_MAX_NUMBERS} numbers, got {len(nums)}"
        )
    sums = {0}
    for n in nums:
        sums = {s + n for s in sums} | {s - n for s in sums}
    return target in sums


class Reachable:
    """Every value reachable from a multiset of numbers, with a way to print one expression for each.

    ``table[mask]`` maps each value reachable using exactly the numbers in ``mask`` (a bit set over positions)
    to how it was first built: ``(op, left_mask, left_value, right_mask, right_value)`` or ``None`` for a literal.
    """

    def __init__(self, nums: Sequence[int], operators: str = OPERATORS):
        self.nums = _check_nums(nums)
        self.operators = check_operators(operators)
        ops = frozenset(self.operators)
        n = len(self.nums)
        self.full = (1 << n) - 1
        table: list[dict[Number, tuple | None]] = [{} for _ in range(self.full + 1)]
        for i, num in enumerate(self.nums):
            table[1 << i][num] = None
        # Masks in increasing size so both halves of a split are complete.
        for mask in sorted(range(1, self.full + 1), key=lambda m: (m.bit_count(), m)):
            if mask.bit_count() < 2:
                continue
            out = table[mask]
            low = mask & -mask
            sub = (mask - 1) & mask
            while sub:
                # Each unordered split once: the half holding the lowest bit is ``a``.
                if sub & low:
                    b = mask ^ sub
                    ta, tb = table[sub], table[b]
                    for x in ta:
                        for y in tb:
                            for op, v, swapped in _combine(x, y):
                                if op in ops and v not in out:
                                    out[v] = (op, b, y, sub, x) if swapped else (op, sub, x, b, y)
                sub = (sub - 1) & mask
        self.table = table

    def values(self, allow_unused: bool = False) -> dict[Number, int]:
        """Reachable value -> the mask of numbers first found to reach it (all numbers, or any subset)."""
        if not allow_unused:
            return dict.fromkeys(self.table[self.full], self.full)
        out: dict[Number, int] = {}
        for mask in sorted(range(1, self.full + 1), key=lambda m: (m.bit_count(), m)):
            for v in self.table[mask]:
                out.setdefault(v, mask)
        return out

    def expression(self, value: Number, mask: int | None = None) -> str:
        """An expression for ``value`` using exactly the numbers in ``mask`` (default: all)."""
        mask = self.full if mask is None else mask
        return self._render(mask, _norm(Fraction(value)))[0]

    def _render(self, mask: int, value: Number) -> tuple[str, int]:
        how = self.table[mask][value]
        if how is None:
            return str(value), 3
        op, lm, lv, rm, rv = how
        return _join(op, self._render(lm, lv), self._render(rm, rv))


def reachable(nums: Sequence[int], allow_unused: bool = False) -> dict[Number, str]:
    """Every reachable value mapped to one expression reaching it (convenient, slower than :class:`Reachable`)."""
    r = Reachable(nums)
    return {v: r.expression(v, m) for v, m in r.values(allow_unused).items()}


def solve(nums: Sequence[int], target: Number, allow_unused: bool = False) -> str | None:
    """One expression reaching ``target`` with ``nums`` (each exactly once, or at most once when
    ``allow_unused``), or ``None`` when there is none. Depth-first, stopping at the first solution."""
    items: list[tuple[Number, tuple[str, int]]] = [(v, (str(v), 3)) for v in _check_nums(nums)]
    target = _norm(Fraction(target))
    dead: set[tuple[Number, ...]] = set()

    def search(items: list[tuple[Number, tuple[str, int]]]) -> str | None:
        if allow_unused:
            for v, shown in items:
                if v == target:
                    return shown[0]
        elif len(items) == 1:
            return items[0][1][0] if items[0][0] == target else None
        if len(items) == 1:
            return None
        key = tuple(sorted(v for v, _ in items))
        if key in dead:
            return None
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                (a, sa), (b, sb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k != i and k != j]
                for op, v, swapped in _combine(a, b):
                    shown = _join(op, sb, sa) if swapped else _join(op, sa, sb)
                    found = search([*rest, (v, shown)])
                    if found is not None:
                        return found
        dead.add(key)
        return None

    return search(items)
