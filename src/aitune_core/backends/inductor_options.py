"""Which Inductor options a `TorchInductorBackendConfig` may carry, and which of them one read from a file may.

Why: Inductor's options reach far. `cpp.cxx` names the C++ compiler Inductor runs, `*_custom_pass` options take
callables, others take paths or lists of pass names. A configuration written in the user's script is the user's
code and may set any of them. A configuration read from a file - an `aitune.torch.save` checkpoint, a JIT
decision in a shared cache folder - must not: an edited checkpoint that set `cpp.cxx` made `aitune.torch.load`
run a program of the editor's choosing (a reviewer's script), against the promise that nothing in those files is
ever run. So:

- every option name must be one of `torch._inductor.list_options()` (a misspelt name was silently ignored) and
  every value a plain bool, int, float, string or None (nested dicts such as `{"triton": {...}}` are read as
  `triton.<name>`);
- from a file (`check_from_file`), only the names in `FILE_SAFE_OPTIONS` are accepted: switches and sizes of the
  compile, none of which names a program, a path, a pass or code. aitune's own tuning sets none at all (its
  candidates use `mode`); the list is what a user's `options` may reasonably carry into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: options a configuration read from a file may set (see the module docstring)
FILE_SAFE_OPTIONS = frozenset({
    "max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "max_autotune_gemm_backends",
    "max_autotune_gemm_search_space", "coordinate_descent_tuning", "coordinate_descent_check_all_directions",
    "epilogue_fusion", "epilogue_fusion_first", "aggressive_fusion", "combo_kernels", "benchmark_kernel",
    "shape_padding", "comprehensive_padding", "freezing", "layout_optimization", "conv_1x1_as_mm",
    "split_reductions", "fallback_random", "emulate_precision_casts", "size_asserts", "nan_asserts",
    "reorder_for_locality", "dce", "pattern_matcher", "search_autotune_cache", "autotune_in_subproc",
    "use_mixed_mm", "cpp_wrapper", "triton.cudagraphs", "triton.cudagraph_trees",
    "triton.cudagraph_skip_dynamic_graphs", "triton.autotune_pointwise", "triton.autotune_cublasLt",
    "triton.persistent_reductions", "triton.multi_kernel", "triton.max_tiles", "triton.prefer_nd_tiling",
    "triton.unique_kernel_names", "triton.divisible_by_16", "triton.tiling_prevents_pointwise_fusion",
    "triton.tiling_prevents_reduction_fusion", "triton.enable_persistent_tma_matmul", "cpp.simdlen",
    "cpp.threads", "cpp.min_chunk_size", "cpp.enable_kernel_profile", "cpp.vec_isa_ok",
})
_PLAIN = (bool, int, float, str, type(None))


def _flat(options: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, value in options.items():
        if not isinstance(name, str):
            raise ValueError(f"TorchInductorBackendConfig: option names must be strings, got {name!r}")
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def check_options(options: Any) -> None:
    """Raise `ValueError` unless `options` is None or a dict of known Inductor options with plain values."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise ValueError(f"TorchInductorBackendConfig: options must be a dict, got {type(options).__name__}")
    from torch._inductor import list_options

    known = set(list_options())
    for name, value in _flat(options):
        if name not in known:
            close = sorted(k for k in known if k.split(".")[-1] == name.split(".")[-1] or name in k)[:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"TorchInductorBackendConfig: {name!r} is not an Inductor option{hint}")
        if not isinstance(value, _PLAIN):
            raise ValueError(f"TorchInductorBackendConfig: option {name!r} must be a bool, int, float, string or "
                             f"None, got {type(value).__name__} (callables and containers cannot be checked)")


def check_from_file(options: Any) -> None:
    """`check_options`, and only `FILE_SAFE_OPTIONS`: for a configuration read from a checkpoint or a decision."""
    check_options(options)
    for name, _value in _flat(options or {}):
        if name not in FILE_SAFE_OPTIONS:
            raise ValueError(f"TorchInductorBackendConfig: option {name!r} is not accepted from a file (it can name a "
                             "program, a path or code); set it in your script instead")
