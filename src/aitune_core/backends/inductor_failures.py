"""Which failures of an Inductor build are worth another try, and how each is recognized.

Why a file of its own: `TorchInductorBackend._build` answers three kinds of failure by building again, each in
its own way; telling them apart means walking torch's chain of wrapped exceptions and reading its messages:

- a nested compile region at fault (`region_failure`): compile again without regions;
- a marked dynamic axis that the model's code specializes (`constraint_violation`): mark it as a hint instead;
- a live tensor in the CUDA-graph pool that the graph does not return (`untracked_pool_tensor`: torch's "Detected
  1 tensor(s) in the cudagraph pool not tracked as outputs"), seen intermittently on an H100 while a background
  job recorded ResNet-50's graph with the serving thread running: an earlier warm-up's output still alive in a
  reference cycle, which the JIT worker's collection policy (`aitune_jit/worker_courtesy.py`) may leave uncollected.
  The `reduce-overhead` candidate then failed and ResNet-50 stayed eager in that process (`docs/benchmarks.md`).
  Answer: a full collection, then the warm-up again, once.
"""

from __future__ import annotations

from typing import Any

#: what torch's errors say when a nested compile region is at fault (the compile is then tried without regions)
REGION_ERROR_WORDS = ("invoke_subgraph", "compile_region", "HigherOrderOp", "reuse entries", "InvokeSubgraph")
#: what torch's CUDA-graph trees say when a live allocation of the pool is not among the graph's outputs
UNTRACKED_POOL_WORDS = ("cudagraph pool not tracked as outputs",)


def in_chain(exc: BaseException | None, test: Any) -> bool:
    """True when `test` holds for `exc` or an exception it was raised from (torch wraps its errors)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if test(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _says(exc: BaseException, words: tuple[str, ...]) -> bool:
    return in_chain(exc, lambda e: any(word in f"{type(e).__name__}: {e}" for word in words))


def region_failure(exc: BaseException) -> bool:
    return _says(exc, REGION_ERROR_WORDS)


def constraint_violation(exc: BaseException) -> bool:
    return in_chain(exc, lambda e: type(e).__name__ == "ConstraintViolationError")


def untracked_pool_tensor(exc: BaseException) -> bool:
    return _says(exc, UNTRACKED_POOL_WORDS)
