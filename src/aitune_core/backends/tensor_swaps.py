"""`torch.utils.swap_tensors` works on the tensors aitune watches.

Why: `swap_tensors(t1, t2)` exchanges two tensors' contents behind their Python objects and refuses a tensor that
has a weak reference ("Cannot swap t1 because it has weakref associated with it"). `module_watch` keeps weak
references to every parameter and buffer of a tuned module (a snapshot must not keep replaced weights alive), so
with aitune on, `model.double()` under `torch.__future__.set_swap_module_params_on_conversion(True)` (how
`nn.Module._apply` converts tensor subclasses such as DTensor, and all tensors with that flag) and a direct
`swap_tensors` on a weight raised into the program, which ran plainly (a helper's scripts on this CPU,
2026-11-27).

How: while installed, `torch.utils.swap_tensors` first asks aitune's holders to let go of the two tensors (`forget`,
given by `module_watch`: each snapshot holding one replaces its reference by a dead one, so it compares as
changed - a swapped tensor is another tensor behind the same object, and the tuned module re-checks); if weak
references remain, it takes the tensors out of torch's weak-identity memos (a fake-tensor converter that a
compiled graph keeps records the real tensors it described, keyed by weak reference; found from the reference, not
by a heap scan) and, at most once a second, collects garbage (a memo that is garbage already), then swaps. Other
weak references are left, and the swap raises as it would plainly. A program's own `WeakIdKeyDictionary` keyed by a
swapped tensor loses that entry (plainly the swap would have raised).
"""

from __future__ import annotations

import functools
import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary, WeakIdRef

from aitune_core.patch import Patch

_lock = threading.Lock()
_patch: Patch | None = None
_forget: Callable[..., None] | None = None


def _letting_go(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def swap_tensors(t1: Any, t2: Any) -> Any:
        forget = _forget
        if forget is not None and (_has_weakrefs(t1) or _has_weakrefs(t2)):
            forget(t1, t2)
            for tensor in (t1, t2):
                _drop_memo_entries(tensor)
            if (_has_weakrefs(t1) or _has_weakrefs(t2)) and _collection_due():
                gc.collect()  # (a compile's fake-tensor memo that is garbage already: at most once a second)
        return original(t1, t2)

    return swap_tensors


def _drop_memo_entries(tensor: Any) -> None:
    """Take `tensor` out of torch's weak-identity memos (`torch.utils.weak.WeakIdKeyDictionary`: a fake-tensor
    converter's record of the real tensors it described, kept alive by a compiled graph): an entry dropped is
    described anew if that converter meets the tensor again. The dictionary is found from the reference itself
    (its removal callback keeps a weak reference to it), not by a scan of the heap."""
    for ref in weakref.getweakrefs(tensor) if _has_weakrefs(tensor) else ():
        if not isinstance(ref, WeakIdRef):
            continue
        defaults = getattr(ref.__callback__, "__defaults__", None) or ()
        owner = defaults[0]() if defaults and isinstance(defaults[0], weakref.ref) else None
        if isinstance(owner, WeakIdKeyDictionary):
            owner.data.pop(ref, None)


_last_collection = [0.0]


def _collection_due() -> bool:
    now = time.monotonic()
    if now - _last_collection[0] < 1.0:
        return False
    _last_collection[0] = now
    return True


def _has_weakrefs(value: Any) -> bool:
    try:
        return weakref.getweakrefcount(value) > 0
    except TypeError:
        return False


def install(forget: Callable[..., None]) -> None:
    """Let `forget(t1, t2)` release aitune's references before each swap (idempotent; the first `forget` stays)."""
    global _patch, _forget
    with _lock:
        if _patch is not None:
            return
        _forget = forget
        _patch = Patch(torch.utils, "swap_tensors", _letting_go(torch.utils.swap_tensors)).apply()


def uninstall() -> None:
    """Put torch's function back (for tests)."""
    global _patch, _forget
    with _lock:
        if _patch is not None:
            _patch.restore()
        _patch, _forget = None, None


def installed() -> bool:
    return _patch is not None
