"""The calling thread's default device (`torch.set_default_device`, `with torch.device(...)`), as part of a graph.

A forward that creates tensors without naming a device (`torch.arange(n)`, `torch.zeros(...)`: hand-written
position ids, masks, caches) puts them on the default device. Like autocast, the default device is per thread:
a program that calls `torch.set_default_device("cuda")` and then its model has it on its own thread only, so the
background worker's replays made those tensors on the CPU, next to the program's CUDA inputs, and every candidate
failed. The default device a call was made under is therefore part of its graph (`GraphSpec.default_device`):
replays run under it (`default_device_as`), and a tuned graph serves only calls made under it.

`None` stands for the CPU default (no device context on the thread). Reading it costs one call into torch when no
torch function mode is active (the common case).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

#: device types a stored graph may name (anything else in a file is refused)
_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu", "meta")


#: `function_modes()`: how many torch function modes this thread has (a device context is one); 0 means none
function_modes = torch._C._len_torch_function_stack


def current_default_device() -> str | None:
    """The calling thread's default device as a string (`"cuda:0"`), or None for the CPU."""
    if not function_modes():
        return None
    device = torch.get_default_device()
    return None if device.type == "cpu" else str(device)


@contextlib.contextmanager
def default_device_as(device: str | None) -> Iterator[None]:
    """Run the body with `device` as this thread's default device (None: the CPU); a no-op when it already is."""
    if current_default_device() == device:
        yield
        return
    with torch.device(device if device is not None else "cpu"):
        yield


def default_device_from_json(data: Any) -> str | None:
    """The default device a file names, checked: None or a device string of a known type. Raises ValueError."""
    if data is None:
        return None
    if not isinstance(data, str):
        raise ValueError(f"default device must be a device string, got {type(data).__name__}")
    try:
        device = torch.device(data)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"default device {data!r} is not a device ({exc})") from exc
    if device.type not in _DEVICE_TYPES:
        raise ValueError(f"default device {data!r} is not one of the device types {list(_DEVICE_TYPES)}")
    return str(device)
