"""`unavailable(device)`: why a device cannot be used on this machine, or None.

Why one function: configuration (`jit_config.device`) and checkpoint loading (`load(..., device=...)`) must refuse
the same things - a device type this torch build or machine does not have, an index past the device count - with
their own error types and wording.
"""

from __future__ import annotations

import torch

#: device types that need no accelerator
ALWAYS_AVAILABLE = ("cpu", "meta")


def unavailable(device: torch.device) -> str | None:
    """None when `device` can be used here, else the reason ("no cuda device is available on this machine",
    "this machine has 1 cuda device(s) (indices 0..0)")."""
    if device.type in ALWAYS_AVAILABLE:
        return None
    module = getattr(torch, device.type, None)
    is_available = getattr(module, "is_available", None)
    if is_available is None or not is_available():
        return f"no {device.type} device is available on this machine"
    count = getattr(module, "device_count", lambda: 1)()
    if device.index is not None and device.index >= count:
        return f"this machine has {count} {device.type} device(s) (indices 0..{count - 1})"
    return None
