"""Imported first by the torch benchmarks: work from a checkout, offline, single-threaded unless told otherwise.

Importing it puts the repository root on ``sys.path`` and sets (without overriding) the offline and threading
variables the benchmarks assume; it must run before torch, transformers or trl are imported.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
for _key, _value in {
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}.items():
    os.environ.setdefault(_key, _value)
