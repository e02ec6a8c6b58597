"""What the built docs site shows a reader, as data: tables, paragraphs, commands and flags of the HTML pages.

Used by ``tests/test_docs_site.py`` (over a ``mkdocs build --strict`` of the site) and by the GPU page's test.
The HTML is read with the standard library's parser into a small tree; the flag vocabulary comes from the
command lines' own parsers (``llmgym-train``, ``llmgym-sft``, ``llmgym-eval``, ``llmgym``) and, for the other
scripts of the repository (benchmarks, ``python -m`` modules), from their ``add_argument`` calls.
"""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import dataclass, field
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------------- HTML
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    def iter(self, *tags: str):
        """This node's descendants with one of ``tags`` (document order)."""
        for child in self.children:
            if isinstance(child, Node):
                if child.tag in tags:
                    yield child
                yield from child.iter(*tags)

    def walk(self):
        """This node and all its descendant nodes."""
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.walk()

    def text(self, skip: frozenset[str] = frozenset()) -> str:
        """The text inside, without the subtrees whose tag is in ``skip``."""
        return "".join(
            c if isinstance(c, str) else ("" if c.tag in skip else c.text(skip)) for c in self.children
        )

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def article(html: str) -> Node | None:
    """The page's content (Material's ``<article>``), without the permalink anchors of its headings."""
    builder = _Builder()
    builder.feed(html)
    found = next(builder.root.iter("article"), None)
    if found is not None:
        for node in found.iter(*[f"h{i}" for i in range(1, 7)]):
            node.children = [
                c for c in node.children if not (isinstance(c, Node) and "headerlink" in c.classes)
            ]
    return found


def pages(site: Path) -> dict[str, Node]:
    """Every page of a built site that has content: its path in the site -> its article."""
    out = {}
    for path in sorted(site.rglob("*.html")):
        node = article(path.read_text(encoding="utf-8"))
        if node is not None and path.name != "404.html":
            out[path.relative_to(site).as_posix()] = node
    return out


# ---------------------------------------------------------------------------------------------- the checks
def lone_cell_rows(page: Node) -> list[list[str]]:
    """Table rows whose cells are all empty but one: a paragraph a generated table swallowed."""
    bad = []
    for row in page.iter("tr"):
        cells = [
            " ".join(c.text().split()) for c in row.children if isinstance(c, Node) and c.tag in ("td", "th")
        ]
        if len(cells) > 1 and sum(bool(c) for c in cells) == 1:
            bad.append(cells)
    return bad


#: A list marker at the start of a line of a paragraph ("- **Steps.**", "2. **A stronger**"): the list item
#: Markdown did not see. The next character must start a word, so "+ - * /" in prose is no marker.
_LINE_MARKER = re.compile(r"(?:^|\n)[ \t]*(?:[-*+]|\d{1,2}\.)[ \t]+[\w*`(\[\"']")
#: A numbered item run into the previous one ("...; 2. the environment's settings").
_INLINE_NUMBER = re.compile(r"[;,][ \t]+\d{1,2}\.[ \t]+[A-Za-z`*(]")
#: What is not the paragraph's own prose: code blocks, nested lists and blocks, math.
_NOT_PROSE = frozenset({"pre", "ul", "ol", "table", "div", "p", "blockquote", "script", "style"})


def literal_list_markers(page: Node) -> list[str]:
    """Paragraphs and list items whose own text holds a list marker Markdown did not turn into a list."""
    bad = []
    for node in page.iter("p", "li"):
        text = node.text(_NOT_PROSE)
        m = _LINE_MARKER.search(text) or _INLINE_NUMBER.search(text)
        if m:
            start = max(0, m.start() - 60)
            bad.append(" ".join(text[start : m.end() + 40].split()))
    return bad


# ------------------------------------------------------------------------------------------ flag vocabulary
def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


@cache
def cli_flags() -> dict[str, set[str]]:
    """Each command line -> the long options its parser lists (``llmgym SUB`` per sub-command; ``llmgym`` alone:
    its own). The dashed spellings that still parse as hidden aliases are not listed: the docs use the names
    ``--help`` shows."""
    from llm_gym.trainer.evaluate import build_parser as evaluate
    from llm_gym.trainer.flags import build_parser as train
    from llm_gym.trainer.sft import build_parser as sft

    from llm_gym.cli import build_parser as gym

    out = {
        "llmgym-train": _long_options(train()),
        "llmgym-sft": _long_options(sft()),
        "llmgym-eval": _long_options(evaluate()),
    }
    top = gym()
    out["llmgym"] = _long_options(top)
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[f"llmgym {name}"] = _long_options(sub) | out["llmgym"]
    return out


def declared_flags(path: Path) -> set[str]:
    """The long options a script declares with ``add_argument("--x", ...)`` (snake_case when it applies
    ``snake_case_options``, as the command lines do)."""
    source = path.read_text(encoding="utf-8")
    snake = "snake_case_options(" in source
    out = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            for arg in node.args:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and arg.value.startswith("--")
                ):
                    out.add("--" + arg.value[2:].replace("-", "_") if snake else arg.value)
    return out


#: Other tools' options the pages name, by tool (the repository declares none of them).
EXTERNAL = {
    "pip": {"--no-deps", "--index-url", "--extra-index-url", "--upgrade", "--force-reinstall", "--target"},
    "accelerate launch": {
        "--config_file",
        "--num_processes",
        "--num_machines",
        "--machine_rank",
        "--main_process_ip",
        "--main_process_port",
        "--mixed_precision",
        "--multi_gpu",
        "--cpu",
    },
    "torchrun": {"--nproc_per_node"},
    "vllm serve": {"--enable-prefix-caching"},
    "trl vllm-serve": {"--enable_prefix_caching"},
    "tensorboard": {"--logdir"},
    "pytest": {"--durations"},
    "mkdocs build": {"--strict", "--site-dir"},
}

#: A ``python -m MODULE`` -> its source file (``llm_gym.trainer.*`` lives in ``trainer/``).
_PACKAGE_DIRS = {
    "llm_gym.trainer": ROOT / "trainer",
    "llm_gym": ROOT / "llm_gym",
    "benchmarks": ROOT / "benchmarks",
}
#: ``python -m`` modules that are the command lines.
MODULE_CLI = {
    "llm_gym.trainer.cli": "llmgym-train",
    "llm_gym.trainer.evaluate": "llmgym-eval",
    "llm_gym.trainer.sft": "llmgym-sft",
    "llm_gym.cli": "llmgym",
}
SCRIPT_CLI = {"llmgym-collapse-report": ROOT / "trainer" / "collapse_report.py"}


def module_file(module: str) -> Path | None:
    for package, folder in sorted(_PACKAGE_DIRS.items(), key=lambda kv: -len(kv[0])):
        if module == package or module.startswith(package + "."):
            rest = module[len(package) + 1 :].split(".") if module != package else []
            path = folder.joinpath(*rest)
            for candidate in (path.with_suffix(".py"), path / "__main__.py"):
                if rest and candidate.is_file():
                    return candidate
    return None


@cache
def known_flags() -> frozenset[str]:
    """Every option some command of the repository declares, plus :data:`EXTERNAL`: a flag named in prose must
    be one of these."""
    out: set[str] = set().union(*cli_flags().values(), *EXTERNAL.values())
    for folder in ("llm_gym", "trainer", "benchmarks", "scripts", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            out |= declared_flags(path)
    return frozenset(out)


# ------------------------------------------------------------------------------------------------ commands
@dataclass(frozen=True)
class Command:
    program: str  # a key of cli_flags(), or a script path
    flags: tuple[str, ...]
    line: str


_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_SEPARATORS = {"&&", "||", "|", ";", "&"}


def logical_lines(code: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and prompts dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        line = re.sub(r"^\$\s+", "", line)
        if line:
            out.append(line)
    return out


def _flag_name(token: str) -> str | None:
    m = _FLAG.match(token)
    if not m:
        return None
    return m.group().rstrip("-_") if token[m.end() : m.end() + 1] not in ("<", "{") else None


def _program_at(tokens: list[str], i: int) -> tuple[str, int] | None:
    """The program token ``tokens[i]`` starts (a CLI name, ``python -m MODULE``, ``python SCRIPT.py``) and the
    index of its first argument, or None."""
    tok = tokens[i]
    name = tok.rsplit("/", 1)[-1]
    if name in ("llmgym-train", "llmgym-sft", "llmgym-eval"):
        return name, i + 1
    if name == "llmgym":
        sub = tokens[i + 1] if i + 1 < len(tokens) else ""
        return (f"llmgym {sub}", i + 2) if f"llmgym {sub}" in cli_flags() else ("llmgym", i + 1)
    if name in SCRIPT_CLI:
        return str(SCRIPT_CLI[name]), i + 1
    if tok == "-m" and i + 1 < len(tokens):
        module = tokens[i + 1]
        if module in MODULE_CLI:
            return _resolve_module_cli(module, tokens, i)
        path = module_file(module)
        if path is not None and declared_flags(path):
            return str(path), i + 2
    if tok.endswith(".py") and (ROOT / tok).is_file() and declared_flags(ROOT / tok):
        return str(ROOT / tok), i + 1
    return None


def _resolve_module_cli(module: str, tokens: list[str], i: int) -> tuple[str, int]:
    program = MODULE_CLI[module]
    if program == "llmgym":
        sub = tokens[i + 2] if i + 2 < len(tokens) else ""
        return (f"llmgym {sub}", i + 3) if f"llmgym {sub}" in cli_flags() else ("llmgym", i + 2)
    return program, i + 2


def commands(code: str) -> tuple[list[Command], list[str]]:
    """The repository's commands in a shell snippet, and the flags outside them (another tool's)."""
    found: list[Command] = []
    loose: list[str] = []
    for line in logical_lines(code):
        tokens = [t.strip("`'\"") for t in line.split()]
        program: str | None = None
        flags: list[str] = []
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok in _SEPARATORS or tok.startswith("$("):
                if program:
                    found.append(Command(program, tuple(flags), line))
                program, flags = None, []
                i += 1
                continue
            start = _program_at(tokens, i)
            if start is not None:
                if program:
                    found.append(Command(program, tuple(flags), line))
                (program, i), flags = start, []
                continue
            name = _flag_name(tok)
            if name:
                (flags if program else loose).append(name)
            i += 1
        if program:
            found.append(Command(program, tuple(flags), line))
    return found, loose


def flags_of(program: str) -> set[str]:
    return cli_flags()[program] if program in cli_flags() else declared_flags(Path(program))


def prose_flags(text: str) -> list[str]:
    """The ``--flag`` names in a text (``--no_<field>`` and other placeholders left out)."""
    return [n for n in (_flag_name(text[m.start() :]) for m in _FLAG.finditer(text)) if n]


# ------------------------------------------------------------------------------------------------- profiles
def available_profiles() -> set[str]:
    from llm_gym.trainer.resolve import available_profiles

    return set(available_profiles())


_PROFILE_FLAG = re.compile(r"--profile[ =]+([A-Za-z0-9_.-]+)")
_PROFILE_PATH = re.compile(r"profiles/([A-Za-z0-9_.-]+)/")


def profile_names(page: Node) -> list[str]:
    """The profile names a page uses: ``--profile NAME`` in its code, ``profiles/NAME/`` and "``NAME`` profile"
    (upper-case names are placeholders)."""
    names = [m.group(1).rstrip(".") for text, _ in code_snippets(page) for m in _PROFILE_FLAG.finditer(text)]
    names += [m.group(1) for m in _PROFILE_PATH.finditer(page.text(frozenset({"script", "style"})))]
    for node in page.walk():
        for i, child in enumerate(node.children[:-1]):
            after = node.children[i + 1]
            if isinstance(child, Node) and child.tag == "code" and isinstance(after, str):
                if re.match(r"\s+profile\b", after) and re.fullmatch(r"[a-z0-9_]+", child.text()):
                    names.append(child.text())
    return [n for n in names if not n.isupper()]


def code_snippets(page: Node) -> list[tuple[str, bool]]:
    """Every code block and inline code of a page: (text, is a shell snippet). Python blocks are not shell."""
    out = []
    blocks = {id(pre) for pre in page.iter("pre")}
    for div in page.iter("div"):
        language = next((c[len("language-") :] for c in div.classes if c.startswith("language-")), "")
        for pre in div.iter("pre"):
            out.append((pre.text(), language in ("", "bash", "sh", "shell", "console", "text")))
            blocks.discard(id(pre))
    for pre in page.iter("pre"):
        if id(pre) in blocks:
            out.append((pre.text(), True))
    inside_pre = {id(c) for pre in page.iter("pre") for c in pre.iter("code")}
    out += [(c.text(), True) for c in page.iter("code") if id(c) not in inside_pre]
    return out
