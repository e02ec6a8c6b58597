"""The configuration tables of the docs are generated from the config's fields (``docs/hooks/config_tables.py``):
the hook reads what the code declares, and every group is shown on some page."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from llm_gym.trainer import config  # noqa: E402
from llm_gym.trainer.lora import LORA_FIELDS  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _hook():
    path = DOCS / "hooks" / "config_tables.py"
    spec = importlib.util.spec_from_file_location("config_tables_hook", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def _own_fields(cls: type) -> list[dataclasses.Field]:
    own = cls.__dict__.get("__annotations__", {})
    return [f for f in dataclasses.fields(cls) if f.name in own]


def test_the_hook_reads_every_group_as_the_code_declares_it():
    hook = _hook()
    groups = hook.config_groups()
    classes = {
        name: cls
        for name, cls in vars(config).items()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == config.__name__
    }
    assert set(groups) >= set(classes) - {"SignalArguments"} and "FilterArguments" in groups
    for name, cls in classes.items():
        docs = {f.name: f for f in groups.get(name, [])}
        assert list(docs) == [f.name for f in _own_fields(cls)], name  # a field the source read missed fails
        for f in _own_fields(cls):
            assert docs[f.name].help == f.metadata["help"], f.name
            assert docs[f.name].default == hook._render(f.default), f.name  # the runtime default, as rendered
    assert [f.name for f in groups["LoRAArguments"]] == list(LORA_FIELDS)


def test_every_group_is_shown_on_a_page():
    pages = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md"))
    assert "<!-- config-groups -->" in pages
    shown = {item for m in re.findall(r"<!--\s*config-table:\s*([\w ]+?)\s*-->", pages) for item in m.split()}
    groups = set(_hook().config_groups()) - {
        "LoRAArguments",
        "LLMGymGRPOConfig",
    }  # LLMGymSFTConfig: warm start
    assert groups <= shown, f"no config-table marker for {sorted(groups - shown)}"


def test_a_marker_expands_to_the_help_text_and_an_unknown_name_fails_the_build():
    hook = _hook()
    text = hook.expand("x\n<!-- config-table: FilterArguments mi_every -->\ny")
    help_text = " ".join(config.FilterArguments.__dataclass_fields__["filter_value"].metadata["help"].split())
    assert f"| `--filter_value` | `0.9` | {help_text} |" in text and "| `--mi_every` | `5` |" in text
    assert "<!--" not in text
    with pytest.raises(ValueError, match="neither a config group nor a field"):
        hook.expand("<!-- config-table: NoSuchArguments -->")
