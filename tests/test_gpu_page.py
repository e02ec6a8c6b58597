"""Every command of the "Train on a GPU" page (``docs/training/gpu.md``), read from the page and run on CPU.

- ``llmgym-train ...`` runs with ``--dry_run`` (added when the page leaves it out: the real run needs a GPU);
- ``accelerate launch ... -m llm_gym.trainer.cli ARGS``: accelerate's own parser reads the launch flags, and
  ``llmgym-train ARGS --dry_run --accelerate_config`` runs on a copy of the config with the page's
  ``--num_processes``;
- ``python benchmarks/gpu_check.py ...`` runs with the tiny model shape on CPU (``--use_vllm`` must refuse CPU);
- ``llmgym-eval ...`` runs with the tiny test model in place of the trained one, on 2 seeds;
- ``python -c ...`` runs as written;
- ``pip install ...`` cannot run offline: the extras and version pins it names must be the project's.

A ```text block right after a command block holds lines that command prints: each must be in its output. A
command the test does not know how to run fails the test, so the page cannot gain an unchecked command.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

pytest.importorskip("trl")

from tests import docs_site as ds  # noqa: E402
from tests._tiny import TINY_QWEN2_SHAPE  # noqa: E402

ROOT = ds.ROOT
PAGE = ROOT / "docs" / "training" / "gpu.md"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.M | re.S)


def page_commands(markdown: str) -> list[tuple[str, list[str]]]:
    """``(command, lines it must print)`` for every command of the page's bash blocks, in order."""
    out: list[tuple[str, list[str]]] = []
    previous_end, previous_bash = -1, False
    for m in _FENCE.finditer(markdown):
        language, body = m.group(1), m.group(2)
        if language == "bash":
            out += [(line, []) for line in ds.logical_lines(body)]
        elif language == "text" and previous_bash and not markdown[previous_end : m.start()].strip():
            out[-1][1].extend(line.strip() for line in body.splitlines() if line.strip())
        previous_end, previous_bash = m.end(), language == "bash"
    return out


def test_the_page_is_in_the_nav_and_linked_from_the_quickstart():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    assert re.search(r"^\s+- .*: training/gpu\.md$", nav, flags=re.M)
    assert "(gpu.md)" in (ROOT / "docs" / "training" / "quickstart.md").read_text(encoding="utf-8")


def test_page_commands_reads_commands_and_their_output_blocks():
    md = "```bash\na \\\n  b\n# c\nd\n```\n\n```text\nout 1\n```\n\nx\n\n```text\nnot output\n```\n"
    assert page_commands(md) == [("a b", []), ("d", ["out 1"])]


# -------------------------------------------------------------------------------------------- the commands
def _project_requirement(name: str) -> str:
    from packaging.requirements import Requirement

    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        for spec in extra:
            req = Requirement(spec)
            if req.name == name:
                return str(req.specifier)
    raise AssertionError(f"the project does not require {name}")


def _pip(tokens: list[str]) -> str:
    """pip cannot run offline: the page's packages, extras and pins must be the project's."""
    from importlib.metadata import metadata

    from packaging.requirements import Requirement

    args = tokens[2:]
    assert tokens[:2] == ["pip", "install"], tokens
    if "--index-url" in args:
        url = args[args.index("--index-url") + 1]
        assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d+", url), url
        assert [a for a in args if a not in ("--index-url", url)] == ["torch"]
        assert _project_requirement("torch")  # the project accepts a torch the user installs first
    elif "-e" in args:
        spec = args[args.index("-e") + 1]
        m = re.fullmatch(r"\.\[([\w,]+)\]", spec)
        assert m, spec
        extras = PYPROJECT["project"]["optional-dependencies"]
        assert all(e in extras for e in m.group(1).split(",")), (m.group(1), sorted(extras))
    else:
        for arg in args:
            req = Requirement(arg)
            assert str(req.specifier) == _project_requirement(req.name), (arg, "not the project's pin")
            provided = metadata(req.name).get_all("Provides-Extra") or []
            assert set(req.extras) <= set(provided), (req.extras, provided)
    return ""


TINY = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 400, **TINY_QWEN2_SHAPE}
_SMALL = ["num_prompts=2", "num_generations=2", "per_device_train_batch_size=2", "max_new_tokens=4"]
_SMALL += ["max_turns=2", "max_completion_length=64", "bf16=false"]


def _gpu_check(args: list[str], tmp_path: Path, capsys) -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check
    import torch

    if "--use_vllm" in args and not torch.cuda.is_available():
        assert gpu_check.main(args) == 2
        assert "--use_vllm needs a CUDA GPU" in capsys.readouterr().err
        args = [a for a in args if a != "--use_vllm"]  # the rest of the command, as without vLLM
    cfg = tmp_path / "tiny_config.json"
    cfg.write_text(json.dumps(TINY))
    tiny = ["--model_config", str(cfg), "--device", "cpu", "--steps", "1", "--prompt_length", "8"]
    assert gpu_check.main(args + tiny + [x for s in _SMALL for x in ("--set", s)]) == 0
    if "--json" in args:
        report = json.loads((tmp_path / args[args.index("--json") + 1]).read_text())
        assert report["rounds"] and report["one_step"]["changed_fraction"] > 0.9
    return capsys.readouterr().out


def _train(args: list[str], capsys) -> str:
    from llm_gym.trainer.cli import main

    if "--dry_run" not in args:
        args = [*args, "--dry_run"]  # the real run needs the GPU
    code = main(args)
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    assert "llmgym-train --dry_run:" in out.out and "memory:" in out.out
    return out.out


def _accelerate(tokens: list[str], tmp_path: Path, capsys) -> str:
    import yaml
    from accelerate.commands.launch import launch_command_parser

    launch = launch_command_parser().parse_args(tokens[2:])
    assert launch.module and launch.training_script == "llm_gym.trainer.cli", tokens
    config = yaml.safe_load((ROOT / launch.config_file).read_text(encoding="utf-8"))
    if launch.num_processes:
        config["num_processes"] = launch.num_processes
    copy = tmp_path / Path(launch.config_file).name
    copy.write_text(yaml.safe_dump(config))
    out = _train([*launch.training_script_args, "--accelerate_config", str(copy)], capsys)
    kind = "FSDP" if config["distributed_type"] == "FSDP" else "DDP"
    assert f"per GPU ({kind} x{config['num_processes']})" in out, out[-800:]
    # the page's rule: per device x accumulation x GPUs = the profiles' update batch of 32 (4 steps per round)
    per_device, accumulation = (
        int(re.search(rf"^{name}\s+(\d+)", out, flags=re.M).group(1))
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps")
    )
    assert per_device * accumulation * config["num_processes"] == 32, (per_device, accumulation, config)
    return out


def _eval(args: list[str], tiny_dir: Path, tmp_path: Path, capsys) -> str:
    from llm_gym.trainer.evaluate import main

    def value(flag: str) -> str:
        return args[args.index(flag) + 1]

    replaced = {"--model": str(tiny_dir), "--num_eval_seeds": "2"}
    args = [replaced.get(args[i - 1], a) if i else a for i, a in enumerate(args)]
    assert main([*args, "--max_new_tokens", "8", "--no_progress"]) == 0, capsys.readouterr().err[-2000:]
    assert (tmp_path / value("--output_dir") / "summary.json").is_file()
    return capsys.readouterr().out


def _run(command: str, tiny_dir: Path, tmp_path: Path, capsys) -> str:
    tokens = shlex.split(command)
    if tokens[0] == "pip":
        return _pip(tokens)
    if tokens[:2] == ["python", "-c"]:
        proc = subprocess.run([sys.executable, "-c", tokens[2]], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout
    if tokens[:2] == ["python", "benchmarks/gpu_check.py"]:
        return _gpu_check(tokens[2:], tmp_path, capsys)
    if tokens[0] == "llmgym-train":
        return _train(tokens[1:], capsys)
    if tokens[:2] == ["accelerate", "launch"]:
        return _accelerate(tokens, tmp_path, capsys)
    if tokens[0] == "llmgym-eval":
        return _eval(tokens[1:], tiny_dir, tmp_path, capsys)
    raise AssertionError(f"tests/test_gpu_page.py does not know how to run {command!r}: teach it, on CPU")


@pytest.mark.slow
def test_every_command_of_the_gpu_page_runs_on_cpu(tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # outputs (gpu_check.json, runs/...) land here
    commands = page_commands(PAGE.read_text(encoding="utf-8"))
    ran = {c.split()[0] for c, _ in commands}
    assert {"pip", "python", "llmgym-train", "accelerate", "llmgym-eval"} <= ran, ran
    for command, expected in commands:
        out = _run(command, tiny_dir, tmp_path, capsys)
        missing = [line for line in expected if line not in out]
        assert not missing, f"{command!r} no longer prints {missing}; it printed:\n{out[-1500:]}"


@pytest.mark.slow
def test_the_gpu_check_lines_the_page_explains_are_in_its_report(tmp_path, monkeypatch, capsys):
    """The first column of the page's table of gpu_check lines names lines of the report (on CPU: not vLLM's)."""
    monkeypatch.chdir(tmp_path)
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## 2.", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    names = [re.findall(r"`([^`]+)`", row.split(" | ")[0]) for row in rows]
    starts = [re.split(r"\.\.\.|\{|\b[A-Z]\b", n.replace("\\|", "|"))[0].strip() for ns in names for n in ns]
    starts = [s for s in starts if s and "vllm" not in s.lower()]
    assert len(starts) >= 6, starts
    report = _gpu_check(["--env", "sokoban", "--gpu_gib", "80"], tmp_path, capsys)
    missing = [s for s in starts if s not in report]
    assert not missing, f"the page explains report lines gpu_check does not print: {missing}\n{report}"
