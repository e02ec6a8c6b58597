"""Answer extraction and equivalence for math word problems (MetaMathQA).

:func:`is_equivalent` decides whether a predicted answer matches the gold one:

* ``strict=True``: RAGEN's rule, equality after lowercasing and deleting all whitespace (:func:`normalize_strict`).
* default: the same normalisation after unwrapping ``\\boxed{}``, ``$...$``, ``\\(...\\)``, ``\\text{}``,
  ``\\left``/``\\right``, a leading "The answer is" and a trailing period; then, when the gold answer is a number,
  exact numeric equality (``0.5`` = ``1/2`` = ``\\frac{1}{2}``, ``1,000`` = ``1000``, ``3.0`` = ``3``, the mixed
  number ``3\\frac{1}{2}`` = ``3.5``), where the
  prediction may carry words or units around one lone number ("12 dollars", "x = 12"); then element-wise
  comparison of bracketed tuples such as ``(1, \\frac{1}{2})``; then, when the gold answer is a
  radical, equality of ``q*sqrt(m)`` forms (``2\\sqrt{3}`` = ``\\sqrt{12}``, ``2/\\sqrt{2}`` = ``\\sqrt{2}``).
  An unevaluated expression (``2+3`` for 5) is not a final answer and never equals a number.

Numbers are compared exactly as fractions (parsed by :mod:`llm_gym.envs.countdown.arith`, never ``eval``). Every step is
linear in the input, and inputs are capped before any other work (a prediction longer than ``MAX_INPUT`` characters
and longer than the gold answer is read by its last ``MAX_INPUT`` characters; in strict mode a prediction longer than
``STRICT_MAX_INPUT`` is never equal), so checking never hangs and never raises.
"""

from __future__ import annotations

import re
from fractions import Fraction

from llm_gym.envs.countdown.arith import evaluate

#: Longest prediction examined (its tail is kept: the final answer comes last).
MAX_INPUT = 2000
#: Longest answer compared in strict mode (the response parser's limit, so env answers are never refused).
STRICT_MAX_INPUT = 1_000_000
#: Longest text in which a lone number is looked for among words and units.
MAX_LONE_TEXT = 200

_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is", re.IGNORECASE)
_WRAPPER_CMD = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
# A digit or point right before or after a fraction belongs to a mixed number or is ambiguous ("\\frac{1}{2}3"):
# never glue it onto the numerator or denominator.
_FRAC = re.compile(r"(?<![0-9.])\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}(?![0-9.])")
_FRAC_SHORT = re.compile(r"\\frac\s*([0-9])\s*([0-9])")
# "3\\frac{1}{2}" is the mixed number 3 + 1/2 (and "-3\\frac{1}{2}" is -(3 + 1/2)).
_MIXED = re.compile(
    r"(?<![\w.,^])(-?[0-9]{1,60})\s*\\frac\s*\{\s*([0-9]{1,60})\s*\}\s*\{\s*([0-9]{1,60})\s*\}(?![0-9.])"
)
_SIMPLE = re.compile(r"-?(?:[0-9][0-9,]*(?:\.[0-9]*)?|\.[0-9]+)")
_THOUSANDS = re.compile(r"(?<![0-9,])[0-9]{1,3}(?:,[0-9]{3})+(?![0-9,])")
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:/-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))?")
_SPACED_DIGITS = re.compile(r"[0-9.]\s+[0-9.]")
_TOKEN_IN_TEXT = re.compile(
    r"-?(?:[0-9][0-9,]*(?:\.[0-9]+)?|\.[0-9]+)(?:\s*/\s*-?[0-9][0-9,]*(?:\.[0-9]+)?)?"
)
_WORD = re.compile(r"[a-z]+")
# Words that make "a lone number among words" unsafe to read as the answer.
_HEDGES = frozenset(
    {"not", "no", "or", "between", "except", "neither", "nor", "never", "approximately", "about"}
)
_FORBIDDEN_AROUND = set("()[]{}^_*+/\\<>|&#@~`;\"'!?")
_REPLACEMENTS = (
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("\\!", ""),
    ("\\,", ""),
    ("\\;", ""),
    ("\\:", ""),
    ("\\ ", " "),
    ("\\$", "$"),
    ("\\%", "%"),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\circ", ""),
    ("°", ""),
    ("\\(", ""),
    ("\\)", ""),
    ("\\[", ""),
    ("\\]", ""),
    ("$", ""),
    ("\u2212", "-"),  # unicode minus sign
    ("\u00a0", " "),
)


def _last_answer_marker(text: str) -> re.Match | None:
    matches = list(_ANSWER_IS.finditer(text))
    return matches[-1] if matches else None


def extract_gold(response: str) -> str | None:
    """The text after the last "The answer is:" in a MetaMathQA ``response`` (``None`` when absent)."""
    if not isinstance(response, str):
        return None
    found = _last_answer_marker(response)
    if found is None:
        return None
    return response[found.end() :].lstrip(" :").strip()


def normalize_strict(text: str) -> str:
    """RAGEN's normalisation: lowercase, all whitespace removed."""
    return "".join(str(text).lower().split())


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched; ``None`` if there is none."""
    start, cmd = max((text.rfind(c), c) for c in ("\\boxed", "\\fbox"))
    if start < 0:
        return None
    i = start + len(cmd)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def clean_answer(text: str) -> str:
    """Unwrap the presentation around an answer: "The answer is", ``\\boxed``, ``$``, ``\\text{}`` and friends."""
    text = str(text)[-MAX_INPUT:].strip()
    found = _last_answer_marker(text)
    if found is not None:
        text = text[found.end() :].lstrip(" :")
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    text = _WRAPPER_CMD.sub(lambda m: m.group(1), text)
    text = text.strip()
    while text.endswith((".", "。")) and not text[:-1].endswith("."):
        text = text[:-1].rstrip()
    return text


def _simplify_fracs(text: str) -> str:
    """``\\frac{a}{b}`` -> ``a/b`` when both parts are plain numbers, mixed numbers ``3\\frac{1}{2}`` -> ``7/2``
    (otherwise left for string comparison)."""
    text = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", text)

    def mixed(m: re.Match) -> str:
        whole, num, den = m.group(1), int(m.group(2)), int(m.group(3))
        if den == 0:
            return m.group(0)
        value = abs(int(whole)) + Fraction(num, den)
        sign = "-" if whole.startswith("-") else ""
        return f"{sign}{value.numerator}/{value.denominator}"

    text = _MIXED.sub(mixed, text)

    def repl(m: re.Match) -> str:
        a, b = m.group(1).strip(), m.group(2).strip()
        if _SIMPLE.fullmatch(a) and _SIMPLE.fullmatch(b):
            return f"{a}/{b}"
        return m.group(0)

    return _FRAC.sub(repl, text)


def to_number(text: str) -> Fraction | None:
    """The exact value of a cleaned answer that is a plain number (``-3``, ``0.5``, ``1,000``, ``1/2``,
    ``\\frac{1}{2}``, ``50%`` read as 50), else ``None``."""
    text = _simplify_fracs(text.strip())
    if text.endswith("%"):
        text = text[:-1].rstrip()
    if len(text) > 200 or _SPACED_DIGITS.search(text):
        return None
    text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
    text = "".join(text.split())
    if not _NUMBER.fullmatch(text):
        return None
    result = evaluate(text, allow_decimals=True, max_digits=60, max_depth=4)
    return result.value if result.ok else None


def lone_number(text: str) -> Fraction | None:
    """The value of the single number in a short text of words and units ("12 dollars", "x = -3"), or ``None``
    when there is not exactly one, when it touches letters ("2x"), when brackets, operators or LaTeX surround it,
    or when hedging words ("not", "or", "approximately") make the reading unsafe."""
    text = _simplify_fracs(text)
    if len(text) > MAX_LONE_TEXT:
        return None
    matches = list(_TOKEN_IN_TEXT.finditer(text))
    if len(matches) != 1:
        return None
    m = matches[0]
    before, after = text[: m.start()], text[m.end() :]
    if before[-1:].isalpha() or after[:1].isalpha() or before[-1:] in (".", ",") or after[:1] == ",":
        return None
    rest = before + " " + after
    if any(ch.isdigit() or ch.isnumeric() or ch in _FORBIDDEN_AROUND for ch in rest):
        return None
    if rest.count("=") > 1 or "=" in after or "-" in rest:
        return None
    if _HEDGES.intersection(_WORD.findall(rest.lower())):
        return None
    return to_number(m.group(0))


def _split_top_level(text: str) -> list[str] | None:
    depth, parts, start = 0, [], 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        return None
    parts.append(text[start:])
    return parts


def _tuple_equivalent(pred: str, gold: str, depth: int) -> bool:
    if depth > 2 or len(pred) < 2 or len(gold) < 2:
        return False
    pairs = {"(": ")", "[": "]", "\\{": "\\}"}
    for open_, close in pairs.items():
        if (
            gold.startswith(open_)
            and gold.endswith(close)
            and pred.startswith(open_)
            and pred.endswith(close)
        ):
            gp = _split_top_level(gold[len(open_) : -len(close)])
            pp = _split_top_level(pred[len(open_) : -len(close)])
            if gp is None or pp is None or len(gp) != len(pp) or len(gp) < 2:
                return False
            return all(_equivalent(p.strip(), g.strip(), depth + 1) for p, g in zip(pp, gp))
    return False


#: Largest radicand reduced to its square-free part (trial division up to its square root).
MAX_RADICAND = 10**8
_COEF = r"(-?[0-9]{0,12})"
_SQRT = r"\\sqrt\s*(?:\{\s*([0-9]{1,9})\s*\}|([0-9]))"
_RADICAL_FORMS = (
    # c\sqrt{n}, c\sqrt{n}/d
    (re.compile(rf"{_COEF}\s*\*?\s*{_SQRT}(?:\s*/\s*([0-9]{{1,12}}))?"), "mul"),
    # \frac{c\sqrt{n}}{d}
    (re.compile(rf"\\frac\s*\{{\s*{_COEF}\s*{_SQRT}\s*\}}\s*\{{\s*([0-9]{{1,12}})\s*\}}"), "mul"),
    # a/\sqrt{n}, \frac{a}{\sqrt{n}}
    (re.compile(rf"(-?[0-9]{{1,12}})\s*/\s*{_SQRT}"), "div"),
    (re.compile(rf"\\frac\s*\{{\s*(-?[0-9]{{1,12}})\s*\}}\s*\{{\s*{_SQRT}\s*\}}"), "div"),
)


def _square_free(n: int) -> tuple[int, int]:
    """``(s, m)`` with ``n = s*s*m`` and ``m`` square-free."""
    s, m, f = 1, n, 2
    while f * f <= m:
        while m % (f * f) == 0:
            m //= f * f
            s *= f
        f += 1
    return s, m


def radical(text: str) -> tuple[Fraction, int] | None:
    """``(q, m)`` for an answer ``q * sqrt(m)`` written as ``c\\sqrt{n}``, ``c\\sqrt{n}/d``,
    ``\\frac{c\\sqrt{n}}{d}``, ``a/\\sqrt{n}`` or ``\\frac{a}{\\sqrt{n}}`` (integers; ``m`` square-free, so
    equal values give equal pairs: ``2\\sqrt{3}`` = ``\\sqrt{12}``, ``2/\\sqrt{2}`` = ``\\sqrt{2}``), else ``None``."""
    text = text.strip()
    if len(text) > 100:
        return None
    for pattern, kind in _RADICAL_FORMS:
        m = pattern.fullmatch(text)
        if m is None:
            continue
        if kind == "mul":
            coef, n1, n2, den = m.groups()
            c = -1 if coef == "-" else int(coef) if coef else 1
            d = int(den) if den else 1
            q, n = (Fraction(c, d) if d else None), int(n1 or n2)
        else:
            a, n1, n2 = m.groups()
            n = int(n1 or n2)
            q = Fraction(int(a), n) if n else None  # a/sqrt(n) = a*sqrt(n)/n
        if q is None or n > MAX_RADICAND:
            return None
        if n == 0 or q == 0:
            return Fraction(0), 1
        s, free = _square_free(n)
        return q * s, free
    return None


def _equivalent(pred: str, gold: str, depth: int = 0) -> bool:
    if normalize_strict(pred) == normalize_strict(gold):
        return True
    gv = to_number(gold)
    if gv is None:
        gv = lone_number(gold)
    if gv is not None:
        pv = to_number(pred)
        if pv is None:
            pv = lone_number(pred)
        # An unevaluated expression ("2+3", "\\sqrt{4}") is not a final answer: it stays unequal to 5 or 2.
        return pv is not None and pv == gv
    gr = radical(gold)
    if gr is not None:  # a symbolic gold answer: equal radicals in any integer form
        return radical(pred) == gr
    return _tuple_equivalent(pred, gold, depth)


def is_equivalent(pred: str, gold: str, *, strict: bool = False) -> bool:
    """Whether the predicted answer matches the gold answer (see the module docstring); never raises."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False
    if strict:
        # RAGEN's rule exactly (ragen/env/metamathqa/env.py, _check_answer): an empty gold answer matches nothing.
        # Normalising is linear; only answers beyond the response parser's own cap are refused unread.
        if len(pred) > STRICT_MAX_INPUT:
            return False
        gold_norm = normalize_strict(gold)
        return bool(gold_norm) and normalize_strict(pred) == gold_norm
    # Cap first: normalising a 100 MB answer cost seconds and gigabytes. No gold answer is that long, so an
    # answer longer than both MAX_INPUT and the gold is judged by its tail only (its last MAX_INPUT characters,
    # as clean_answer reads it).
    if len(pred) > max(MAX_INPUT, len(gold)):
        pred = pred[-MAX_INPUT:]
    if normalize_strict(pred) == normalize_strict(gold):
        return True
    pred, gold = clean_answer(pred), clean_answer(gold)
    if not pred or not gold:
        return False
    return _equivalent(pred, gold)
