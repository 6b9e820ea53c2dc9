"""The autowrapt entry point: `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` switches JIT tuning on when
`torch` is first imported.

autowrapt's start-up file (`autowrapt-init.pth`) reads the variable at interpreter start and registers every
entry point of the named group as a post-import hook (wrapt) for the module the entry point is named after.
This package declares `[project.entry-points.aitune_enable_jit_tuning] torch = ...`, so `import torch`
anywhere in the program calls `enable_on_torch_import(torch)` right after torch finished importing.
"""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType

_logger = logging.getLogger("aitune.jit")


def enable_on_torch_import(module: ModuleType | None = None) -> None:
    """Post-import hook for `torch`; never raises (a failure is logged and the program runs untuned).
    A failure is visible: the stderr handler for aitune's WARNINGs is installed first."""
    if in_torch_compile_worker():
        return
    try:
        from aitune_core.log import install_stderr_warnings

        install_stderr_warnings()  # before `aitune_jit` reads its AITUNE_JIT_* variables, which may warn
        from aitune_jit.switch import enable

        enable()
        _logger.info("aitune JIT tuning enabled (AUTOWRAPT_BOOTSTRAP)")
    except Exception:
        _logger.exception("aitune JIT tuning could not be enabled; the program runs without it")


def in_torch_compile_worker() -> bool:
    """True in a process torch started to compile (`torch/_inductor/compile_worker/__main__.py`: Triton's and
    C++'s parallel builds, Inductor's code generation for a background job). It inherits the environment, the
    variable included, but runs no model: tuning there would only slow the compile down."""
    script = sys.argv[0] if sys.argv else ""
    return os.path.normpath(script).endswith(os.path.join("compile_worker", "__main__.py"))
