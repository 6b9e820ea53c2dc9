"""The state of a random-number generator object, as a value that compares equal exactly when the state is the
same.

Why: tuning replays recorded calls of the program's module, so a forward that draws random numbers is not
replayed (`module_effects`). The default streams were watched (torch's CPU and CUDA default generators, Python's
`random` module), but not a generator the program keeps itself: a `torch.Generator` on the module or in a global,
a `random.Random` or numpy `Generator` / `RandomState` attribute, numpy's global `np.random` stream. A forward
that drew from one of them was replayed by tuning (eager timings, the graph-break check, a compile's warm-up), and
every draw after that gave other numbers than in the plain run: a helper's scripts on this project's CPU answered
differently from the third call on (relative error 0.5 to 5) and changed the program's own later `np.random`
values. A fingerprint of such an object is now its state (`value_fingerprint.fingerprint`).

`rng_state(value)`: the state of a `torch.Generator` (its `get_state()` bytes), a `random.Random` (`getstate()`),
a numpy `Generator` (its bit generator's `state`) or `RandomState` (`get_state()`), numpy arrays inside made bytes;
None for anything else. `numpy_global_state()`: numpy's global stream, where numpy is imported (never imports it).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch


def _plain(value: Any) -> Any:
    """`value` with numpy arrays turned into bytes (an array's `==` is elementwise, not a yes or no)."""
    if isinstance(value, dict):
        return tuple((key, _plain(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_plain(item) for item in value)
    tobytes = getattr(value, "tobytes", None)
    if callable(tobytes) and type(value).__module__.startswith("numpy"):
        return (str(getattr(value, "dtype", "")), tobytes())
    return value


def rng_state(value: Any) -> Any | None:
    """The state of a random-number generator object (module docstring), or None for any other value."""
    if isinstance(value, torch.Generator):
        return bytes(value.get_state().numpy())
    if isinstance(value, random.Random):
        return value.getstate()
    module = type(value).__module__
    if not module.startswith("numpy.random"):
        return None
    try:
        bit_generator = getattr(value, "bit_generator", None)
        if bit_generator is not None:
            return _plain(bit_generator.state)
        get_state = getattr(value, "get_state", None)
        return _plain(get_state()) if callable(get_state) else None
    except Exception:  # (an object of that package that is no generator after all)
        return None


def numpy_global_state() -> Any | None:
    """The state of numpy's global stream (`np.random.rand` and friends), or None where numpy is not imported."""
    numpy = sys.modules.get("numpy")
    numpy_random = getattr(numpy, "random", None) if numpy is not None else None
    get_state = getattr(numpy_random, "get_state", None)
    if not callable(get_state):
        return None
    try:
        return _plain(get_state())
    except Exception:
        return None
