"""MkDocs hook: every family page under ``docs/envs/`` goes into the nav's "Environments" section.

A new family's page (``docs/envs/<family>.md``, titled by its first ``# `` heading) needs no edit of mkdocs.yml: the
pages not already listed are put first in that section, in the order of the id table (``registration.ENVS``),
pages without a registered family after them by name.
"""

from __future__ import annotations

from pathlib import Path

from llm_gym.registration import ENVS

SECTION = "Environments"


def family_page(package: str) -> str:
    """The docs page of a family package (``llm_gym.envs.frozen_lake`` -> ``envs/frozenlake.md``)."""
    return f"envs/{package.rsplit('.', 1)[1].replace('_', '')}.md"


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def env_pages(docs_dir: str | Path) -> list[dict[str, str]]:
    """``[{title: "envs/<page>.md"}, ...]`` for every page in ``docs_dir/envs``, in id-table order."""
    docs = Path(docs_dir)
    order = list(dict.fromkeys(family_page(e.entry_point.split(":")[0]) for e in ENVS))
    pages = sorted(p.relative_to(docs).as_posix() for p in (docs / "envs").glob("*.md"))
    pages.sort(key=lambda p: order.index(p) if p in order else len(order))
    return [{_title(docs / p): p} for p in pages]


def with_env_pages(nav: list, docs_dir: str | Path) -> list:
    """``nav`` with the family pages added to its "Environments" section (a copy; the section must exist)."""
    out = []
    found = False
    for item in nav:
        if isinstance(item, dict) and SECTION in item:
            found = True
            section = list(item[SECTION])
            listed = {v for e in section for v in (e.values() if isinstance(e, dict) else [e])}
            added = [e for e in env_pages(docs_dir) if next(iter(e.values())) not in listed]
            item = {SECTION: added + section}
        out.append(item)
    if not found:
        raise ValueError(f"mkdocs.yml nav needs an {SECTION!r} section for the family pages")
    return out


def on_config(config, **kwargs):
    config["nav"] = with_env_pages(config["nav"], config["docs_dir"])
    return config
