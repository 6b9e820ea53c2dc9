"""The global context: values the tuning driver publishes to every recording module, mainly the batch size.

The AOT driver runs each sample as

    with global_context:
        global_context.set(BATCH_SIZE_KEY, batch_size)
        model(*args, **kwargs)

and every wrapped module that records the call reads `current_batch_size()` to correlate shape changes
with batch size changes. The values live in a `contextvars.ContextVar`, so a value set in one thread (or
asyncio task) is never seen by another, and leaving the `with` block restores what was there before.
Blocks nest; `set` outside any block changes the current context only.
"""

from __future__ import annotations

from contextvars import ContextVar
from types import TracebackType
from typing import Any

BATCH_SIZE_KEY = "batch_size"

_values: ContextVar[dict[str, Any] | None] = ContextVar("aitune_global_context", default=None)
_saved: ContextVar[tuple[dict[str, Any] | None, ...]] = ContextVar("aitune_global_context_stack", default=())


class GlobalContext:
    """Context-local key/value store; use the `global_context` singleton."""

    def __enter__(self) -> GlobalContext:
        current = _values.get()
        _saved.set((*_saved.get(), current))
        _values.set(dict(current) if current else {})
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack = _saved.get()
        if not stack:  # unbalanced exit; nothing to restore
            _values.set(None)
            return
        _values.set(stack[-1])
        _saved.set(stack[:-1])

    def set(self, key: str, value: Any) -> None:
        current = _values.get()
        updated = dict(current) if current else {}
        updated[key] = value
        _values.set(updated)

    def get(self, key: str, default: Any = None) -> Any:
        current = _values.get()
        if not current:
            return default
        return current.get(key, default)

    def clear(self) -> None:
        """Forget every value in the current context (the enclosing blocks are untouched)."""
        _values.set({})


global_context = GlobalContext()


def current_batch_size() -> int | None:
    """The batch size the driver published for the running call, or None (e.g. in JIT mode)."""
    value = _values.get()
    if not value:
        return None
    batch = value.get(BATCH_SIZE_KEY)
    return batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else None
