"""A cost model that needs no measurement: a module that is one torch.nn layer is not worth tuning.

A `torch.nn` leaf layer (Linear, Embedding, LayerNorm, Conv2d, BatchNorm2d, ...) runs one library kernel
(a GEMM, a gather, a normalization). A compiler calls the same kind of kernel for it and has nothing to fuse,
so a tuned call can at best tie with eager and always pays the dispatch on top; building a backend for it only
costs compile time. `single_torch_layer(module)` recognises such modules - the layer itself, or a module whose
only submodule is such a layer and that holds no parameters or buffers of its own (a forward-only view of a
layer, or a thin wrapper adding elementwise work around it) - so that a strategy can skip them before it
builds anything.
"""

from __future__ import annotations

import torch

TORCH_NN_PACKAGE = "torch.nn.modules"


def _is_torch_leaf(module: torch.nn.Module) -> bool:
    module_name = type(module).__module__ or ""
    return module_name.startswith(TORCH_NN_PACKAGE) and next(module.children(), None) is None


def single_torch_layer(module: torch.nn.Module) -> str | None:
    """The class name of the one torch.nn layer `module` amounts to (see the module docstring), else None."""
    if not isinstance(module, torch.nn.Module):
        return None
    if _is_torch_leaf(module):
        return type(module).__name__
    submodules = [m for m in module.modules() if m is not module]
    if len(submodules) != 1 or not _is_torch_leaf(submodules[0]):
        return None
    if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
        return None
    return type(submodules[0]).__name__
