"""README.md and the docs site stay true to the code: ids, reward tables, commands, links."""

import importlib.util
import re
from pathlib import Path

import gymnasium as gym
import pytest

import llm_gym
from tests._envs import make_kwargs

tomllib = pytest.importorskip("tomllib" if __import__("sys").version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
# Relative markdown links: [text](target) and ![alt](target), without a scheme.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _family_page(env_id: str) -> str:
    """``envs/<family>.md`` for an id, the rule the nav hook follows (``frozen_lake`` -> ``frozenlake.md``)."""
    return _load(DOCS / "hooks" / "env_pages.py").family_page(gym.spec(env_id).entry_point.split(":")[0])


#: Each family's first id and its docs page.
FAMILY_PAGES = {
    env_id: _family_page(env_id)
    for env_id in dict.fromkeys(
        next(e.id for e in llm_gym.registration.ENVS if e.entry_point == entry)
        for entry in dict.fromkeys(e.entry_point for e in llm_gym.registration.ENVS)
    )
}


def _hook():
    return _load(DOCS / "hooks" / "reward_tables.py")


def _local_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", t)]


def test_readme_fits_the_size_budget():
    # Peers' READMEs are 6-15 KB; the deep dives live in docs/.
    assert len(README.encode("utf-8")) <= _load(ROOT / "scripts" / "gen_readme.py").MAX_BYTES == 15_360


def test_the_generator_refuses_a_readme_over_the_cap(monkeypatch, capsys):
    gen = _load(ROOT / "scripts" / "gen_readme.py")
    monkeypatch.setattr(gen, "MAX_BYTES", len(README.encode("utf-8")) - 1)
    assert gen.main(["--check"]) == 1 and "over its" in capsys.readouterr().err


def test_readme_id_table_is_generated_from_the_code():
    gen = _load(ROOT / "scripts" / "gen_readme.py")
    assert gen.render(README) == README, "README.md's id table is stale: run python scripts/gen_readme.py"
    assert gen.main(["--check"]) == 0
    stale = README.replace("`Sokoban-v0` `SokobanLarge-v0`", "`SokobanLarge-v0` `Sokoban-v0`")
    assert stale != README
    assert gen.render(stale) == README  # a hand edit inside the block is overwritten, so the check can fail


def test_getting_started_id_table_is_generated_by_the_docs_hook():
    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    assert "<!-- id-table -->" in page
    expanded = _load(DOCS / "hooks" / "id_table.py").expand(page)
    assert "<!-- id-table -->" not in expanded
    assert llm_gym.registration.id_table() in expanded


def _readme_block() -> str:
    gen = _load(ROOT / "scripts" / "gen_readme.py")
    return README.split(gen.START, 1)[1].split(gen.END, 1)[0]


@pytest.mark.parametrize("env_id", llm_gym.list_envs())
def test_every_id_is_in_the_environment_tables(env_id):
    """README lists each id in its family's row (a row per family keeps it short); the docs' id table, the one
    getting-started shows, has each id with its description."""
    entry = next(e for e in llm_gym.registration.ENVS if e.id == env_id)
    family = llm_gym.registration.env_family(env_id)
    (row,) = [r for r in _readme_block().splitlines() if f"(docs/envs/{family}.md)" in r]
    assert f"`{env_id.split('/', 1)[1]}`" in row.split(" | ")[1]
    assert f"| `{env_id}` | {entry.description} |" in llm_gym.registration.id_table()


@pytest.mark.parametrize("env_id", llm_gym.list_envs())
def test_every_id_is_on_its_family_page(env_id):
    assert env_id in (DOCS / _family_page(env_id)).read_text(encoding="utf-8")


def test_family_pages_are_derived_from_the_id_table():
    assert FAMILY_PAGES["llmgym/FrozenLake-v0"] == "envs/frozenlake.md"
    assert set(FAMILY_PAGES.values()) == {
        p.relative_to(DOCS).as_posix() for p in (DOCS / "envs").glob("*.md")
    }


@pytest.mark.parametrize("env_id", sorted(FAMILY_PAGES))
def test_reward_tables_are_generated_from_the_declared_specs(env_id):
    page = (DOCS / FAMILY_PAGES[env_id]).read_text(encoding="utf-8")
    assert f"<!-- reward-table: {env_id} -->" in page
    expanded = _hook().expand(page)
    assert "reward-table:" not in expanded
    spec = gym.make(env_id, **make_kwargs(env_id)).unwrapped.reward_spec
    for c in spec.components:
        rows = re.findall(rf"^\| `{re.escape(c.name)}` \| ([^|]+) \| (.+) \|$", expanded, flags=re.M)
        assert len(rows) == 1, f"{FAMILY_PAGES[env_id]} has {len(rows)} rows for {c.name!r} of {env_id}"
        assert float(rows[0][0]) == pytest.approx(c.value) and rows[0][1] == c.description


def test_reward_table_follows_registered_overrides_and_rejects_unknown_ids():
    hook = _hook()
    # The table reflects the spec it is given, not a copy: a changed value shows up.
    spec = hook.reward_spec("llmgym/Sokoban-v0").with_overrides({"solved": 7.5})
    assert "| `solved` | 7.5 |" in spec.markdown_table()
    with pytest.raises(gym.error.Error):
        hook.expand("<!-- reward-table: llmgym/NoSuchEnv-v0 -->\n")


def test_test_command_is_what_ci_runs():
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh" in ci and "python -m pytest -q" in ci
    assert "mkdocs build --strict" in ci


def test_main_job_command_is_in_the_readme():
    assert "bash scripts/setup.sh && .venv/bin/llmgym-train --profile organism --env Bandit" in README


def test_documented_console_scripts_are_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name in ("llmgym", "llmgym-train", "llmgym-eval", "llmgym-collapse-report"):
        assert name in scripts and f"{name} " in README


def test_readme_links_resolve():
    links = _local_links(README)
    assert any(t.startswith("docs/") for t in links)
    for target in links:
        assert (ROOT / target.split("#")[0]).is_file(), target


def _built_nav() -> list[str]:
    """Every page in the site's nav: mkdocs.yml's, with the family pages the nav hook adds."""
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    nav = _load(DOCS / "hooks" / "env_pages.py").with_env_pages(nav, DOCS)

    def pages(items):
        for item in items:
            values = item.values() if isinstance(item, dict) else [item]
            for v in values:
                yield from pages(v) if isinstance(v, list) else [v]

    return list(pages(nav))


def test_nav_hook_adds_each_family_page_once_in_id_table_order():
    nav = _built_nav()
    family = [p for p in nav if p.startswith("envs/")]
    assert family == list(dict.fromkeys(FAMILY_PAGES.values()))  # FrozenLake first, as in ENVS
    assert len(nav) == len(set(nav))


@pytest.mark.parametrize("page", sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")))
def test_docs_page_is_in_the_nav_and_its_links_resolve(page):
    assert page in _built_nav(), f"{page} is not in mkdocs.yml nav (family pages: docs/envs/<family>.md)"
    text = (DOCS / page).read_text(encoding="utf-8")
    for target in _local_links(text):
        path = target.split("#")[0]
        if path:
            assert ((DOCS / page).parent / path).resolve().is_file(), f"{page}: broken link {target}"
