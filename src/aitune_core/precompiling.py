"""`make_precompiled`: compile one graph of a module with dynamo and Inductor and save the whole compiled function.

The function compiled is `backends.precompiled.precompiled_entry` over the tuning view and a recorded call, in
the call's own form; the recorded call's dynamic axes (batch, sequence length) are marked dynamic, as hints
(`maybe_mark_dynamic`): dynamo's own guards, saved with the function, then say which calls it serves. It is
compiled whole (`fullgraph`: a graph break fails the make) with Inductor's default options (no CUDA graphs: a
loaded function replays none), under `no_grad`, in the calling thread; with torch's caches warm from tuning this
is a dynamo trace and cache lookups. The file is written beside its destination and moved into place with
`os.replace`, so processes sharing the folder see the whole file or none. `backends/precompiled.py` loads it.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.aoti_package import file_sha256
from aitune_core.backends.precompiled import precompiled_entry
from aitune_core.errors import BackendBuildError
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


def _aot_compile(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    compiled = torch.compile(precompiled_entry, fullgraph=True, backend="inductor")
    if hasattr(compiled, "aot_compile"):
        return compiled.aot_compile(((module, *args), kwargs))
    from torch._dynamo.aot_compile import aot_compile_fullgraph  # torch builds whose wrapper lacks the method
    from torch._dynamo.hooks import Hooks

    backend = torch._TorchCompileInductorWrapper(None, None, False)
    return aot_compile_fullgraph(precompiled_entry, ((module, *args), kwargs), hooks=Hooks(), backend=backend)


def make_precompiled(module: torch.nn.Module, graph_spec: GraphSpec, data: Sequence[Sample], device: torch.device,
                     dest: Path) -> str:
    """Write the precompiled function of `module`'s graph `graph_spec` to `dest`; returns its SHA-256 (hex). Raises
    `BackendBuildError` when this torch cannot precompile, or dynamo or Inductor fail (a graph break included)."""
    if not data:
        raise BackendBuildError("no recorded call to precompile from")
    args, kwargs = _marked_call(graph_spec, _largest(data), device)
    try:
        with torch.no_grad():
            function = _aot_compile(module, args, kwargs)
    except (ImportError, AttributeError) as exc:
        raise BackendBuildError(f"torch {torch.__version__} cannot precompile a function ({exc})") from exc
    except Exception as exc:  # dynamo or Inductor refused it (a graph break, an unsupported operation)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise BackendBuildError(f"precompiling failed ({type(exc).__name__}: {first[:300]})") from exc
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        function.save_compiled_function(str(scratch), external_data={"module": module})
        digest = file_sha256(scratch)
        os.replace(scratch, dest)
        return digest
    finally:
        with contextlib.suppress(OSError):
            scratch.unlink()
