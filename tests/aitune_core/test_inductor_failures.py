"""inductor_failures: each kind of retryable Inductor failure is recognized through torch's wrapped exceptions."""

from __future__ import annotations

from aitune_core.backends import inductor_failures as failures

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
    assert failures.region_failure(_wrapped(RuntimeError("invoke_subgraph: cannot reuse entries")))
    violation = type("ConstraintViolationError", (Exception,), {})("s0 was specialized")
    assert failures.constraint_violation(_wrapped(violation))
    other = _wrapped(ValueError("shape mismatch"))
    assert not (failures.region_failure(other) or failures.constraint_violation(other))
    assert not failures.region_failure(_wrapped(RuntimeError(POOL)))  # not retried: see the module docstring
