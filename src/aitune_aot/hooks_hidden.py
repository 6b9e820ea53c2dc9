"""`hooks_hidden(module)`: a block run with the module's forward (pre-)hooks set aside.

Why: the AOT wrapper hands its module to strategies and backends (compiles, validation runs) and routes calls
through its dispatcher; the user's hooks must fire once per user call, around the wrapper - never inside a
probe, a compile or a second time inside the routing. Hooks added while the block runs are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")


@contextmanager
def hooks_hidden(module: torch.nn.Module) -> Iterator[None]:
    """Run a block with the module's forward (pre-)hooks temporarily removed; hooks added meanwhile are kept."""
    state = module.__dict__
    saved = [state[name] for name in _HOOK_DICTS]
    if not any(saved):
        yield
        return
    for name in _HOOK_DICTS:
        state[name] = OrderedDict()
    try:
        yield
    finally:
        for name, hooks in zip(_HOOK_DICTS, saved):
            added = state[name]
            hooks.update(added)
            state[name] = hooks
