"""`isolated_entry`: a function that calls `target` under a code object no other function has.

Dynamo keeps its compiled entries on the code object of the outermost compiled frame. `torch.compile(module)`
compiles `type(module).forward`, whose code object every instance of the class shares, and every other
`torch.compile` of any instance with equal settings (Inductor's wrappers compare equal by configuration) looks
its calls up in the same entries. Such a lookup can hit an entry compiled for another instance: parameters are
graph inputs, so the guards pass and the other compile's graph runs. With CUDA graphs that graph's weights are
static inputs recorded at the other instance's addresses, and every switch between the two instances
re-records the graph ("static input data pointer changed"), which makes every call slow and can fail outright
(on torch 2.11 a re-record at another batch size raised "length mismatch between inputs, recorded_data_ptr,
and placeholders"). A user's own `torch.compile` of the same class, a second tuned instance, or several
candidate backends of one tuning run would all share that way.

Compiling `isolated_entry(module)` instead makes the entry's own frame the outermost one: the module's forward
is inlined into it, the compiled entries and CUDA-graph functions belong to this entry alone, its recompiles
count against its own limit, and they are garbage with it. Compiled code is still reused across processes and
entries through Inductor's FX graph cache, which keys on the graph, not on the code object.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import torch

_runs = threading.local()


def eager_runs() -> int:
    """How many times an isolated entry's body ran as plain Python on this thread (module docstring)."""
    return getattr(_runs, "count", 0)


def _count_eager_run() -> None:
    _runs.count = getattr(_runs, "count", 0) + 1


#: `runner(target, args, kwargs)`: runs an entry's body when it runs as plain Python (its compiled code's guards
#: failed); the caller that serves the entry sets it for its call (`plain_runner`), e.g. to record that call
PlainRunner = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


def set_plain_runner(runner: PlainRunner | None) -> PlainRunner | None:
    """Make `runner` run this thread's isolated entries' plain bodies until it is set again; returns the one before.
    Why: a call that misses the compiled code ran with inputs the compile never saw (an input layout); a runner
    that records it lets a later compile see them."""
    before = getattr(_runs, "runner", None)
    _runs.runner = runner
    return before


def _plain(target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _count_eager_run()
    runner = getattr(_runs, "runner", None)
    if runner is None:
        return target(*args, **kwargs)
    _runs.runner = None  # (once: the call's own nested entries run plainly)
    try:
        return runner(target, args, kwargs)
    finally:
        _runs.runner = runner


def isolated_entry(target: Callable[..., Any], name: str = "aitune_entry") -> Callable[..., Any]:
    """`entry(*args, **kwargs) == target(*args, **kwargs)`, with a code object of its own (see the module doc)."""

    def entry(*args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_dynamo_compiling():
            return _plain(target, args, kwargs)
        return target(*args, **kwargs)

    code = entry.__code__.replace(co_name=name)  # replace() always builds a new code object
    isolated = types.FunctionType(code, entry.__globals__, name, None, entry.__closure__)
    isolated.__wrapped__ = target  # type: ignore[attr-defined]
    return isolated
