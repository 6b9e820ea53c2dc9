"""`Patch`: one attribute of one object replaced by aitune, and how to put it back.

Why: aitune replaces a few attributes of torch for as long as it is active - `torch.nn.Module.__call__` (the JIT
hook), `torch.nn.Module.__init__` (decorator scopes), hook registration and structure methods (the change check of
tuned modules). Each replacement must come off exactly: the very object that was there before, found where it was
(the class's own `__dict__`, so a `classmethod` or a function inherited from a base class is not turned into
something else), and only if nobody replaced it again in the meantime - restoring then would silently remove the
other party's patch. One small record does that for every patch, in the spirit of wrapt's
`resolve_path` / `apply_patch`.
"""

from __future__ import annotations

import logging
from typing import Any

_logger = logging.getLogger("aitune.patch")
_MISSING: Any = object()


class Patch:
    """`parent.name` replaced by `replacement` while applied.

    `apply()` remembers what `parent.__dict__` held (or that it held nothing: the attribute came from a base class)
    and sets the replacement; `restore()` puts that back if `parent.name` is still the replacement, and otherwise
    leaves the newer value in place and returns False (the caller says what that means). Both are idempotent.
    """

    __slots__ = ("applied", "name", "original", "parent", "replacement")

    def __init__(self, parent: Any, name: str, replacement: Any) -> None:
        self.parent = parent
        self.name = name
        self.replacement = replacement
        self.original: Any = _MISSING
        self.applied = False

    @property
    def current(self) -> Any:
        """What `parent.name` resolves to now."""
        return getattr(self.parent, self.name)

    def found(self) -> Any:
        """The value the patch replaces (or replaced): the parent's own attribute when it has one, else the
        inherited one."""
        if self.applied and self.original is not _MISSING:
            return self.original
        return getattr(self.parent, "__dict__", {}).get(self.name, getattr(self.parent, self.name, None))

    def apply(self) -> Patch:
        if not self.applied:
            self.original = getattr(self.parent, "__dict__", {}).get(self.name, _MISSING)
            setattr(self.parent, self.name, self.replacement)
            self.applied = True
        return self

    def restore(self) -> bool:
        """Put the original back; False (and nothing changed) when someone replaced the attribute after us."""
        if not self.applied:
            return True
        own = getattr(self.parent, "__dict__", {}).get(self.name, _MISSING)
        if own is not self.replacement:
            _logger.debug("%r: replaced again after it was applied; the newer value stays", self)
            self.applied = False
            return False
        if self.original is _MISSING:
            delattr(self.parent, self.name)
        else:
            setattr(self.parent, self.name, self.original)
        self.applied = False
        self.original = _MISSING
        return True

    def __repr__(self) -> str:
        state = "applied" if self.applied else "not applied"
        return f"<Patch {getattr(self.parent, '__name__', self.parent)!s}.{self.name} ({state})>"
