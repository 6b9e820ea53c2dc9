"""A warm CPU process runs torch's once-per-process compiler set-up while the program builds its model.

Why: a process whose JIT cache holds Inductor decisions for the CPU (a second replica, the next deployment)
rebuilds them on its first calls, and each rebuild first pays what torch pays once per process before a CPU
compile: importing Inductor (`torch._inductor.cpu_vec_isa` alone pulls in most of it: about 1 s on this
project's 2-core CPU) and Inductor's check of the vector instruction sets (test programs compiled and run in
subprocesses, about 1 s). None of it depends on the model, and the check mostly waits for its subprocesses, so
it can run beside the program's own start-up and the job's work instead of before them.

How: `start()` (from `switch.enable`, on the thread that imported torch) looks for a decision to build an
Inductor backend taken with this torch, Python and aitune (`wanted_devices`). For one of any device it imports
dynamo at once (`DYNAMO`: aitune itself does not, see `runtime.skip_as_top_frame`). For a CPU one, a side job of the
worker (`worker.start_side_job`: it steps aside while requests are served and is cancelled when the program
ends) imports those modules, says so (a tuning job that starts meanwhile waits for that, so the two never import
torch's mutually importing modules at once), then runs the check beside the job. A failure is logged at DEBUG;
the job does the same later. `AITUNE_WORKER_PREFETCH=off` turns it off. Nothing is patched: the identity graph
module that the worker primes (`inductor_priming`, which swaps `torch.fx.symbolic_trace` for a moment) is left
to the first job, since the program may be tracing its own model now.

Measured: `tests/aitune_jit/scripts/serve_loop.py` on a warm cache (this CPU, Python 3.11, three interleaved runs
each) was tuned 3.71-4.01 s after its first request with the prefetch against 5.19-5.43 s without, and the whole
process took 7.5-7.6 s against 8.8-9.1 s.

Why not for CUDA decisions: there the work is the import alone (3-4 s on the H100s, mostly Triton), which holds
the GIL. On an H100 (ResNet-50 probe, `docs/benchmarks.md`) importing it in the background made the warm job 3 s
shorter but the script's model set-up 3.2 s longer: the same time to tuned from the process start, and the first
request 3 s later. A CUDA decision starts nothing here.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Iterable
from pathlib import Path

import torch

from aitune_core.checkpoint.manifest import versions
from aitune_core.decision_store import Decision
from aitune_jit import decisions, worker
from aitune_jit.config import jit_config
from aitune_jit.worker_env import env_choice

_logger = logging.getLogger("aitune.jit")

#: imported before the check (it needs the first; the second, the C++ build helpers, a warm rebuild imports too)
MODULES = ("torch._inductor.cpu_vec_isa", "torch.utils.cpp_extension")
#: imported at once, on the program's thread, by a process whose cache holds a decision it can rebuild (any
#: device): aitune does not import dynamo for a process that may never tune (1.3 s of start-up on this CPU), but a
#: warm process's first job would import it while its requests wait (a warm CPU serving process was tuned 1.5 s
#: later after its first request when the import moved there)
DYNAMO = "torch._dynamo"
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
        wanted = wanted_devices(_newest_decisions())
        if wanted:  # a warm process: its first job rebuilds with dynamo, which aitune itself no longer imports
            importlib.import_module(DYNAMO)
        devices = wanted & PREFETCHED_DEVICES
        if not devices:
            return False
        decisions.point_inductor_cache()  # (here, on the program's thread: the CPU check writes into that folder)
        imported = threading.Event()
        worker.start_side_job("compiler-prefetch", lambda: prefetch(devices, imported), imported)
        return True
    except Exception:
        _logger.debug("the compiler prefetch did not start", exc_info=True)
        return False


def prefetch(devices: set[str], imported: threading.Event | None = None) -> None:
    """Import Inductor's C++ side (`torch._inductor.cpu_vec_isa`, which pulls in most of Inductor: about 1 s here),
    say so (`imported`: a tuning job waits for it rather than import the same modules at once), then, for a CPU
    decision, run the instruction-set check. The check mostly waits for its subprocesses, so a job that starts
    meanwhile imports the rest of the compiler and traces on the GIL the check leaves free."""
    for name in MODULES:
        importlib.import_module(name)
    if imported is not None:
        imported.set()
    if "cpu" in devices:
        from torch._inductor import cpu_vec_isa

        cpu_vec_isa.valid_vec_isa_list()  # (cached for the process)
    _logger.debug("compiler prefetched for %s (torch %s)", sorted(devices), torch.__version__)
