"""Which failures of an Inductor build are worth another try, and how each is recognized.

Why a file of its own: `TorchInductorBackend._build` answers two kinds of failure by building again, each in
its own way; telling them apart means walking torch's chain of wrapped exceptions and reading its messages:

- a nested compile region at fault (`region_failure`): compile again without regions;
- a marked dynamic axis that the model's code specializes (`constraint_violation`): mark it as a hint instead.

Not retried: torch's "Detected N tensor(s) in the cudagraph pool not tracked as outputs", seen intermittently on
an H100 while a background job recorded a `reduce-overhead` graph (ResNet-50, BERT-base) with the serving thread
running; the candidate then fails and the module keeps another backend. A full collection and a second warm-up
did not prevent it in the one run that tried (docs/benchmarks.md); its cause is not found.
"""

from __future__ import annotations

from typing import Any

#: what torch's errors say when a nested compile region is at fault (the compile is then tried without regions)
REGION_ERROR_WORDS = ("invoke_subgraph", "compile_region", "HigherOrderOp", "reuse entries", "InvokeSubgraph")


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

