"""Where on a job thread's stack the step-aside gate may raise a cancel (`worker_yield._StepAside.cancel`).

Why: a cancel raised where a function starts is what that function would raise itself, so the code it unwinds
through runs its cleanup whole; but raised at the start of a function that releases what its caller took (a
context manager's exit, a lock's release), it leaves that held. A module lock released by importlib's
`_ModuleLockManager.__exit__` stayed held when the cancel was raised at that exit's start, and the program's own
import of the module at exit waited for good. The cancel is raised at the next function start that may raise it.

Nor is a cancel raised while the thread runs a module's top-level code (an import in progress, anywhere on its
stack): the half-run module would be dropped from `sys.modules`, but what it had already put into other modules'
registries stays, and every later import of it fails. Seen with a training switch that stopped a job in the middle
of Inductor's first import: the program's own `torch.compile` then failed with "duplicate template name,
flash_attention_cutedsl" (networkx: "Algorithm already exists in dispatch namespace").
"""

from __future__ import annotations

import sys
from typing import Any

#: functions where a cancel raised at their start would leave what the caller took held: a context manager's
#: exit, a lock's release (importlib's module locks, `threading`'s conditions, `logging`'s handlers)
_RELEASING = frozenset({"__exit__", "__aexit__", "release", "_release_save", "_acquire_restore", "__del__"})
_RELEASING_FILES = ("threading.py", "/logging/__init__.py")


def may_cancel_in(code: Any) -> bool:
    """Whether a cancel may be raised on this thread as the function of `code` starts (None: no function named):
    not in `_RELEASING` functions, nor in frozen importlib, `threading` or `logging`, nor anywhere inside an import
    (module docstring). Asked only when a cancel is pending: it walks the thread's stack."""
    if code is not None:
        filename = code.co_filename
        if code.co_name in _RELEASING or filename.startswith("<frozen ") or filename.endswith(_RELEASING_FILES):
            return False
    return not importing()


def importing() -> bool:
    """Whether the current thread is running a module's top-level code for an import (a `<module>` frame that
    importlib called)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            caller = frame.f_back
            if caller is not None and caller.f_code.co_filename.startswith("<frozen importlib"):
                return True
        frame = frame.f_back
    return False
