"""Facts about a module every caller asks for: where it lives and how many parameters it has.

Why one file: the JIT tuner, the JIT node, the AOT wrapper, its checkpoint loader and the strategies' log each had
their own copy, with small differences (buffers-only modules, lazy parameters, modules with no tensors at all).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import torch

from aitune_core.specs.tree import flatten_values


def module_device(
    module: torch.nn.Module, samples: Iterable[Any] = (), default: torch.device | None = None
) -> torch.device | None:
    """The device of the module's first parameter or buffer; without any, of the first input tensor of `samples`
    (recorded `Sample`s); else `default`."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    for sample in samples:
        for value in flatten_values((sample.args, sample.kwargs))[0]:
            if isinstance(value, torch.Tensor):
                return value.device
    return default


def count_parameters(module: torch.nn.Module) -> int:
    """Parameters of the module and its children; lazy (uninitialized) parameters count as 0."""
    total = 0
    try:
        parameters = list(module.parameters())
    except Exception:  # an object that only looks like a module
        return 0
    for parameter in parameters:
        try:
            total += parameter.numel()
        except (RuntimeError, ValueError):
            continue
    return total
