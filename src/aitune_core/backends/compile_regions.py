"""`CompileRegions`: identical sibling blocks traced once when Inductor compiles a whole model.

Why: compiling a model whole lets Inductor fuse across its blocks and capture one CUDA graph, but dynamo traces
and Inductor lowers every block again - the 24 decoder layers of a transformer are 24 copies of the same work.
Measured on this repository's 2-core CPU (a tiny LlamaModel, torch 2.13): the whole-model compile took 31-41 s for
24 layers against 16 s for one; with the layer class marked as a nested compile region, 16-19 s, outputs within
2e-6 of eager. torch's `torch.compiler.nested_compile_region` does this for code that opts in; a tuner that sees
the module tree can opt in for the model, without changing its code:

- `repeated_groups(module)`: direct children of one parent that share class, parameter and buffer names, shapes
  and dtypes, `MIN_REPEATS` or more of them (the layers of a ModuleList; the identical bottlenecks of a deep
  ResNet stage); only blocks with submodules of their own (a single layer is one kernel).
- `CompileRegions.marked(module)` marks the `forward` of those blocks' classes for the length of a compile - on
  the class, the way torch documents it: marking single instances (a region function called with the module as an
  argument) made torch 2.13 reuse the first block's weights for its siblings in a small test, a wrong answer,
  where the class-level mark is right. The marked forward takes the region only inside dynamo's trace; every
  eager call, of any thread, runs the class's own forward (a `torch.export` on another thread sets a process-wide
  flag that would otherwise compile inside the region's eager path). The region keeps one variant per instance
  (`max_reuse_entries`), so per-layer attributes such as `layer_idx` cannot exhaust it. Classes whose forward is
  no plain function (scripted modules) or that their authors marked are left alone.

The mark stays while the compiled model serves: some compiled graphs guard on the class's forward (measured: a
24-layer LlamaModel compiled with the mark recompiled, for 43 s and without regions, on its first call after the
mark was taken off). The backend holds it until it is deactivated or garbage (`held_by`), holds are counted per
class, and a class marked again gets the same marked forward, so graphs compiled earlier keep matching. While a
class is marked, another compile of it in the process (a user's own `torch.compile`) also traces it as a region.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

#: siblings needed for a group: below this, tracing once saves little next to the region's own overhead. Measured
#: on an H100 (torch 2.11, `benchmarks/probes/compile_regions.py --warm`, reduce-overhead, batch 8): BERT-base's
#: 12 layers compiled in 0.60x the plain compile's time, warm in 0.91x; ResNet-50's groups of 3 and 5
#: bottlenecks in 1.32x, warm in 1.09x, and ran 1.21x slower.
MIN_REPEATS = 6


#: class -> [the forward it had (None: inherited), how many installs hold the mark, the marked forward]
_held: dict[type, list[Any]] = {}
_lock = threading.Lock()
#: class -> its marked forward (see `_marked_form`)
_forms: dict[type, Callable[..., Any]] = {}


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


def _reuse_entries(module: torch.nn.Module, block_class: type) -> int:
    """Variants torch may keep of the region: at least one per instance of the class in the model (a per-layer
    Python attribute such as `layer_idx` makes each layer a variant of its own; torch's default of 8 then fails
    the compile)."""
    return max(8, sum(1 for m in module.modules() if type(m) is block_class) + 1)


def _region(forward: Callable[..., Any], reuse_entries: int) -> Callable[..., Any]:
    def block(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:  # torch annotates this, not `forward`
        return forward(self, *args, **kwargs)

    try:
        return torch.compiler.nested_compile_region(block, max_reuse_entries=reuse_entries)
    except TypeError:  # torch without max_reuse_entries
        return torch.compiler.nested_compile_region(block)


def _marked_form(block_class: type, reuse_entries: int) -> Callable[..., Any]:
    """The marked forward of a class, made once per process: a compiled graph may guard on the identity of the
    forward it traced (transformers' layers, whose `__call__` is their own, do), so marking the class again later
    must put back the same object."""
    forward = block_class.forward
    marked = _forms.get(block_class)
    if marked is not None and getattr(marked, "__wrapped__", None) is forward:
        return marked  # (a class whose forward was replaced since gets a new form around the new forward)
    region = _region(forward, reuse_entries)

    def marked(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        # only dynamo's trace takes the region; eager calls (of any thread, an export's included) run the forward
        if torch.compiler.is_dynamo_compiling():
            return region(self, *args, **kwargs)
        return forward(self, *args, **kwargs)

    functools.update_wrapper(marked, forward, updated=())  # name, doc and signature (`__wrapped__`) only
    marked.__aitune_region__ = True  # type: ignore[attr-defined]
    _forms[block_class] = marked
    return marked


def _mark(block_class: type, reuse_entries: int) -> None:
    own = block_class.__dict__.get("forward")
    marked = _marked_form(block_class, reuse_entries)
    _held[block_class] = [own, 1, marked]
    block_class.forward = marked  # type: ignore[method-assign]


def _unmark(block_class: type) -> None:
    own, _count, marked = _held.pop(block_class)
    if block_class.__dict__.get("forward") is not marked:  # patched again since: leave it to whoever did
        return
    if own is None:
        delattr(block_class, "forward")
    else:
        block_class.forward = own  # type: ignore[method-assign]


def _markable(block_class: type) -> bool:
    """A class whose forward is a plain function nobody marked (its authors, or torch.jit's scripted classes)."""
    if block_class in _held:
        return True
    forward = getattr(block_class, "forward", None)
    if forward is not None and forward is _forms.get(block_class):
        return False  # marked and held by nobody: a class patched since we restored it
    return (
        inspect.isfunction(forward)
        and not issubclass(block_class, torch.jit.ScriptModule)
        and not hasattr(forward, "__marked_compile_region_fn__")
        and not getattr(forward, "__aitune_region__", False)
    )


class CompileRegions:
    """A hold on the nested-compile-region mark of the classes of a model's repeated blocks (module docstring)."""

    def __init__(self, classes: list[type], groups: int, blocks: int) -> None:
        self._classes = classes
        self.groups = groups
        self.blocks = blocks

    @classmethod
    @contextlib.contextmanager
    def marked(cls, module: torch.nn.Module, min_repeats: int = MIN_REPEATS) -> Iterator[CompileRegions]:
        """The mark for the length of the block: a compile traces inside it."""
        regions = cls.install(module, min_repeats)
        try:
            yield regions
        finally:
            regions.remove()

    @classmethod
    def install(cls, module: torch.nn.Module, min_repeats: int = MIN_REPEATS) -> CompileRegions:
        """Mark the classes of `repeated_groups(module)`; an empty `CompileRegions` when there is none."""
        if getattr(torch.compiler, "nested_compile_region", None) is None:  # torch before 2.8
            return cls([], 0, 0)
        groups = repeated_groups(module, min_repeats)
        held: list[type] = []
        with _lock:
            groups = [g for g in groups if _markable(type(g[0]))]
            try:
                for block_class in dict.fromkeys(type(g[0]) for g in groups):
                    if block_class in _held:
                        _held[block_class][1] += 1
                    else:
                        _mark(block_class, _reuse_entries(module, block_class))
                    held.append(block_class)
            except BaseException:
                _release(held)
                raise
        return cls(held, len(groups), sum(len(g) for g in groups))

    def describe(self) -> str:
        """`24 LlamaDecoderLayer blocks in 1 group`: what is traced once per class (for the history)."""
        names = ", ".join(block_class.__name__ for block_class in self._classes)
        return f"{self.blocks} {names} blocks in {self.groups} group{'s' if self.groups != 1 else ''}"

    def held_by(self, owner: object) -> CompileRegions:
        """Give the holds back when `owner` is garbage at the latest (a backend dropped without deactivation)."""
        weakref.finalize(owner, self.remove)
        return self

    def remove(self) -> None:
        """Give the holds back; the last holder of a class restores it (idempotent)."""
        with _lock:
            _release(self._classes)
            self._classes = []


def _release(classes: list[type]) -> None:
    for block_class in classes:
        held = _held.get(block_class)
        if held is None:
            continue
        held[1] -= 1
        if held[1] <= 0:
            _unmark(block_class)


def compiles_whole(data: Sequence[Any], device: torch.device | None) -> bool:
    """Whether a graph compiles without nested compile regions whatever the config says: on a GPU, one whose calls
    change their arguments (a decoding step and its KV cache). Such a graph is never a CUDA graph, so its host work
    stays in every call, and regions add a call, input checks and unfused block edges per block to it (GPT-2
    `generate()` on an H200: 12 region calls a step, 1.24x torch.compile's time, `benchmarks/probes/decode_gap.py`).
    Compiling whole costs compile time once, in the background."""
    return device is not None and device.type == "cuda" and any(getattr(s, "mutates_inputs", False) for s in data)
