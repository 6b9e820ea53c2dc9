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
references remain, it collects garbage once and takes the tensors out of torch's weak-identity memos (a fake-tensor
converter that a compiled graph keeps records the real tensors it described, keyed by weak reference), then
swaps. Other weak references are left, and the swap raises as it would plainly.
"""

from __future__ import annotations

import functools
import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.weak import WeakIdRef

from aitune_core.patch import Patch

_ABSENT = object()

_lock = threading.Lock()
_patch: Patch | None = None
_forget: Callable[..., None] | None = None


def _letting_go(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def swap_tensors(t1: Any, t2: Any) -> Any:
        forget = _forget
        if forget is not None and (_has_weakrefs(t1) or _has_weakrefs(t2)):
            forget(t1, t2)
            if _has_weakrefs(t1) or _has_weakrefs(t2):
                gc.collect()  # (a compile's fake-tensor memo, garbage not collected yet, holds weak keys too)
            for tensor in (t1, t2):
                _drop_memo_entries(tensor)
        return original(t1, t2)

    return swap_tensors


def _drop_memo_entries(tensor: Any) -> None:
    """Take `tensor` out of torch's weak-identity memos (`torch.utils.weak.WeakIdKeyDictionary`: a fake-tensor
    converter's record of the real tensors it described, kept alive by a compiled graph): an entry dropped is
    described anew if that converter meets the tensor again."""
    for ref in weakref.getweakrefs(tensor) if _has_weakrefs(tensor) else ():
        if not isinstance(ref, WeakIdRef):
            continue
        for holder in gc.get_referrers(ref):
            if isinstance(holder, dict) and holder.get(ref, _ABSENT) is not _ABSENT:
                holder.pop(ref, None)


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
