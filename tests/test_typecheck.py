"""``scripts/typecheck.py`` shows mypy the package as installed (``trainer/`` as ``llm_gym.trainer``) and reports
errors with repository paths. (mypy itself runs in CI: ``.ci/run``.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    path = ROOT / "scripts" / "typecheck.py"
    spec = importlib.util.spec_from_file_location("typecheck_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_view_lays_out_the_installed_package(tmp_path):
    tc = _script()
    view = tc.build_view(tmp_path / "view")
    pkg = view / "llm_gym"
    assert (pkg / "trainer" / "grpo.py").resolve() == ROOT / "trainer" / "grpo.py"
    assert (pkg / "core" / "env.py").resolve() == ROOT / "llm_gym" / "core" / "env.py"
    assert (pkg / "assets").resolve() == ROOT / "assets"
    assert not (pkg / "__pycache__").exists()


def test_errors_point_at_repository_files():
    tc = _script()
    out = ".cache/typecheck_src/llm_gym/trainer/grpo.py:12: error: x\n.cache/typecheck_src/llm_gym/core/env.py:3: e\n"
    assert tc.repository_paths(out) == "trainer/grpo.py:12: error: x\nllm_gym/core/env.py:3: e\n"


def test_ci_runs_the_type_check_and_dev_installs_mypy():
    assert "python scripts/typecheck.py" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert '"mypy' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
