"""The calling thread's `torch.autocast` state, as part of what a graph is.

A call made inside `with torch.autocast("cuda", dtype=torch.bfloat16):` computes something else than the same call
outside it: other dtypes, other kernels, other values. So the autocast state the program called a module under
belongs to the call's graph (`GraphSpec.autocast`), like its tensors' dtypes:

- calls with and without autocast (or under two autocast dtypes) are recorded as separate graphs, each with its
  own samples and outputs; before, they shared one graph and its outputs looked data-dependent;
- tuning replays a graph's samples under the state they were recorded under (`autocast_as`). Autocast is
  thread-local: the background worker's thread has none, so a graph recorded under autocast was built and
  validated without it, and every candidate failed on the output dtype;
- a tuned graph serves only calls made under its state; any other call runs the original module.

The state is a tuple of `(device type, dtype name)` for each device type whose autocast is enabled, `()` for
none. Reading it costs one call into torch when autocast is off (the common case).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

AutocastState = tuple[tuple[str, str], ...]

NO_AUTOCAST: AutocastState = ()

# device types whose autocast state is read; a type this torch does not know is left out (see `_known`)
_CANDIDATE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu")
# dtypes an autocast region may compute in (what `torch.autocast` accepts on some device)
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _known(device_types: Sequence[str]) -> tuple[str, ...]:
    known = []
    for device_type in device_types:
        try:
            torch.is_autocast_enabled(device_type)
            torch.get_autocast_dtype(device_type)
        except (RuntimeError, TypeError, ValueError):
            continue
        known.append(device_type)
    return tuple(known)


_DEVICE_TYPES = _known(_CANDIDATE_TYPES)


def _any_enabled_by_type() -> bool:
    return any(torch.is_autocast_enabled(device_type) for device_type in _DEVICE_TYPES)


#: `any_autocast()`: whether autocast is on for any device type on this thread (one call into torch where it can)
any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or _any_enabled_by_type


def current_autocast() -> AutocastState:
    """The calling thread's autocast state: `(device type, dtype name)` per enabled device type, or `()`."""
    if not any_autocast():
        return NO_AUTOCAST
    return tuple(
        (device_type, str(torch.get_autocast_dtype(device_type)).removeprefix("torch."))
        for device_type in _DEVICE_TYPES
        if torch.is_autocast_enabled(device_type)
    )


@contextlib.contextmanager
def autocast_as(state: AutocastState) -> Iterator[None]:
    """Run the body under exactly `state` on this thread: enable what `state` enables (with its dtype), disable
    what is enabled now and `state` does not name, leave the rest alone. A no-op when the thread is already there
    (a blocking tune on the program's own thread, a graph recorded without autocast on the worker)."""
    now = current_autocast()
    if now == state:
        yield
        return
    wanted = dict(state)
    with contextlib.ExitStack() as stack:
        for device_type, _dtype in now:
            if device_type not in wanted:
                stack.enter_context(torch.autocast(device_type, enabled=False))
        for device_type, dtype in state:
            if (device_type, dtype) not in now:
                stack.enter_context(torch.autocast(device_type, dtype=_DTYPES[dtype]))
        yield


def autocast_dtypes(state: AutocastState) -> list[torch.dtype]:
    """The dtypes `state` computes in (for tolerances)."""
    return [_DTYPES[dtype] for _device_type, dtype in state]


def describe_autocast(state: AutocastState) -> str:
    """`"no autocast"` or `"autocast cuda bfloat16"` (several: joined by ", "), for messages."""
    if not state:
        return "no autocast"
    return ", ".join(f"autocast {device_type} {dtype}" for device_type, dtype in state)


def autocast_to_json(state: AutocastState) -> list[list[str]]:
    return [[device_type, dtype] for device_type, dtype in state]


def autocast_from_json(data: Any) -> AutocastState:
    """The state a file holds, checked: a list of `[device type, dtype name]` pairs with a device type this torch
    knows and an autocast dtype. Raises ValueError otherwise (an edited or foreign file)."""
    if data is None:
        return NO_AUTOCAST
    if not isinstance(data, (list, tuple)):
        raise ValueError(f"autocast state must be a list of [device type, dtype] pairs, got {type(data).__name__}")
    state = []
    for item in data:
        if (
            not isinstance(item, (list, tuple))
            or len(item) != 2
            or item[0] not in _DEVICE_TYPES
            or item[1] not in _DTYPES
        ):
            raise ValueError(
                f"autocast state entry {item!r} is not [device type, dtype] with a device type in "
                f"{list(_DEVICE_TYPES)} and a dtype in {sorted(_DTYPES)}"
            )
        state.append((str(item[0]), str(item[1])))
    if len({device_type for device_type, _ in state}) != len(state):
        raise ValueError(f"autocast state names a device type twice: {data!r}")
    return tuple(sorted(state, key=lambda pair: _DEVICE_TYPES.index(pair[0])))
