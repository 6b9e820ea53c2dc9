"""Make the `benchmarks` package at the repository root importable, as `python -m benchmarks....` run from the
root does (`python -m pytest` from the root has it already; a bare `pytest` may not)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
