"""`CompileRegions`: identical sibling blocks traced once when Inductor compiles a whole model.

Why: compiling a model whole lets Inductor fuse across its blocks and capture one CUDA graph, but dynamo traces
and Inductor lowers every block again - the 24 decoder layers of a transformer are 24 copies of the same work.
Measured on this repository's 2-core CPU (a tiny LlamaModel, torch 2.13): the whole-model compile took 31-41 s for
24 layers against 16 s for one; with the layer class marked as a nested compile region, 16-19 s, outputs within
2e-6 of eager. torch's `torch.compiler.nested_compile_region` does this for code that opts in; a tuner that sees
the module tree can opt in for the model, without changing its code:

- `repeated_groups(module)`: direct children of one parent that share class, parameter and buffer names, shapes
  and dtypes, `MIN_REPEATS` or more of them (the layers of a ModuleList; the identical bottlenecks of a ResNet
  stage); only blocks with submodules of their own (a single layer is one kernel).
- `CompileRegions.install(module)` marks the `forward` of those blocks' classes as a nested compile region - on
  the class, the way torch documents it: marking single instances (a region function called with the module as an
  argument) made torch 2.13 reuse the first block's weights for its siblings in a small test, a wrong answer,
  where the class-level mark is right. In eager mode the mark is a no-op call; `inspect.signature` still shows
  the class's own. A class already marked by its authors is left alone. `remove()` restores the class.

The mark must stay while the compiled model serves (dynamo's guards check the function it traced), so the backend
that compiled removes it when it is deactivated; holders are counted per class, so the candidates of one tuning
run and several tuned models share it. While a class is marked, other compiles of it in the process (a user's own
`torch.compile`) also trace it as a region - hierarchical compilation, which torch documents as safe. A compile
that fails with regions is tried again without them by the backend.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

#: siblings needed for a group: below this, tracing once saves little next to the region's own overhead
MIN_REPEATS = 3


#: class -> [the forward it had (None: inherited), how many installs hold the mark]
_held: dict[type, list[Any]] = {}
_lock = threading.Lock()


def _eligible(block: torch.nn.Module) -> bool:
    """A block: submodules of its own (a single layer is one kernel, nothing to trace once) and weights."""
    return any(True for _ in block.children()) and any(True for _ in block.parameters())


def _signature(module: torch.nn.Module) -> tuple[Any, ...]:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return (type(module), tuple((name, tuple(t.shape), t.dtype) for name, t in tensors))


def repeated_groups(module: torch.nn.Module, min_repeats: int = MIN_REPEATS) -> list[list[torch.nn.Module]]:
    """Groups of identical sibling blocks under `module` (see the module docstring), outermost first."""
    groups: list[list[torch.nn.Module]] = []
    parents, seen = [module], {id(module)}
    while parents:
        parent = parents.pop(0)
        by_signature: dict[tuple[Any, ...], list[torch.nn.Module]] = {}
        for child in parent.children():
            if id(child) not in seen and _eligible(child):
                by_signature.setdefault(_signature(child), []).append(child)
        grouped: set[int] = set()
        for members in by_signature.values():
            if len(members) >= min_repeats:
                groups.append(members)
                grouped.update(id(m) for m in members)
        for child in parent.children():  # a block shared by two parents is visited once
            if id(child) not in grouped and id(child) not in seen:
                seen.add(id(child))
                parents.append(child)
    return groups


def _mark(cls: type) -> None:
    own = cls.__dict__.get("forward")
    forward = cls.forward
    region = torch.compiler.nested_compile_region(forward)
    functools.update_wrapper(region, forward)  # the signature the binder and transformers' checks read
    _held[cls] = [own, 1]
    cls.forward = region  # type: ignore[method-assign]


def _unmark(cls: type) -> None:
    own, _count = _held.pop(cls)
    if own is None:
        delattr(cls, "forward")
    else:
        cls.forward = own  # type: ignore[method-assign]


def _already_marked(cls: type) -> bool:
    return cls not in _held and hasattr(cls.forward, "__marked_compile_region_fn__")


class CompileRegions:
    """A hold on the nested-compile-region mark of the classes of a model's repeated blocks (module docstring)."""

    def __init__(self, classes: list[type], groups: int, blocks: int) -> None:
        self._classes = classes
        self.groups = groups
        self.blocks = blocks

    @classmethod
    def install(cls, module: torch.nn.Module, min_repeats: int = MIN_REPEATS) -> CompileRegions:
        """Mark the classes of `repeated_groups(module)`; an empty `CompileRegions` when there is none."""
        if getattr(torch.compiler, "nested_compile_region", None) is None:  # torch before 2.8
            return cls([], 0, 0)
        groups = [g for g in repeated_groups(module, min_repeats) if not _already_marked(type(g[0]))]
        classes = list(dict.fromkeys(type(g[0]) for g in groups))
        with _lock:
            for block_class in classes:
                if block_class in _held:
                    _held[block_class][1] += 1
                else:
                    _mark(block_class)
        return cls(classes, len(groups), sum(len(g) for g in groups))

    def remove(self) -> None:
        """Give the holds back; the last holder of a class restores it (idempotent)."""
        with _lock:
            for block_class in self._classes:
                held = _held.get(block_class)
                if held is None:
                    continue
                held[1] -= 1
                if held[1] <= 0:
                    _unmark(block_class)
            self._classes = []
