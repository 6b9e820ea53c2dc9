"""`ImportPatches`: attributes replaced in named modules as each is imported, put back on `uninstall`.

Why: some of torch's modules must look different to aitune's tuning jobs (`aitune_jit.job_draws`: the random
draws of the compiler's benchmarks; `aitune_jit.job_module_hooks`: the global module hooks of FLOP counting), but
importing them to patch them costs: on an image without bytecode the job's import of Inductor's modules held the
interpreter while requests waited. So each module is patched when something imports it (wrapt's post-import
hook), or at once where it already is, and only between `install()` and `uninstall()`. Each replacement is a
`Patch` record: `uninstall` puts back only what nobody replaced since.

`ImportPatches(modules, replacements)`: `modules()` names the modules (a callable, read at each `install`);
`replacements(module)` says what to replace in one module now, `{attribute: new value}` (empty: nothing, such as
when another tool replaced the attribute first).
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

import wrapt

from aitune_core.patch import Patch


class ImportPatches:
    """Replacements made in modules as they are imported (module docstring)."""

    def __init__(self, modules: Callable[[], Iterable[str]],
                 replacements: Callable[[types.ModuleType], dict[str, Any]]) -> None:
        self._modules = modules
        self._replacements = replacements
        self._lock = threading.Lock()
        self._patches: dict[tuple[str, str], Patch] = {}
        self._hooked: set[str] = set()  # (modules with a post-import hook: wrapt keeps it for the process)
        self._active = False

    def install(self) -> None:
        """Patch each module now where it is imported, else when it is (idempotent; imports nothing)."""
        names = tuple(self._modules())
        with self._lock:
            self._active = True
            new = [name for name in names if name not in self._hooked]
            self._hooked.update(new)
        for name in new:
            wrapt.register_post_import_hook(self._patch, name)  # (called at once for a module already imported)
        for name in names:
            module = sys.modules.get(name)
            if module is not None:
                self._patch(module)

    def _patch(self, module: types.ModuleType) -> None:
        with self._lock:
            if not self._active:
                return
            for attribute, value in self._replacements(module).items():
                key = (module.__name__, attribute)
                if key not in self._patches:
                    self._patches[key] = Patch(module, attribute, value).apply()

    def uninstall(self) -> None:
        """Put back every replaced attribute (each only if nobody replaced it since: `Patch.restore`)."""
        with self._lock:
            self._active = False
            while self._patches:
                self._patches.popitem()[1].restore()

    def patched(self) -> list[tuple[str, str]]:
        """(module, attribute) of every replacement in place now."""
        with self._lock:
            return sorted(self._patches)
