"""benchmarks/probes/watch_overhead.py runs and writes its JSON, the slicing module included (a short run: the
figures themselves come from the benchmark, `python -m benchmarks.probes.watch_overhead`)."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.common import REPO


def test_watch_overhead_benchmark_smoke(tmp_path):
    out = tmp_path / "watch_overhead.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.probes.watch_overhead", "--rounds", "3", "--iters", "400",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads(out.read_text())
    cases = [row["case"] for row in payload["rows"]]
    assert "dispatcher call, slicing module, with watch" in cases
    assert payload["sliced_with_over_without"] > 0 and payload["git_commit"] and payload["date"]
