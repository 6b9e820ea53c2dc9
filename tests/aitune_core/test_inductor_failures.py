"""inductor_failures: each kind of retryable Inductor failure is recognized through torch's wrapped exceptions, and
`TorchInductorBackend` warms up once more after a stale tensor held its CUDA-graph pool."""

from __future__ import annotations

import pytest

from aitune_core.backends import inductor_failures as failures
from aitune_core.backends.torch_inductor import TorchInductorBackend

POOL = "Detected 1 tensor(s) in the cudagraph pool not tracked as outputs. All live allocations must be tracked"


def _wrapped(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise RuntimeError("backend compiler failed") from exc
    except RuntimeError as outer:
        return outer


def test_each_kind_is_recognized_through_the_chain():
    assert failures.untracked_pool_tensor(_wrapped(RuntimeError(POOL)))
    assert failures.region_failure(_wrapped(RuntimeError("invoke_subgraph: cannot reuse entries")))
    violation = type("ConstraintViolationError", (Exception,), {})("s0 was specialized")
    assert failures.constraint_violation(_wrapped(violation))
    other = _wrapped(ValueError("shape mismatch"))
    assert not (failures.untracked_pool_tensor(other) or failures.region_failure(other)
                or failures.constraint_violation(other))


def _backend_failing(times: int, message: str, cudagraphs: bool = True) -> tuple[TorchInductorBackend, list]:
    backend = TorchInductorBackend()
    backend._cudagraphs = cudagraphs
    calls: list[str] = []

    def warm_up(ordered):
        calls.append("warm")
        if len([c for c in calls if c == "warm"]) <= times:
            raise RuntimeError(message)

    backend._warm_up = warm_up
    backend._compile = lambda: calls.append("compile")
    backend._free_memory = lambda: calls.append("collect")
    return backend, calls


def test_a_held_pool_is_collected_and_warmed_up_once_more():
    backend, calls = _backend_failing(1, POOL)
    backend._warm_up_once_more_if_pool_held([])
    assert calls == ["warm", "collect", "compile", "warm"]


def test_only_once_and_only_for_that_failure_with_cuda_graphs():
    backend, calls = _backend_failing(2, POOL)
    with pytest.raises(RuntimeError, match="cudagraph pool"):
        backend._warm_up_once_more_if_pool_held([])
    assert calls.count("warm") == 2
    for message, cudagraphs in (("shape mismatch", True), (POOL, False)):
        backend, calls = _backend_failing(1, message, cudagraphs)
        with pytest.raises(RuntimeError):
            backend._warm_up_once_more_if_pool_held([])
        assert calls == ["warm"]
