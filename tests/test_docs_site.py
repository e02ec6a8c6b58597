"""The built docs site, as a reader sees it (issue 34): ``mkdocs build --strict`` once per session, then checks of
the HTML that a clean build does not make: generated tables that swallowed the paragraph after them, list items
Markdown did not see, and flags or profiles that no command has."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("trl")  # llmgym-train's parser is built from the TRL config

from tests import docs_site as ds  # noqa: E402

ROOT = ds.ROOT
DOCS = ROOT / "docs"


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> dict[str, ds.Node]:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    built = ds.pages(out)
    assert "training/quickstart/index.html" in built, sorted(built)[:10]
    return built


def _report(problems: dict[str, list]) -> str:
    return "\n".join(f"{page}: {item}" for page, items in problems.items() for item in items[:8])


@pytest.mark.slow
def test_no_table_row_is_a_swallowed_paragraph(site):
    problems = {page: rows for page, node in site.items() if (rows := ds.lone_cell_rows(node))}
    assert not problems, "table rows with one non-empty cell (a paragraph after a table?):\n" + _report(
        problems
    )


@pytest.mark.slow
def test_no_paragraph_holds_a_literal_list_marker(site):
    problems = {page: found for page, node in site.items() if (found := ds.literal_list_markers(node))}
    assert not problems, "list markers shown as text (indent by 4 / blank line before the list):\n" + _report(
        problems
    )


@pytest.mark.slow
def test_every_flag_a_page_names_exists(site):
    """A command of ours on a page (``llmgym-train ...``, ``python benchmarks/x.py ...``) uses only that command's
    options; a flag named anywhere else is one some command declares (or another tool's, :data:`EXTERNAL`)."""
    known = ds.known_flags()
    problems: dict[str, list[str]] = {}
    commands_seen = 0
    for page, node in site.items():
        bad = []
        for text, shell in ds.code_snippets(node):
            if shell:
                found, loose = ds.commands(text)
                commands_seen += len(found)
                for cmd in found:
                    own = ds.flags_of(cmd.program)
                    bad += [
                        f"{flag} (not an option of {Path(cmd.program).name}): {cmd.line[:100]}"
                        for flag in cmd.flags
                        if flag not in own
                    ]
            else:
                loose = ds.prose_flags(text)
            bad += [f"{flag} (no command has it)" for flag in loose if flag not in known]
        prose = node.text(frozenset({"code", "pre", "script", "style"}))
        bad += [f"{flag} (no command has it)" for flag in ds.prose_flags(prose) if flag not in known]
        if bad:
            problems[page] = sorted(set(bad))
    assert commands_seen > 100, "the pages' commands were not found"
    assert not problems, "flags that do not exist:\n" + _report(problems)


@pytest.mark.slow
def test_every_profile_a_page_names_exists(site):
    profiles = ds.available_profiles()
    assert {"recommended", "ragen2"} <= profiles
    named = {page: ds.profile_names(node) for page, node in site.items()}
    assert {"recommended", "ragen2"} <= {n for names in named.values() for n in names}, (
        "no profile names found"
    )
    problems = {
        page: sorted(set(bad))
        for page, names in named.items()
        if (bad := [n for n in names if n not in profiles])
    }
    assert not problems, f"profiles that do not exist (have: {sorted(profiles)}):\n" + _report(problems)


# --------------------------------------------------------------------- source checks (no build needed, fast)
_ITEM = re.compile(r"^( *)(\d+)\. ")  # Python-Markdown knows "1." only, not "1)"


def ordered_lists_not_starting_at_one(markdown: str) -> list[str]:
    """Ordered lists whose first item is not 1: Python-Markdown numbers every list from 1 whatever is written."""
    bad: list[str] = []
    open_at: set[int] = set()  # indentations with an ordered list open
    fence = False
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if fence or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        m = _ITEM.match(line)
        open_at = {k for k in open_at if k < indent or (m and k == indent)}
        if m:
            if indent not in open_at and m.group(2) != "1":
                bad.append(f"line {number}: {line.strip()[:60]}")
            open_at.add(indent)
    return bad


def test_ordered_list_check_sees_a_list_starting_at_zero():
    assert ordered_lists_not_starting_at_one("x\n\n0. a\n1. b\n") == ["line 3: 0. a"]
    assert ordered_lists_not_starting_at_one("1. a\n\n   more\n\n2. b\n") == []
    assert ordered_lists_not_starting_at_one("1. a\n\ntext\n\n2. b\n") == ["line 5: 2. b"]


def test_every_ordered_list_starts_at_one():
    problems = {
        str(p.relative_to(ROOT)): bad
        for p in sorted(DOCS.rglob("*.md"))
        if (bad := ordered_lists_not_starting_at_one(p.read_text(encoding="utf-8")))
    }
    assert not problems, "ordered lists rendered from 1 but written otherwise:\n" + _report(problems)


# RAGEN-2's protocol is `--profile ragen2`; the default (`recommended`) profile is ours (issue 34).
_RAGEN2_PROTOCOL = re.compile(r"RAGEN-2(?:'s)? protocol")
_DEFAULT_RUN = re.compile(r"recommended|default|`llmgym-train --env \w+`")
_NEGATED = re.compile(r"\bnot\b|\bNOT\b|--profile ragen2")


def ragen2_claims(markdown: str) -> list[str]:
    """Places that call the default run RAGEN-2's protocol: a prose sentence about the default or recommended
    settings, or a code comment over commands without ``--profile ragen2``."""
    bad = []
    prose, code = [], []
    fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            code.append("")
            continue
        (code if fence else prose).append(line)
    text = " ".join(" ".join(prose).split())
    for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z(`])", text):
        if (
            _RAGEN2_PROTOCOL.search(sentence)
            and _DEFAULT_RUN.search(sentence)
            and not _NEGATED.search(sentence)
        ):
            bad.append(sentence[:120])
    for i, line in enumerate(code):
        if line.lstrip().startswith("#") and _RAGEN2_PROTOCOL.search(line) and not _NEGATED.search(line):
            block = []
            for nxt in code[i + 1 :]:
                if not nxt.strip() or nxt.lstrip().startswith("#"):
                    break
                block.append(nxt)
            if block and not any("--profile ragen2" in b for b in block):
                bad.append(f"{line.strip()[:80]} over {block[0].strip()[:60]}")
    return bad


def test_the_ragen2_claim_check_sees_the_old_quickstart_and_configuration():
    old_quickstart = (
        "```bash\n# GPU, RAGEN-2 protocol (Qwen2.5-3B-Instruct)\nllmgym-train --env FrozenLake\n```\n"
    )
    old_configuration = (
        "the default profile, `recommended`)\nthat follows RAGEN-2's protocol: Qwen2.5-3B-Instruct."
    )
    assert len(ragen2_claims(old_quickstart)) == 1 and len(ragen2_claims(old_configuration)) == 1
    fine = "```bash\n# RAGEN-2's protocol\nllmgym-train --profile ragen2 --env Sokoban\n```\nThe default is not RAGEN-2's protocol."
    assert ragen2_claims(fine) == []


def test_no_page_calls_the_default_run_ragen2s_protocol():
    problems = {
        str(p.relative_to(ROOT)): bad
        for p in sorted(DOCS.rglob("*.md"))
        if (bad := ragen2_claims(p.read_text(encoding="utf-8")))
    }
    assert not problems, "the default profile is `recommended`, RAGEN-2's is --profile ragen2:\n" + _report(
        problems
    )


#: Characters of a code line the content column shows without scrolling: 688 px wide with 16 px padding each side,
#: 8.18 px per character of Material's code font (measured in headless Chromium on the built site, 1280 px window).
#: A longer line scrolls, and a comment at its end is hidden.
CODE_COLUMNS = 80
_CODE_FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^[ \t]*```", flags=re.M | re.S)


def _comment(line: str) -> int | None:
    """Where a comment starts (a line of its own, or after code outside quotes), or None."""
    if re.match(r"\s*#(\s|$)", line):
        return 0
    for m in re.finditer(r"(?<=\S)\s+#(?=\s|$)", line):
        before = line[: m.start()]
        if before.count('"') % 2 == 0 and before.count("'") % 2 == 0:
            return m.start()
    return None


def hidden_comments(markdown: str) -> list[str]:
    """Code lines with a comment that ends past :data:`CODE_COLUMNS` (put a trailing comment on the line above,
    wrap a long one)."""
    bad = []
    for m in _CODE_FENCE.finditer(markdown):
        if m.group(2) not in ("bash", "sh", "console", "python", "yaml", ""):
            continue
        for line in m.group(3).splitlines():
            text = line[len(m.group(1)) :] if line.startswith(m.group(1)) else line
            if _comment(text) is not None and len(text) > CODE_COLUMNS:
                bad.append(text.strip()[:90])
    return bad


def test_hidden_comments_sees_a_long_commented_line_only():
    long_line = "llmgym serve --env Sokoban --env FrozenLake --port 8000" + " " * 20 + "# only these ids"
    assert hidden_comments(f"```bash\n{long_line}\n```\n") == [long_line[:90]]
    assert hidden_comments(f"```bash\n# only these ids\n{long_line.split('#')[0].rstrip()}\n```\n") == []
    assert hidden_comments(f"```text\n{long_line}\n```\n") == []  # program output is shown as printed
    assert hidden_comments("```bash\necho '" + "x" * 90 + " # not a comment'\n```\n") == []
    assert hidden_comments("```python\n    # " + "word " * 20 + "\n```\n") == [("# " + "word " * 20)[:90]]


def test_no_code_comment_hides_past_the_column():
    problems = {
        str(p.relative_to(ROOT)): bad
        for p in sorted(DOCS.rglob("*.md"))
        if (bad := hidden_comments(p.read_text(encoding="utf-8")))
    }
    assert not problems, f"code comments past column {CODE_COLUMNS} (move them above the line):\n" + _report(
        problems
    )
