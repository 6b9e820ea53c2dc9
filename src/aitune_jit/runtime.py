"""The hook's run-time state below the node: the per-thread stack of nodes being called and the bypass depth,
whether the hook is installed, the attribute a module's node lives in, and the checks for dynamo.

While `bypassed()` is active in a thread (tuning, graph-break checks, a tuned backend running), every
`Module.__call__` in that thread goes straight to the original, so nothing aitune runs is ever recorded,
adopted into the hierarchy or tuned again.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from aitune_jit.node_registry import TreeNode

#: the instance attribute of a module seen by the hook: its node (`PatchedModule`) or a `Marker`
NODE_ATTR = "_aitune_jit_node"

#: dynamo constant-folds these calls to True while it traces, so the hook and the forward wrappers send
#: traced calls straight to the original code. `is_dynamo_compiling` is the cheapest (`return False` in
#: eager), used on the hot path; `is_compiling` also covers torch.export, used on the slow path.
is_compiling = torch.compiler.is_compiling
is_dynamo_compiling = torch.compiler.is_dynamo_compiling

try:
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _eval_frame_callback
except ImportError:  # pragma: no cover - a torch without it

    def _eval_frame_callback() -> object:
        return None


def in_dynamo_region() -> bool:
    """True while a dynamo-compiled call is running in this thread (its frame callback is installed).

    The hook's own frames are never compiled as the outermost frame of a compiled call (see
    `skip_as_top_frame`), so inside `torch.compile(module)(...)` they run as plain Python before the
    module's forward frame is compiled; there they must pass every call straight through."""
    return _eval_frame_callback() is not None


def skip_as_top_frame(*functions: Callable[..., Any]) -> None:
    """Tell dynamo not to compile frames of these functions when they are the outermost frame of a compiled
    call (`torch.compile(module)` starts at `module.__call__`), only the frames they call - as it does for
    torch's own `Module.__call__`. Otherwise every module compiled in the process would share aitune's code
    objects as their top frame, and after `recompile_limit` (8) different modules dynamo would stop
    compiling. Inlining (a compiled forward calling a submodule) is not affected. Such skipped frames run as
    plain Python while dynamo's frame callback is installed: the slow paths check `in_dynamo_region()` and
    pass the call through.

    Dynamo is not imported for it (1.3 s of every process's start-up on a 2-core CPU): when it is not loaded yet,
    the codes are marked as soon as it is (`wrapt.register_post_import_hook`), before it can compile anything."""
    codes = [fn.__code__ for fn in functions]
    loaded = sys.modules.get(_EVAL_FRAME)
    if loaded is not None:
        _skip(loaded, codes)
        return
    import wrapt

    wrapt.register_post_import_hook(lambda module: _skip(module, codes), _EVAL_FRAME)


_EVAL_FRAME = "torch._dynamo.eval_frame"


def _skip(eval_frame: Any, codes: list[Any]) -> None:
    skip_code = getattr(eval_frame, "skip_code", None)
    if skip_code is None:  # pragma: no cover - a torch without it: only the protection above is lost
        return
    for code in codes:
        skip_code(code)


class _Process:
    """Process-wide: whether `hook.install()` has patched `torch.nn.Module.__call__` (written by `hook` only)."""

    __slots__ = ("installed",)

    def __init__(self) -> None:
        self.installed = False


process = _Process()


def is_installed() -> bool:
    """True while the hook's patch of `torch.nn.Module.__call__` is in place."""
    return process.installed


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.stack: list[TreeNode] = []  # nodes whose __call__ is running, innermost last
        self.bypass: int = 0  # > 0: every module call goes straight to the original __call__
        self.scope: int = 0  # > 0: modules constructed now are candidates (decorator mode)


tls = _ThreadState()


@contextmanager
def bypassed() -> Iterator[None]:
    """Module calls made by this thread inside the block skip the hook entirely."""
    state = tls
    state.bypass += 1
    try:
        yield
    finally:
        state.bypass -= 1


class Marker:
    """What the hook stores on a module that is not (yet) a node. `fast` markers cost one lookup per call."""

    __slots__ = ("fast", "name")

    def __init__(self, name: str, fast: bool) -> None:
        self.name = name
        self.fast = fast

    def __copy__(self) -> Marker:  # copies of a module keep the same marker object
        return self

    def __deepcopy__(self, memo: dict) -> Marker:
        return self

    def __reduce__(self) -> tuple[object, tuple[()]]:
        # a pickled module carries no aitune object: its slot unpickles as None (a module never seen)
        return (type(None), ())

    def __repr__(self) -> str:
        return f"<aitune_jit marker {self.name}>"


#: never a node: torch internals, containers, modules compiled by the user, aitune's own helper modules
PASS = Marker("pass", fast=True)
#: decorator mode: built outside a decorated scope; fast unless import/env-var mode is switched on later
OUT_OF_SCOPE = Marker("out_of_scope", fast=True)
#: decorator mode: built inside a decorated scope, not called yet
CANDIDATE = Marker("candidate", fast=False)
_MARKERS = {m.name: m for m in (PASS, OUT_OF_SCOPE, CANDIDATE)}


def marker(name: str) -> Marker:
    return _MARKERS[name]


def current_node() -> TreeNode | None:
    """The node on top of this thread's call stack (the parent of a module first seen now)."""
    stack = tls.stack
    return stack[-1] if stack else None
