"""A warm CPU process runs torch's once-per-process compiler set-up while the program builds its model.

Why: a process whose JIT cache holds Inductor decisions for the CPU (a second replica, the next deployment)
rebuilds them on its first calls, and each rebuild first pays what torch pays once per process before a CPU
compile: Inductor's check of the vector instruction sets (test programs compiled and run in subprocesses, about
1 s on this project's 2-core CPU) and importing Inductor (`torch._inductor.compile_fx` and the C++ build
helpers, about 0.8 s). None of it depends on the model. The check mostly waits for its subprocesses, so it can
run beside the program's own start-up and the job's imports instead of before them.

How: `start()` (from `switch.enable`, on the thread that imported torch) looks for a CPU decision to build an
Inductor backend taken with this torch, Python and aitune (`wanted_devices`); if there is one, a side job of the
worker (`worker.start_side_job`: it steps aside while requests are served and is cancelled when the program
ends) runs the check, then imports those modules. A failure is logged at DEBUG; the job does the same later.
`AITUNE_WORKER_PREFETCH=off` turns it off. Nothing is patched: the identity graph module that the worker primes
(`prime_inductor_without_fx_patching`, which swaps `torch.fx.symbolic_trace` for a moment) is left to the first
job, since the program may be tracing its own model now.

Measured: `tests/aitune_jit/scripts/serve_loop.py` on a warm cache (this CPU, Python 3.11, three interleaved runs
each) was tuned 3.47-3.52 s after its first request with the prefetch against 4.72-5.17 s without, and the
whole process took 7.0-7.3 s against 8.1-8.6 s.

Why not for CUDA decisions: there the work is the import alone (3-4 s on the H100s, mostly Triton), which holds
the GIL. On an H100 (ResNet-50 probe, `docs/benchmarks.md`) importing it in the background made the warm job 3 s
shorter but the script's model set-up 3.2 s longer: the same time to tuned from the process start, and the first
request 3 s later. A CUDA decision starts nothing here.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable
from pathlib import Path

import torch

from aitune_core.checkpoint.manifest import versions
from aitune_core.decision_store import Decision
from aitune_jit import decisions, worker
from aitune_jit.config import jit_config
from aitune_jit.worker_env import env_choice

_logger = logging.getLogger("aitune.jit")

#: what a first Inductor compile imports (the module torch.compile's line imports, and the C++ build helpers)
MODULES = ("torch._inductor.compile_fx", "torch.utils.cpp_extension")
#: decision files looked at, newest first (a large shared cache folder is not read whole at start-up)
MAX_SCANNED = 64
INDUCTOR_BACKEND = "TorchInductorBackend"
#: device types whose decisions start the prefetch (why not "cuda": module docstring)
PREFETCHED_DEVICES = frozenset({"cpu"})

_started = False


def enabled() -> bool:
    """`AITUNE_WORKER_PREFETCH`: on (default) or off."""
    return env_choice("AITUNE_WORKER_PREFETCH", ("on", "off"), "on") == "on"


def wanted_devices(entries: Iterable[Decision | None]) -> set[str]:
    """Device types of the Inductor decisions among `entries` that this process could rebuild (same torch,
    Python and aitune versions as here); `start` acts on "cpu" only (module docstring)."""
    here = versions()
    devices = set()
    for decision in entries:
        if decision is None or decision.kind != "backend" or decision.backend_type != INDUCTOR_BACKEND:
            continue
        environment = decision.environment
        if all(environment.get(name) == value for name, value in here.items()):
            devices.add(environment.get("device", ""))
    return devices


def _newest_decisions() -> list[Decision | None]:
    store = decisions.store()
    if not store.folder.is_dir():
        return []
    paths = sorted(store.folder.glob("*.json"), key=_mtime, reverse=True)[:MAX_SCANNED]
    return [store.get(path.stem) for path in paths]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # (removed meanwhile by another replica's `cache clear`)
        return 0.0


def start() -> bool:
    """Start the prefetch once per process if the cache asks for it; True when started. Never raises."""
    global _started
    if _started or not enabled():
        return False
    _started = True
    try:
        if not jit_config.reuse_decisions:
            return False
        devices = wanted_devices(_newest_decisions()) & PREFETCHED_DEVICES
        if not devices:
            return False
        decisions.point_inductor_cache()  # (here, on the program's thread: the CPU check writes into that folder)
        worker.start_side_job("compiler-prefetch", lambda: prefetch(devices))
        return True
    except Exception:
        _logger.debug("the compiler prefetch did not start", exc_info=True)
        return False


def prefetch(devices: set[str]) -> None:
    """For a CPU decision, run the instruction-set check; then import what a first Inductor compile imports.
    The check goes first: it mostly waits for its subprocesses, so a job that starts meanwhile imports the
    compiler on the GIL the check leaves free."""
    if "cpu" in devices:
        from torch._inductor import cpu_vec_isa

        cpu_vec_isa.valid_vec_isa_list()  # (cached for the process)
    for name in MODULES:
        importlib.import_module(name)
    _logger.debug("compiler prefetched for %s (torch %s)", sorted(devices), torch.__version__)
