"""Dynamo traces a module call under aitune's hook as cheaply as one under torch's own `Module.__call__`.

Why: when dynamo traces `self.layer(x)` it skips `Module.__call__` and `_call_impl` and goes straight to
`forward` when the module has no hooks - but only if the module's `__call__` is the function dynamo saw as
torch's when it was imported (`torch._dynamo.utils.unpatched_nn_module_call`, read in
`torch._dynamo.variables.nn_module`). With aitune's hook in place of `Module.__call__`, that check failed for
every submodule: dynamo inlined the hook, `_wrapped_call_impl` and `_call_impl` (their hook dictionaries, their
guards) for each call, and traced about twice as many attribute loads. On an H200 a warm rebuild of ResNet-50
traced 3606 attribute loads against torch.compile's 1653 (BERT-base: 3412 against 1561), and every
compile the JIT or the program ran under the hook paid for it.

How: while the hook is installed, dynamo's reference is the hook (`register(hook)`): the hook, under dynamo,
returns torch's own call unchanged (`runtime.is_dynamo_compiling`), so going straight to `forward` traces what
the hook would have run. A hook that chains to another party's `__call__` is not registered (that one may do
anything). Dynamo may be imported before or after the hook is installed: the reference is set now if dynamo's
module is loaded, else when it is imported (`wrapt.register_post_import_hook`); `unregister()` puts torch's own
back.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import wrapt

MODULE = "torch._dynamo.variables.nn_module"
NAME = "unpatched_nn_module_call"

_lock = threading.Lock()
_hook: Callable[..., Any] | None = None  # the hook dynamo should take for torch's own, while installed
_torchs: Callable[..., Any] | None = None  # torch's own `Module.__call__` (what the hook wraps)
_waiting = False  # a post-import hook is registered (wrapt keeps it for the process)


def _point(module: Any) -> None:
    """Set dynamo's reference to what it should be now (called with `_lock` held or from the import hook)."""
    if _hook is not None:
        setattr(module, NAME, _hook)
    elif _torchs is not None and getattr(module, NAME, None) is not _torchs:
        setattr(module, NAME, _torchs)


def _on_import(module: Any) -> None:
    with _lock:
        _point(module)


def register(hook: Callable[..., Any], torchs: Callable[..., Any]) -> None:
    """While `hook` replaces torch's `Module.__call__` (`torchs`, which it calls under dynamo), dynamo takes it
    for torch's own."""
    global _hook, _torchs, _waiting
    with _lock:
        _hook, _torchs = hook, torchs
        loaded = sys.modules.get(MODULE)
        if loaded is not None:
            _point(loaded)
        elif not _waiting:
            _waiting = True
            wrapt.register_post_import_hook(_on_import, MODULE)


def unregister() -> None:
    """Dynamo's reference is torch's own `Module.__call__` again (if dynamo is loaded; else when it is)."""
    global _hook
    with _lock:
        _hook = None
        loaded = sys.modules.get(MODULE)
        if loaded is not None:
            _point(loaded)
        for name in ("torch._dynamo.utils",):  # (dynamo imported under the hook captured the hook there too)
            other = sys.modules.get(name)
            if other is not None and _torchs is not None and getattr(other, NAME, None) is not _torchs:
                setattr(other, NAME, _torchs)


def current() -> Any:
    """What dynamo takes for torch's own `Module.__call__` now (None while dynamo is not loaded)."""
    loaded = sys.modules.get(MODULE)
    return getattr(loaded, NAME, None) if loaded is not None else None
