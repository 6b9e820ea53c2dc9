"""`compile_package`: export one graph of a module and compile it into an AOTInductor package in a child process.

The export (`onnx_export.export_program`: the graph spec's flat tensor graph, its batch and dynamic axes as
`Dim.DYNAMIC` over their recorded ranges; strict, i.e. dynamo's trace, because other threads may be calling the
module meanwhile) runs in the calling thread; the compile runs in
`aitune_core.aoti_compile_process`, a process of its own, so that it does not take turns with the caller's other
threads for the GIL. While the export runs, every tuned call in the process is answered by its original forward
(`dispatch_pause`): the exporter's patches are process-wide. The package is written beside its destination and
moved into place with `os.replace`: processes sharing the folder see the whole package or none.
`backends/aoti_package.py` loads it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from aitune_core.backends.aoti_package import file_sha256
from aitune_core.backends.dispatch_pause import original_forwards_only
from aitune_core.backends.onnx_export import export_program
from aitune_core.errors import BackendBuildError

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec

#: variables the child must not inherit: the JIT's start-up hook would tune the compiler itself
_CHILD_DROPS = ("AUTOWRAPT_BOOTSTRAP",)
#: how often the caller checks `should_stop` while the child compiles (seconds)
POLL_S = 0.2


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CHILD_DROPS}
    source = str(Path(__file__).resolve().parent.parent)  # the child imports this package from where we did
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH", "")) if p)
    return env


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-6:])[-limit:]


def _failure(status: int, log: Path) -> str:
    """What went wrong in the child, in words: the compile, or the verification of the package it made."""
    stage = "verifying the package" if "compiled; verifying" in log.read_text(errors="replace") else "compiling"
    how = f"died of signal {-status}" if status < 0 else f"failed (exit status {status})"
    return f"the AOTInductor process {how} while {stage}"


def _wait(child: subprocess.Popen[bytes], timeout_s: float, should_stop: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout_s
    while child.poll() is None:
        if should_stop() or time.monotonic() > deadline:
            child.kill()
            child.wait()
            why = "stopped" if should_stop() else f"took longer than {timeout_s:g}s"
            raise BackendBuildError(f"the AOTInductor compile {why}")
        time.sleep(POLL_S)


def compile_package(
    module: torch.nn.Module, graph_spec: GraphSpec, data: Sequence[Sample], device: torch.device, dest: Path, *,
    timeout_s: float = 1800.0, should_stop: Callable[[], bool] = lambda: False,
) -> str:
    """Write the package of `module`'s graph `graph_spec` to `dest`; returns its SHA-256 (hex). Raises
    `BackendBuildError` when the export or the compile fails, is stopped, or runs past `timeout_s`."""
    with original_forwards_only():  # the export's process-wide patches must not meet compiled calls
        program = export_program(module, graph_spec, data, device, strict=True)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{dest.stem}.", dir=dest.parent))
    try:
        torch.export.save(program, str(scratch / "program.pt2"))
        del program
        log = scratch / "compile.log"
        with open(log, "wb") as sink:
            child = subprocess.Popen(
                [sys.executable, "-m", "aitune_core.aoti_compile_process", str(scratch / "program.pt2"),
                 str(scratch / "package.pt2")], stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=_child_env())
            try:
                _wait(child, timeout_s, should_stop)
            finally:  # a job cancelled at exit (an exception raised in its thread) leaves no compile behind
                if child.poll() is None:
                    child.kill()
                    child.wait()
        if child.returncode != 0 or not (scratch / "package.pt2").is_file():
            raise BackendBuildError(f"{_failure(child.returncode, log)}: {_tail(log) or 'no output'}")
        digest = file_sha256(scratch / "package.pt2")
        os.replace(scratch / "package.pt2", dest)
        return digest
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch)
