"""Where on a job thread's stack the step-aside gate may raise a cancel (`worker_yield._StepAside.cancel`).

Why: a cancel raised where a function starts is what that function would raise itself, so the code it unwinds
through runs its cleanup whole; but raised at the start of a function that releases what its caller took (a
context manager's exit, a lock's release), it leaves that held. A module lock released by importlib's
`_ModuleLockManager.__exit__` stayed held when the cancel was raised at that exit's start, and the program's own
import of the module at exit waited for good. The cancel is raised at the next function start that may raise it.
"""

from __future__ import annotations

from typing import Any

#: functions where a cancel raised at their start would leave what the caller took held: a context manager's
#: exit, a lock's release (importlib's module locks, `threading`'s conditions, `logging`'s handlers)
_RELEASING = frozenset({"__exit__", "__aexit__", "release", "_release_save", "_acquire_restore", "__del__"})
_RELEASING_FILES = ("threading.py", "/logging/__init__.py")


def may_cancel_in(code: Any) -> bool:
    """Whether a cancel may be raised as the function of `code` starts (None: no function named): not in
    `_RELEASING` functions, nor in frozen importlib, `threading` or `logging` (module docstring)."""
    if code is None:
        return True
    filename = code.co_filename
    return (code.co_name not in _RELEASING and not filename.startswith("<frozen ")
            and not filename.endswith(_RELEASING_FILES))
