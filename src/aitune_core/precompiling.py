"""`make_precompiled`: compile one graph of a module with dynamo and Inductor and save the whole compiled function.

The function compiled is `backends.precompiled.precompiled_entry` over the tuning view and a recorded call, in
the call's own form; the recorded call's dynamic axes (batch, sequence length) are marked dynamic, as hints
(`maybe_mark_dynamic`): dynamo's own guards, saved with the function, then say which calls it serves. It is
compiled whole (`fullgraph`: a graph break fails the make) with Inductor's default options (no CUDA graphs: a
loaded function replays none), under `no_grad`, in the calling thread; with torch's caches warm from tuning this
is a dynamo trace and cache lookups.

Two things torch's saved format does not carry by itself, both needed by transformers models:
- guards on object identities (`ID_MATCH` and its family: a builtin activation function, a code object that
  `inspect.signature` read) cannot be saved; they are left out (`guard_filter_fn`, as torch's own
  `caching_precompile` does). What they checked is checked instead when the file is loaded: the structure of
  the module (`structure_of`) and the outputs on the loading process's own recorded calls (validation). Guards
  on functions' default values are left out too before torch 2.13, which cannot load them (`savable_guards`);
- module aliases that dynamo put into the entry's globals (`___module_collections_<id>_c0`, to build a
  `ModelOutput`) are named in the file's header (`HEADER`), so that the loader can import them.

File layout: one JSON line (`{"format": 1, "functions": [{"modules": {alias: module name}, "bytes": n}, ...]}`),
then each function's bytes as torch saved them, in that order (`make_precompiled` says why a file holds more
than one function). The file is
written beside its destination and moved into place with `os.replace`, so processes sharing the folder see the
whole file or none. `backends/precompiled.py` loads it.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import types
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.aoti_package import file_sha256
from aitune_core.backends.precompiled import FORMAT, precompiled_entry
from aitune_core.errors import BackendBuildError
from aitune_core.specs.replay_state import replaying
from aitune_core.specs.tree import flatten_values, unflatten

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec


def _marked_call(graph_spec: GraphSpec, sample: Sample, device: torch.device) -> tuple[tuple, dict]:
    """The sample's call on `device`, its non-static axes hinted dynamic on detached aliases of its tensors."""
    args, kwargs = sample.inputs_to(device)
    tensors = graph_spec.input_tensors(args, kwargs)
    aliases: dict[int, torch.Tensor] = {}
    for tensor, spec in zip(tensors, graph_spec.input_spec.tensors):
        axes = [axis for axis in spec.non_static_axes() if axis < tensor.dim() and tensor.shape[axis] >= 2]
        if axes:
            alias = aliases[id(tensor)] = tensor.detach()
            for axis in axes:
                torch._dynamo.maybe_mark_dynamic(alias, axis)
    leaves, form = flatten_values((tuple(args), dict(kwargs)))
    leaves = [aliases.get(id(leaf), leaf) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    new_args, new_kwargs = unflatten(form, leaves)
    return tuple(new_args), dict(new_kwargs)


def _largest(data: Sequence[Sample]) -> Sample:
    """The recorded call with the most input elements: no axis of it is 0 or 1, which dynamo would specialize."""
    def size(sample: Sample) -> int:
        leaves, _ = flatten_values((tuple(sample.args), dict(sample.kwargs)))
        return sum(leaf.numel() for leaf in leaves if isinstance(leaf, torch.Tensor))

    return max(data, key=size)


#: guard kinds torch cannot save (see the module docstring)
UNSAVED_GUARDS = frozenset({"ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION"})
#: whether this torch loads guards on a function's default values (`DEFAULTS_GUARDS`)
DEFAULTS_GUARDS_LOAD = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)
#: what the name of a guard on a function's default values holds (dynamo's `DefaultsSource`)
DEFAULTS_GUARDS = (".__defaults__", ".__kwdefaults__")


def savable_guards(entries: Sequence[Any]) -> list[bool]:
    """`guard_filter_fn`: keep every guard torch can save, and can load again.

    Guards on a function's default values are left out before torch 2.13: torch 2.11 saves them but fails to load
    them (`DefaultsSource.__init__() takes from 3 to 4 positional arguments but 6 were given`, every
    transformers model: `inspect.signature`'s keyword defaults, a layer's `feed_forward_chunk.__defaults__`;
    measured on an H100 with a tiny BertModel, which loads and answers within 7.2e-7 once they are left out).
    What they checked - defaults the program changed after the file was made - the loading process's validation
    on its own calls checks instead."""
    return [not (entry.guard_type in UNSAVED_GUARDS or UNSAVED_GUARDS.intersection(entry.derived_guard_types)
                 or (not DEFAULTS_GUARDS_LOAD and any(part in entry.name for part in DEFAULTS_GUARDS)))
            for entry in entries]


def _entry_with_builtins() -> types.FunctionType:
    """`precompiled_entry` over a copy of its globals that also holds the builtins by name: torch 2.11 saves only
    the globals it finds in the frame's own dict, and refused its own function at once when the saved bytecode
    named a builtin (`Missing required external references: ['type']`, BERT-base on the H100 image)."""
    scope = {**{k: v for k, v in vars(builtins).items() if not k.startswith("_")}, **precompiled_entry.__globals__}
    entry = types.FunctionType(precompiled_entry.__code__, scope, precompiled_entry.__name__)
    entry.__qualname__ = precompiled_entry.__qualname__
    return entry


def _aot_compile(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[Any, dict[str, Any]]:
    """The compiled function, and the globals dict its entry ran in (where dynamo put its module aliases)."""
    entry = _entry_with_builtins()
    compiled = torch.compile(entry, fullgraph=True, backend="inductor", options={"guard_filter_fn": savable_guards})
    if hasattr(compiled, "aot_compile"):
        return compiled.aot_compile(((module, *args), kwargs)), entry.__globals__
    from torch._dynamo.aot_compile import aot_compile_fullgraph  # torch builds whose wrapper lacks the method
    from torch._dynamo.hooks import Hooks

    backend = torch._TorchCompileInductorWrapper(None, None, False)
    function = aot_compile_fullgraph(entry, ((module, *args), kwargs), hooks=Hooks(guard_filter_fn=savable_guards),
                                     backend=backend)
    return function, entry.__globals__


def _module_aliases(function: Any, scope: dict[str, Any]) -> dict[str, str]:
    """The entry's globals that the saved bytecode names but torch does not import back: modules dynamo aliased."""
    env = getattr(getattr(function, "_artifacts", None), "runtime_env", None)
    return {ref: scope[ref].__name__ for ref in sorted(getattr(env, "external_refs", ()) or ())
            if isinstance(scope.get(ref), types.ModuleType)}


#: the most functions one file holds (each another specialization the recorded calls need: a batch of 1)
MAX_FUNCTIONS = 3


def _accepts(function: Any, module: torch.nn.Module, sample: Sample, device: torch.device) -> bool:
    args, kwargs = sample.inputs_to(device)
    with torch.no_grad():
        return bool(function.guard_check(module, *args, **kwargs))


def _compile(module: torch.nn.Module, graph_spec: GraphSpec, sample: Sample,
             device: torch.device) -> tuple[Any, dict[str, Any]]:
    args, kwargs = _marked_call(graph_spec, sample, device)
    try:
        with torch.no_grad():
            return _aot_compile(module, args, kwargs)
    except (ImportError, AttributeError) as exc:
        raise BackendBuildError(f"torch {torch.__version__} cannot precompile a function ({exc})") from exc
    except Exception as exc:  # dynamo or Inductor refused it (a graph break, an unsupported operation)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise BackendBuildError(f"precompiling failed ({type(exc).__name__}: {first[:300]})") from exc


def _compile_all(module: torch.nn.Module, graph_spec: GraphSpec, data: Sequence[Sample],
                 device: torch.device) -> list[tuple[Any, dict[str, Any]]]:
    functions = [_compile(module, graph_spec, _largest(data), device)]  # (function, the globals it ran in)
    left = [s for s in data if not _accepts(functions[0][0], module, s, device)]
    while left and len(functions) < MAX_FUNCTIONS:
        try:
            functions.append(_compile(module, graph_spec, _largest(left), device))
        except BackendBuildError:
            break  # those calls are answered by the original forward
        left = [s for s in left if not _accepts(functions[-1][0], module, s, device)]
    return functions


def make_precompiled(module: torch.nn.Module, graph_spec: GraphSpec, data: Sequence[Sample], device: torch.device,
                     dest: Path) -> str:
    """Write the precompiled functions of `module`'s graph `graph_spec` to `dest`; returns the file's SHA-256 (hex).

    The first function is compiled from the largest recorded call; while recorded calls are left that no function's
    guards accept (dynamo specializes an axis of size 1, so a batch of 1 is another function), another is compiled
    from the largest of them, up to `MAX_FUNCTIONS`. Raises `BackendBuildError` when this torch cannot precompile,
    or dynamo or Inductor refuse the first function (a graph break included)."""
    if not data:
        raise BackendBuildError("no recorded call to precompile from")
    with replaying(graph_spec):  # compiled (and its guards checked) as the program calls the graph
        functions = _compile_all(module, graph_spec, data, device)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    payload = scratch.with_suffix(".torch")
    try:
        parts = []
        for function, scope in functions:
            function.save_compiled_function(str(payload), external_data={"module": module})
            parts.append((_module_aliases(function, scope), payload.read_bytes()))
        header = {"format": FORMAT, "functions": [{"modules": modules, "bytes": len(data)} for modules, data in parts]}
        with open(scratch, "wb") as out:
            out.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            for _modules, data in parts:
                out.write(data)
        digest = file_sha256(scratch)
        os.replace(scratch, dest)
        return digest
    finally:
        for leftover in (scratch, payload):
            with contextlib.suppress(OSError):
                leftover.unlink()
