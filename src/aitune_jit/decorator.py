"""Decorator mode: only modules constructed inside the decorated function (or the `with` block) are tuned.

    @patch_for_jit_tuning
    def create_model():
        return MyModel().eval()

    with prepare_for_jit_tuning():
        model = MyModel().eval()

The `Module.__call__` patch is installed on first use and stays (the model is called after the factory
returns); modules built elsewhere go straight to the original `__call__` after one lookup.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from aitune_core.log import install_stderr_warnings, quiet_progress
from aitune_jit import hook

F = TypeVar("F", bound=Callable[..., Any])


class prepare_for_jit_tuning(contextlib.ContextDecorator):
    """Context manager (and decorator): modules this thread constructs inside it become JIT candidates.
    aitune's WARNINGs go to stderr unless the application configured logging (`install_stderr_warnings`); its
    INFO lines stay out of the program's own logging unless asked for (`quiet_progress`)."""

    def __enter__(self) -> prepare_for_jit_tuning:
        install_stderr_warnings()
        quiet_progress()
        hook.open_scope()
        return self

    def __exit__(self, *exc_info: object) -> None:
        hook.close_scope()


def patch_for_jit_tuning(fn: F) -> F:
    """Decorator: modules constructed while `fn` runs become JIT candidates; nothing else is tuned.

    For a generator function or an `async def`, "while `fn` runs" is until the generator is exhausted or the
    coroutine returns (the scope of a plain wrapper closed when the generator or coroutine object was returned,
    before its body built anything, and nothing was tuned); what this thread builds while the generator is
    suspended between its items is in scope too."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def coroutine(*args: Any, **kwargs: Any) -> Any:
            with prepare_for_jit_tuning():
                return await fn(*args, **kwargs)

        return coroutine  # type: ignore[return-value]
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator(*args: Any, **kwargs: Any) -> Any:
            with prepare_for_jit_tuning():
                return (yield from fn(*args, **kwargs))

        return generator  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with prepare_for_jit_tuning():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
