"""Whether a graph's recorded calls still describe its module: a failed tuning is remembered only when they do.

A tuning job validates each candidate against the outputs the original module gave when its calls were recorded.
A program that changes the module meanwhile - new weights from `load_state_dict` (a server reloading a
checkpoint), an in-place edit - makes every candidate that reads the weights at call time fail validation, since
the recorded outputs are the old weights' (a reviewer's hot-reload server: "output differs from the original
module's output", relative L2 error 1.3). Remembered, that failure kept the module and every identical sibling eager,
and was written to the decision cache, so later processes never tuned it either. Before a validation failure is
remembered, `recorded_calls_stale` runs the original module on the graph's first recorded call: when it no longer
gives the recorded output, the failure says so and is neither shared nor stored, and a node whose first tuning
failed only so records its calls anew, once (`TuningOutcome.record_again`), to be tuned with the new weights.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aitune_core.errors import ValidationError

if TYPE_CHECKING:
    from aitune_core.strategies.tune_job import TuneJob

_logger = logging.getLogger("aitune.jit")

STALE = "its recorded calls no longer match the module (it changed while it was tuned), so nothing is remembered"


def recorded_calls_stale(job: TuneJob) -> bool:
    """True when the module (the job's view of the original forward) no longer gives the output recorded for the
    graph's first call, by the validation's own rule. False when it does, or when that cannot be told."""
    from aitune_core.backends.torch_eager import TorchEagerBackend
    from aitune_core.validation.validator import validate_backend

    samples = list(job.samples[:1])
    if not samples:
        return False
    original = TorchEagerBackend()
    try:
        original.build(job.module, job.graph_spec, samples, job.device, job.cache_dir / "recorded-calls-check")
        validate_backend(original, job.graph_spec, samples)
    except ValidationError as exc:
        _logger.debug("the recorded calls of %s no longer match it: %s", job.name, exc)
        return True
    except Exception:  # (the module now fails on its recorded call: not this check's to judge)
        _logger.debug("could not check the recorded calls of %s", job.name, exc_info=True)
    finally:
        if original.is_active:
            original.deactivate()
    return False
