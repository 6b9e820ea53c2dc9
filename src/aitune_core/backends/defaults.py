"""`default_backends`: the one place that says which backends aitune tries when nobody chose.

Used by `TuneStrategy()` / `HighestThroughputStrategy()` without backends and by the default strategy
(`aitune_core.strategies.defaults`), which AOT and JIT tuning use when no strategy is given. In the order tried:

- TensorRT first when the `tensorrt` package is importable (it is the fastest where it works);
- with `precision` ("bf16"/"fp16", opt-in), Inductor under autocast to that dtype (validated with that dtype's
  tolerance), on CUDA its CUDA-graph variant first: the user asked for lower precision;
- on CUDA, Inductor `mode="reduce-overhead"` (CUDA graphs) before the default mode: CUDA graphs remove the
  launch overhead that dominates small batches and cost little at large ones (H200, resnet50 fp32: 0.69 vs
  1.99 ms at batch 1, 2.70 vs 2.89 ms at batch 32), so they are the likely winner and the default strategy's
  early stop usually saves the second compile;
- Torch Inductor (default mode).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend

PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def tensorrt_available() -> bool:
    """True when the `tensorrt` package can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("tensorrt") is not None
    except (ImportError, ValueError):
        return False


def default_backends(
    device: torch.device | str | None = None, precision: str | None = None, *, fullgraph: bool = False
) -> list[Backend]:
    """The default candidates for `device` (CPU when None), in the order they are tried; see the module
    docstring. `precision` is None, "bf16" or "fp16". With `fullgraph`, the Inductor candidates compile the
    module as one graph or fail (a graph break fails the build instead of compiling the pieces)."""
    from aitune_core.backends.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig

    if precision is not None and precision not in PRECISION_DTYPES:
        raise ValueError(f"precision must be None, 'bf16' or 'fp16', got {precision!r}")
    cuda = device is not None and torch.device(device).type == "cuda"
    modes: list[str | None] = ["reduce-overhead", None] if cuda else [None]
    backends: list[Backend] = []
    if tensorrt_available():
        from aitune_core.backends.tensorrt import TensorRTBackend

        backends.append(TensorRTBackend())
    if precision is not None:
        dtype = PRECISION_DTYPES[precision]
        backends += [
            TorchInductorBackend(TorchInductorBackendConfig(mode=mode, fullgraph=fullgraph, autocast_enabled=True,
                                                            autocast_dtype=dtype))
            for mode in modes
        ]
    backends += [TorchInductorBackend(TorchInductorBackendConfig(mode=mode, fullgraph=fullgraph)) for mode in modes]
    return backends


