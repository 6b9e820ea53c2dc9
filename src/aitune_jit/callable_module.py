"""`make_callable(module_name, function)`: a module that can be called as the function of the same name.

Why: `import aitune.torch.jit.enable` (the one-line way in) makes Python set the package's attribute `enable` to
that submodule, in place of the function `aitune.torch.jit.enable` exported beside it; a script that then called
`aitune.torch.jit.enable()` (or `disable()`) got `TypeError: 'module' object is not callable` (seventh review,
2026-11-26). Giving the submodule a `__call__` that runs the function keeps both spellings working.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any


def make_callable(module_name: str, function: Callable[..., Any]) -> None:
    """Let the module `module_name` be called as `function` (its docstring and name stay the module's)."""

    class CallableModule(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

    CallableModule.__qualname__ = CallableModule.__name__ = f"CallableModule[{function.__name__}]"
    sys.modules[module_name].__class__ = CallableModule
