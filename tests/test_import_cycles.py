"""No import cycles among the modules of ``llm_gym`` as installed (``llm_gym/``, and ``trainer/`` as
``llm_gym.trainer``): every import, at module level or inside a function, points
one way (a cycle that only works because one side imports lazily is still a knot a reader has to untie)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "llm_gym"


def package_dirs() -> dict[str, Path]:
    """pyproject.toml's ``package-dir``: installed package -> repository folder (``llm_gym.trainer`` -> trainer/)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {name: ROOT / folder for name, folder in data["tool"]["setuptools"]["package-dir"].items()}


def _module_name(path: Path, folder: Path, name: str) -> str:
    parts = (*name.split("."), *path.relative_to(folder).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path | dict[str, Path] = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (explicitly named; a submodule imported with ``from pkg
    import sub`` counts as ``pkg.sub``). ``package``: one folder (named after itself), or installed name ->
    folder for a package whose sub-packages live in other folders. Imports of other packages are left out."""
    roots = {package.name: package} if isinstance(package, Path) else package
    files = {
        _module_name(p, folder, name): p
        for name, folder in roots.items()
        for p in folder.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in targets:
                while (
                    target and target not in files
                ):  # `import a.b.c` names a.b.c; keep the deepest module we own
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_in_llm_gym():
    graph = import_graph(package_dirs())
    assert "llm_gym.trainer.cli" in graph and "llm_gym.trainer.defaults" in graph["llm_gym.trainer.cli"]
    found = cycles(graph)
    assert not found, "import cycles (move the shared code to a module both can import):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_the_cycle_check_sees_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "llm_gym"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from llm_gym.sub.a import f\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "sub" / "b.py").write_text("from llm_gym.sub import a\nimport numpy\n")
    (pkg / "c.py").write_text("from llm_gym import sub\n")
    graph = import_graph(pkg)
    assert graph["llm_gym.sub.a"] == {"llm_gym.sub.b"} and graph["llm_gym.sub.b"] == {"llm_gym.sub.a"}
    assert graph["llm_gym.c"] == {"llm_gym.sub"}
    assert cycles(graph) == [["llm_gym.sub.a", "llm_gym.sub.b"]]


def test_the_cycle_check_follows_a_mapped_folder(tmp_path):
    """A sub-package installed from another folder (trainer/ as llm_gym.trainer) is part of the graph."""
    (tmp_path / "llm_gym").mkdir()
    (tmp_path / "trainer").mkdir()
    (tmp_path / "llm_gym" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "cli.py").write_text("from llm_gym.trainer.warm_start import run\nEVAL = 1\n")
    (tmp_path / "trainer" / "warm_start.py").write_text(
        "def run():\n    from llm_gym.trainer.cli import EVAL\n"
    )
    graph = import_graph({"llm_gym": tmp_path / "llm_gym", "llm_gym.trainer": tmp_path / "trainer"})
    assert graph["llm_gym.trainer.cli"] == {"llm_gym.trainer.warm_start"}
    assert cycles(graph) == [["llm_gym.trainer.cli", "llm_gym.trainer.warm_start"]]
