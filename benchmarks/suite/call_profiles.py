"""Where a call spends its host time: torch.profiler's op table and cProfile's Python-function table.

Plain torch and the standard library only (the workload script, which never imports aitune, uses them too).
Both take `call(batch)` and run it `calls` times under `torch.no_grad()`, synchronizing the device after each
call as the timed loops do. cProfile slows every Python call it sees: compare its tables with each other,
never with measured latencies.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import re
from collections.abc import Callable
from typing import Any

import torch


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)


def op_table(
    call: Callable[[Any], Any], batch: Any, device: str, calls: int = 50, rows: int = 25,
    sort_by: str = "self_cpu_time_total",
) -> list[str]:
    """Top ops by self CPU time (with their CUDA time on a GPU): extra kernels or launches show up here.
    `sort_by="self_cuda_time_total"` ranks the GPU kernels instead: two processes whose kernels differ (other
    autotuning choices) show it there."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if str(device).startswith("cuda") else [])
    sync = _sync(device)
    with torch.no_grad(), profile(activities=activities) as prof:
        for _ in range(calls):
            call(batch)
            sync()
    return prof.key_averages().table(sort_by=sort_by, row_limit=rows).splitlines()


def python_table(call: Callable[[Any], Any], batch: Any, device: str, calls: int = 200, rows: int = 25) -> list[str]:
    """Top Python functions by own time: host work torch.profiler does not see (hooks, pytree walks, guards,
    CUDA-graph-tree bookkeeping)."""
    sync = _sync(device)
    profiler = cProfile.Profile()
    with torch.no_grad():
        profiler.enable()
        for _ in range(calls):
            call(batch)
            sync()
        profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
    return [line for line in text.getvalue().splitlines() if line.strip()]


_TOTAL = re.compile(r"^Self (CPU|CUDA) time total:\s*([0-9.]+)\s*(us|ms|s)\s*$")
_SCALE_TO_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def table_totals(lines: list[str], calls: int) -> dict[str, float]:
    """Per call, the profiled host time (`cpu_ms`) and device time (`cuda_ms`) from an `op_table` footer.

    Two processes of one contender whose latencies differ: equal `cuda_ms` puts the difference on the host side,
    unequal `cuda_ms` on the kernels the process runs."""
    totals: dict[str, float] = {}
    for line in lines:
        match = _TOTAL.match(line.strip())
        if match:
            kind, value, unit = match.groups()
            totals[f"{kind.lower()}_ms"] = float(value) * _SCALE_TO_MS[unit] / max(1, calls)
    return totals
