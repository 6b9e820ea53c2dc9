"""Bind a call's `(args, kwargs)` to a forward signature, so the way arguments are passed does not matter.

`Binder.bind(args, kwargs)` returns an ordered dict `{parameter name: value}`:

- named parameters in signature order, whether passed positionally or by keyword;
- the extra positional arguments of a `*args` parameter as one tuple under that parameter's name
  (so they are named `args_0`, `args_1`, ...); omitted when empty;
- keyword-only parameters in signature order;
- the extra keywords of a `**kwargs` parameter at the top level, sorted by name, so
  `m(x, a=1, b=2)` and `m(x, b=2, a=1)` bind the same.

Defaults are not applied: an argument the caller left out is absent. So `m(x)` and `m(x, mask=None)`
are different sets of arguments (different graphs): a graph is identified by the arguments actually passed.

A callable whose signature cannot be read (some builtins) gets the generic binder `(*args, **kwargs)`.
A call that does not fit the signature raises `TypeError`, as calling the function would.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class Binder:
    """A forward signature reduced to what binding needs (names and kinds); JSON-serializable."""

    positional: tuple[str, ...] = ()  # positional-only then positional-or-keyword, in order
    positional_only: int = 0  # how many of `positional` are positional-only
    var_positional: str | None = "args"
    keyword_only: tuple[str, ...] = ()
    var_keyword: str | None = "kwargs"
    _index: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)
    _kwonly: frozenset[str] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {name: i for i, name in enumerate(self.positional)})
        object.__setattr__(self, "_kwonly", frozenset(self.keyword_only))

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def generic(cls) -> Binder:
        """The binder of `(*args, **kwargs)`: positional arguments become `args_0`, `args_1`, ..."""
        return cls()

    @classmethod
    def from_callable(cls, fn: Callable[..., Any]) -> Binder:
        """Binder for a module (its `forward`) or any callable; the generic binder when no signature is readable."""
        if isinstance(fn, torch.nn.Module):
            fn = fn.forward
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            return cls.generic()
        return cls.from_signature(signature)

    @classmethod
    def from_signature(cls, signature: inspect.Signature) -> Binder:
        positional: list[str] = []
        positional_only = 0
        var_positional = var_keyword = None
        keyword_only: list[str] = []
        for p in signature.parameters.values():
            if p.kind is inspect.Parameter.POSITIONAL_ONLY:
                positional.append(p.name)
                positional_only += 1
            elif p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
                positional.append(p.name)
            elif p.kind is inspect.Parameter.VAR_POSITIONAL:
                var_positional = p.name
            elif p.kind is inspect.Parameter.KEYWORD_ONLY:
                keyword_only.append(p.name)
            else:
                var_keyword = p.name
        return cls(tuple(positional), positional_only, var_positional, tuple(keyword_only), var_keyword)

    # -- binding --------------------------------------------------------------------------------
    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """`{name: value}` in canonical order (see the module docstring). Raises TypeError on a bad call."""
        npos = len(self.positional)
        if len(args) > npos and self.var_positional is None:
            raise TypeError(f"takes {npos} positional arguments but {len(args)} were given")
        named: dict[str, Any] = dict(zip(self.positional, args))
        extras: dict[str, Any] | None = None
        for key, value in kwargs.items():
            index = self._index.get(key)
            if index is not None and index >= self.positional_only:
                if key in named:
                    raise TypeError(f"got multiple values for argument {key!r}")
                named[key] = value
            elif key in self._kwonly:
                named[key] = value
            elif self.var_keyword is not None:
                if extras is None:
                    extras = {}
                extras[key] = value
            else:
                raise TypeError(f"got an unexpected keyword argument {key!r}")

        if not kwargs and len(args) <= npos:  # fast path: positional call, nothing to reorder
            return named
        bound: dict[str, Any] = {name: named[name] for name in self.positional if name in named}
        if len(args) > npos:
            bound[self.var_positional] = tuple(args[npos:])  # type: ignore[index]
        for name in self.keyword_only:
            if name in named:
                bound[name] = named[name]
        if extras:
            for key in sorted(extras):
                if key in bound:
                    raise TypeError(f"keyword argument {key!r} collides with parameter {key!r} of the signature")
                bound[key] = extras[key]
        return bound

    def unbind(self, bound: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Back from `bind`'s dict to `(args, kwargs)` that call the function the same way."""
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        gap = False
        for index, name in enumerate(self.positional):
            if name not in bound:
                gap = True
            elif not gap or index < self.positional_only:
                args.append(bound[name])
            else:
                kwargs[name] = bound[name]
        known = set(self.positional)
        if self.var_positional is not None and self.var_positional in bound:
            args.extend(bound[self.var_positional])
            known.add(self.var_positional)
        for key, value in bound.items():
            if key not in known:
                kwargs[key] = value
        return tuple(args), kwargs

    # -- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "positional": list(self.positional),
            "positional_only": self.positional_only,
            "var_positional": self.var_positional,
            "keyword_only": list(self.keyword_only),
            "var_keyword": self.var_keyword,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Binder:
        return cls(
            tuple(data.get("positional", ())),
            int(data.get("positional_only", 0)),
            data.get("var_positional"),
            tuple(data.get("keyword_only", ())),
            data.get("var_keyword"),
        )


def bind_arguments(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """One-off convenience: `Binder.from_callable(fn).bind(args, kwargs)`."""
    return Binder.from_callable(fn).bind(args, kwargs)
