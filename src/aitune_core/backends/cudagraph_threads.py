"""Inductor's CUDA-graph trees usable from every thread, not only from the one that first imported them.

Why: `torch._inductor.cudagraph_trees` keeps its tree managers in thread-local storage, set up once, when the
module is imported, for the importing thread only. On torch 2.11 (the GPU image here) its `get_obj` asserts
that the storage exists: any other thread that compiles with CUDA graphs - or recompiles a graph it calls for a
new shape - fails with a bare `AssertionError` (checked on an H200: the importing thread gets a tree manager, a
second thread's `get_container(0)` raises). aitune compiles in a new thread per background job, so the second
job of a process, the program's own `torch.compile(mode="reduce-overhead")` after a job imported the module, and
the serving thread's recompiles of a tuned graph all failed that way (a `reduce-overhead` candidate "failed to
build: AssertionError:" in the re-tune of ResNet-50's batch range on an H100). Newer torch sets the storage up
for a thread that lacks it (`_initialize_tls`), which is what `install()` makes the module's `get_obj` do on any
torch: each thread gets tree managers of its own, as the importing thread always had.

`install()` imports nothing: the module is patched when it is imported (wrapt's post-import hook), or at once
where it already is; the patch stays for the process (a thread that has its tree managers keeps them).
"""

from __future__ import annotations

import collections
import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import torch

from aitune_core.import_patches import ImportPatches

MODULE = "torch._inductor.cudagraph_trees"
#: the thread-local attributes the module's `get_obj` reads (tree managers and their locks, per device)
ATTRIBUTES = ("tree_manager_containers", "tree_manager_locks")



def _set_up_thread(module: types.ModuleType, local: threading.local) -> None:
    """What the module does for its importing thread, for this one (its own `_initialize_tls` where it has one)."""
    initialize = getattr(module, "_initialize_tls", None)
    if initialize is not None:
        initialize(local)
        return
    local.tree_manager_containers = {}
    local.tree_manager_locks = collections.defaultdict(threading.Lock)
    torch._C._stash_obj_in_tls("tree_manager_containers", local.tree_manager_containers)
    torch._C._stash_obj_in_tls("tree_manager_locks", local.tree_manager_locks)


def _any_thread(module: types.ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_obj(local: Any, attr_name: str) -> Any:
        if (attr_name in ATTRIBUTES and not hasattr(local, attr_name)
                and not torch._C._is_key_in_tls(attr_name)):
            _set_up_thread(module, local)
        return original(local, attr_name)

    get_obj.aitune_any_thread = True  # type: ignore[attr-defined]
    return get_obj


def _replacements(module: types.ModuleType) -> dict[str, Any]:
    """`get_obj` by its any-thread version, where the module keeps thread-local tree managers the old way."""
    original = getattr(module, "get_obj", None)
    if original is None or getattr(original, "aitune_any_thread", False):
        return {}
    if not hasattr(module, "local") or not hasattr(torch._C, "_is_key_in_tls"):
        return {}  # (a torch whose trees keep their state otherwise: nothing to set up)
    return {"get_obj": _any_thread(module, original)}


_patches = ImportPatches(lambda: (MODULE,), _replacements)


def install() -> None:
    """Patch the module now if it is imported, else when it is (idempotent; imports nothing)."""
    _patches.install()


def installed() -> bool:
    return bool(_patches.patched())


def uninstall() -> None:
    """Put the module's own `get_obj` back (for tests; threads set up meanwhile keep their tree managers)."""
    _patches.uninstall()
