"""`torch.compiler.is_compiling()` answers for the calling thread while JIT tuning is installed.

Why: since torch 2.13, dynamo holds one process-wide flag True for a whole compile
(`torch.compiler._compile_session_context`, entered for every frame it converts), so `is_compiling()` reads True
in every thread while any thread compiles. Libraries take other paths when they think they are being compiled:
transformers 5 collects `output_hidden_states` and `output_attentions` in a context variable
(`transformers/utils/output_capturing.py`), and while "compiling" in one shared global instead. Found by the sixth
review (2026-11-26, this CPU, torch 2.13): a tiny BERT embedding service on a pool of 4 threads, every request
asking for hidden states, returned other requests' hidden states (0, 2 or 4 entries instead of 3, wrong lengths)
or raised `IndexError` while aitune compiled the model's layers, in the background or inline in another thread.
Plain `torch.compile` in one of those threads does the same, for as long as its compile lasts; background tuning
compiles for tens of seconds while the program serves.

How: while installed (`install` / `uninstall`, with the JIT's hook), `_compile_session_context` marks the calling
thread instead of setting the module's flag, and `is_compiling`'s code object is swapped for one that also reads
that mark, so every reference to the function, however it was imported, answers per thread. Dynamo recognises
`is_compiling` by identity, which does not change, and folds it to True in the code it traces. Where torch has
no session flag (2.12 and before, where `is_compiling()` is False outside dynamo's traced frames), nothing is
installed. torch.export still sets the flag for every thread (`torch/_export/utils.py`), as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import torch

from aitune_core.patch import Patch

_logger = logging.getLogger("aitune.jit")
_local = threading.local()
_lock = threading.Lock()
_MARK = "_aitune_compiling_in_this_thread"  # the name `is_compiling`'s swapped code reads in torch.compiler
_state: dict[str, Any] = {}  # while installed: "patches" (list[Patch]), "code" (is_compiling's own code object)


def compiling_in_this_thread() -> bool:
    """True while this thread is inside a compile session (see the module docstring)."""
    return getattr(_local, "depth", 0) > 0


@contextlib.contextmanager
def _compile_session_per_thread() -> Iterator[None]:
    """`torch.compiler._compile_session_context`, for the calling thread only."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def _is_compiling() -> bool:  # pragma: no cover - its code runs as torch.compiler.is_compiling's (globals there)
    if torch.jit.is_scripting():
        return False
    return _is_compiling_flag or _aitune_compiling_in_this_thread()  # noqa: F821 (names of torch.compiler)


def _supported() -> bool:
    compiler = torch.compiler
    function = getattr(compiler, "is_compiling", None)
    return (hasattr(compiler, "_compile_session_context") and hasattr(compiler, "_is_compiling_flag")
            and getattr(function, "__code__", None) is not None and not function.__code__.co_freevars
            and "_is_compiling_flag" in function.__code__.co_names)


def install() -> None:
    """Make `is_compiling()` answer per thread (idempotent; nothing where torch has no session flag)."""
    with _lock:
        if _state or not _supported():
            return
        compiler = torch.compiler
        patches = [
            Patch(compiler, _MARK, compiling_in_this_thread).apply(),
            Patch(compiler, "_compile_session_context", _compile_session_per_thread).apply(),
        ]
        function = compiler.is_compiling
        own = function.__code__
        names = {"co_name": own.co_name, "co_firstlineno": own.co_firstlineno, "co_filename": own.co_filename}
        if hasattr(own, "co_qualname"):  # (Python 3.11+)
            names["co_qualname"] = own.co_qualname
        _state["code"] = own
        function.__code__ = _state["swapped"] = _is_compiling.__code__.replace(**names)
        _state["patches"] = patches


def uninstall() -> None:
    """Put torch's function and context back (a newer replacement by someone else stays)."""
    with _lock:
        if not _state:
            return
        function = torch.compiler.is_compiling
        if function.__code__ is _state["swapped"]:
            function.__code__ = _state["code"]
        else:
            _logger.debug("torch.compiler.is_compiling was changed again after aitune; leaving it")
        for patch in reversed(_state["patches"]):
            patch.restore()
        _state.clear()


def installed() -> bool:
    return bool(_state)
