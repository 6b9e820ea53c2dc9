"""Where a background tuning job spends its time, sampled from outside: a flat profile of aitune's job threads.

Why: the serving probe (`background_tuning`) says how slow requests are while a job runs and, for the slowest
ones, where the job was; it does not say what the job's seconds go to - stepping aside for requests, imports,
dynamo's trace, AOTAutograd, Inductor's lowering or its caches, CUDA-graph trees, validation, measurement. The
time to tuned of a warm start (seconds against a fraction of one for loading code) is that sum.

How: a daemon thread wakes every `period_s`, reads the stacks of the threads named `aitune-tuning-job*` (`JOB_THREADS`)
(`sys._current_frames`, no line text: a frame walk of file and function names) and counts each sample once per
category (the first of `CATEGORIES` whose marker is in the stack, innermost frames first; the step-aside wait
wins over what it interrupts), once per function anywhere in the stack (inclusive) and once for its innermost
frame (leaf). Sampling every 10 ms holds the GIL for well under 1 % of the time.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

#: (category, markers): a stack is in the first category with a marker that is a substring of one of its frames
#: ("<file path>:<function>"), frames read from the innermost out
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("stepping aside", ("worker_yield.py:_wait",)),
    ("import", ("<frozen importlib._bootstrap>:_find_and_load",)),
    ("cuda graphs", ("cudagraph_trees.py:",)),
    ("inductor caches", ("_inductor/codecache.py:", "_functorch/_aot_autograd/autograd_cache.py:",
                         "_inductor/runtime/triton_heuristics.py:", "torch/_inductor/async_compile.py:")),
    ("inductor lowering", ("torch/_inductor/",)),
    ("aot autograd", ("torch/_functorch/", "torch/fx/experimental/proxy_tensor.py:")),
    ("dynamo trace", ("torch/_dynamo/",)),
    ("validation", ("aitune_core/validation/",)),
    ("measurement", ("aitune_core/profiling.py:", "aitune_core/gpu_backlog.py:")),
    ("aitune", ("/aitune_core/", "/aitune_jit/")),
)
TOP = 25
#: the names of aitune's job threads begin so (`aitune_jit.worker`)
JOB_THREADS = "aitune-tuning-job"


def frame_names(frame: FrameType | None) -> list[str]:
    """"<file path>:<function>" of `frame` and its callers, innermost first."""
    names = []
    while frame is not None:
        names.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        frame = frame.f_back
    return names


def category(names: list[str]) -> str:
    """The first of `CATEGORIES` whose marker is in one of `names` (innermost first); "other" when none is."""
    for name in names:
        for label, markers in CATEGORIES:
            if any(marker in name for marker in markers):
                return label
    return "other"


def _short(name: str) -> str:
    path, _, function = name.rpartition(":")
    parts = path.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{function}"


class JobProfile:
    """A sampling profile of aitune's job threads (module docstring); `phase` names the job's step per sample."""

    def __init__(self, period_s: float = 0.01, phase: Callable[[], str | None] | None = None,
                 threads: str = JOB_THREADS) -> None:
        self.period_s = period_s
        self.threads = threads
        self._phase = phase
        self.samples = 0
        self.by_category: Counter[str] = Counter()
        self.by_phase: Counter[str] = Counter()
        self.inclusive: Counter[str] = Counter()
        self.leaf: Counter[str] = Counter()
        self._stopped = threading.Event()

    def start(self) -> JobProfile:
        threading.Thread(target=self._loop, name="job-profile", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _loop(self) -> None:
        while not self._stopped.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        """One sample of every job thread alive now."""
        jobs = [t.ident for t in threading.enumerate() if t.name.startswith(self.threads)]
        if not jobs:
            return
        frames = sys._current_frames()
        for ident in jobs:
            names = frame_names(frames.get(ident))
            if not names:
                continue
            self.add(names, self._phase() if self._phase is not None else None)

    def add(self, names: list[str], phase: str | None = None) -> None:
        """Count one stack (innermost frame first)."""
        self.samples += 1
        self.by_category[category(names)] += 1
        self.by_phase[(phase or "other").split(" ")[0]] += 1
        self.inclusive.update({_short(name) for name in names})
        self.leaf[_short(names[0])] += 1

    def summary(self) -> dict[str, Any]:
        """Shares of the samples (0..1) by category, by the job's step, and the top functions."""
        total = max(self.samples, 1)

        def shares(counter: Counter[str], top: int | None = None) -> dict[str, float]:
            return {name: round(count / total, 4) for name, count in counter.most_common(top)}

        return {"samples": self.samples, "period_ms": 1e3 * self.period_s,
                "seconds": round(self.samples * self.period_s, 2),
                "by_category": shares(self.by_category), "by_phase": shares(self.by_phase),
                "top_inclusive": shares(self.inclusive, TOP), "top_leaf": shares(self.leaf, TOP)}

