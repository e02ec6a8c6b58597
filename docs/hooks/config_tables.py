"""MkDocs hook: the trainer's configuration tables, generated from the config dataclasses' fields.

A page writes, on a line of its own:

- ``<!-- config-table: FilterArguments -->``: a table of that group's fields (flag, default, meaning); several
  names may follow, a group name (``...Arguments``, or ``LLMGymGRPOConfig`` / ``LLMGymSFTConfig`` for the TRL
  fields whose default we change) standing for all its fields and a field name for itself (``<!-- config-table: MIArguments
  collapse_report -->``);
- ``<!-- config-groups -->``: every group and its fields.

The meaning is the field's ``metadata["help"]``, the text ``llmgym-train --help`` prints, so the docs cannot drift
from the code. The fields are read from the sources of ``trainer/options.py`` (the groups the three commands share) and ``trainer/config.py``
(the docs build imports no torch or TRL);
a default that names a constant is looked up in ``llm_gym.trainer.defaults`` or ``llm_gym.agent.chat``. The LoRA
group is TRL's: only its field names (``trainer/lora.py``'s ``LORA_FIELDS``) are listed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llm_gym.trainer.defaults as defaults

import llm_gym.agent.chat as chat

TRAINER = Path(__file__).resolve().parents[2] / "trainer"
#: The modules whose ``...Arguments`` dataclasses are config groups, in the order the groups are listed.
SOURCES = ("options.py", "config.py")
TABLE = re.compile(r"^<!--\s*config-table:\s*([\w ]+?)\s*-->[ \t]*$", flags=re.M)
GROUPS = re.compile(r"^<!--\s*config-groups\s*-->[ \t]*$", flags=re.M)
#: The full configs: their own fields are TRL fields whose default we change.
CONFIGS = ("LLMGymGRPOConfig", "LLMGymSFTConfig")
#: Defaults longer than this are cut in the table (the system prompt); --help has them whole.
MAX_DEFAULT = 40


@dataclass(frozen=True)
class FieldDoc:
    name: str
    default: str
    help: str


def _constants() -> dict[str, Any]:
    names = {k: v for k, v in vars(defaults).items() if k.isupper()}
    names.update({k: v for k, v in vars(chat).items() if k.isupper()})
    return names


def _value(node: ast.expr | None, names: dict[str, Any]) -> Any:
    if node is None:
        return None
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ValueError(f"config_tables: unknown constant {node.id} in trainer/{SOURCES}")
        return names[node.id]
    return ast.literal_eval(node)


def _render(value: Any) -> str:
    if isinstance(value, str):
        if not value:
            return "`''`"
        text = value if len(value) <= MAX_DEFAULT else value[: MAX_DEFAULT - 1] + "…"
        return f"`{text}`"
    return f"`{value!r}`"


def _field(stmt: ast.stmt, names: dict[str, Any]) -> FieldDoc | None:
    """A ``name: type = field(default=..., metadata={"help": ...})`` line, or None for anything else."""
    if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
        return None
    call = stmt.value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "field"):
        return None
    keywords = {k.arg: k.value for k in call.keywords}
    metadata = keywords.get("metadata")
    help_text = ""
    if isinstance(metadata, ast.Dict):
        for key, value in zip(metadata.keys, metadata.values):
            if isinstance(key, ast.Constant) and key.value == "help":
                help_text = ast.literal_eval(value)
    if not help_text:
        raise ValueError(f"config_tables: field {stmt.target.id} has no help text")
    return FieldDoc(stmt.target.id, _render(_value(keywords.get("default"), names)), help_text)


def config_groups() -> dict[str, list[FieldDoc]]:
    """Each config dataclass of ``trainer/options.py`` and ``trainer/config.py`` -> its own fields, in source order
    (LoRA: TRL's names)."""
    names = _constants()
    out: dict[str, list[FieldDoc]] = {}
    nodes = [n for f in SOURCES for n in ast.parse((TRAINER / f).read_text(encoding="utf-8")).body]
    for node in nodes:
        if isinstance(node, ast.ClassDef) and (node.name.endswith("Arguments") or node.name in CONFIGS):
            fields = [f for f in (_field(s, names) for s in node.body) if f is not None]
            if fields:  # SignalArguments only bundles other groups
                out[node.name] = fields
    lora = next(
        n
        for n in ast.parse((TRAINER / "lora.py").read_text(encoding="utf-8")).body
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "LORA_FIELDS" for t in n.targets)
    )
    out["LoRAArguments"] = [
        FieldDoc(name, "TRL's", "trl.ModelConfig's help") for name in ast.literal_eval(lora.value)
    ]
    return out


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def config_table(items: list[str]) -> str:
    groups = config_groups()
    by_name = {f.name: f for fields in groups.values() for f in fields}
    rows: list[FieldDoc] = []
    for item in items:
        if item in groups:
            rows += groups[item]
        elif item in by_name:
            rows.append(by_name[item])
        else:
            raise ValueError(f"config_tables: {item!r} is neither a config group nor a field of one")
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    lines += [f"| `--{f.name}` | {f.default} | {_cell(f.help)} |" for f in rows]
    return "\n".join(lines)


def groups_table() -> str:
    lines = ["| group | fields |", "|---|---|"]
    for group, fields in config_groups().items():
        if group not in CONFIGS:
            lines.append(f"| `{group}` | {', '.join(f'`{f.name}`' for f in fields)} |")
    return "\n".join(lines)


def expand(markdown: str) -> str:
    """Replace every config marker; an unknown group or field raises (and fails the build)."""
    markdown = TABLE.sub(lambda m: config_table(m.group(1).split()), markdown)
    return GROUPS.sub(lambda m: groups_table(), markdown)


def on_page_markdown(markdown: str, **kwargs) -> str:
    return expand(markdown)
