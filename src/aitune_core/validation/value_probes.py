"""`check_value_probes(backend, job)`: an exported graph must follow input values the recorded calls never varied.

Why: validation compares a backend with the original module on the recorded calls only. A backend that runs a
program exported from one trace (ONNX Runtime, TensorRT) can have taken an input's values as given where the
recorded calls never varied them. Found by the eighth review (2026-11-26, this CPU): GPT-2 AOT-tuned with ONNX
Runtime from calls whose attention masks were all ones passed validation and then ignored the padding of every
later batch (logits off by 2-5e-2, no warning) - a silent wrong answer inside the tuned shape range.

How: for each integer or boolean input tensor that is all ones in every recorded call (an attention mask
without padding), two probe calls are made from the first recorded call with a quarter of that tensor's last
axis set to zero in its first row, once at its start and once at its end (padding); the original module computes
the reference, and the backend must agree within its tolerance (the review's graph went wrong on left padding
only). A probe the original module refuses (the input was not a mask) is skipped.
Only backends that declare `exports_graph` are probed: dynamo-compiled backends guard on what they specialise.
Stateful calls (a KV cache they change) are not probed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from aitune_core.errors import ValidationError
from aitune_core.log import get_logger
from aitune_core.recording.sample import Sample
from aitune_core.specs.replay_state import replaying
from aitune_core.specs.tree import flatten_values, unflatten
from aitune_core.validation.validator import validate_backend

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.strategies.tune_job import TuneJob

_logger = get_logger("validation")


def _all_ones(value: Any) -> bool:
    return (isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex()
            and value.dim() >= 1 and value.shape[-1] >= 2 and bool((value == 1).all()))


def _mask_leaves(samples: list[Sample]) -> list[int]:
    """Positions of the flattened inputs that are all-ones integer tensors in every sample."""
    flat = [flatten_values((sample.args, sample.kwargs))[0] for sample in samples]
    width = len(flat[0])
    if any(len(leaves) != width for leaves in flat):
        return []
    return [i for i in range(width) if all(_all_ones(leaves[i]) for leaves in flat)]


def _padded(tensor: torch.Tensor, left: bool) -> torch.Tensor:
    """`tensor` with a quarter of its last axis zeroed in its first row: at the start (`left`, as `generate()`
    pads a decoder's batch) or at the end."""
    padded = tensor.clone()
    length, width = tensor.shape[-1], max(1, tensor.shape[-1] // 4)
    padded[(0,) * (tensor.dim() - 1) + (slice(0, width) if left else slice(length - width, None),)] = 0
    return padded


def value_probes(module: torch.nn.Module, job: TuneJob) -> list[Sample]:
    """The probe calls, left- and right-padded, with the original module's outputs (see the module docstring)."""
    samples = [sample for sample in job.data if sample.inputs_after is None and not sample.mutates_inputs]
    positions = _mask_leaves(samples) if samples else []
    probes: list[Sample] = []
    for left in (True, False) if positions else ():
        leaves, treedef = flatten_values(samples[0].inputs_to(job.device))
        for position in positions:
            leaves[position] = _padded(leaves[position], left)
        args, kwargs = unflatten(treedef, leaves)
        try:
            with torch.no_grad(), replaying(job.graph_spec):
                output = module(*args, **kwargs)
            probes.append(Sample.capture(args, kwargs, output))
        except Exception as exc:  # the input was no mask the module accepts padding in: nothing to probe
            _logger.debug("value probe of graph %s skipped: %r", job.graph_spec.name, exc)
    return probes


def check_value_probes(backend: Backend, job: TuneJob) -> None:
    """Raise `ValidationError` when `backend` (one that `exports_graph`) ignores a value change the recorded calls
    never showed."""
    probes = value_probes(job.module, job)
    if not probes:
        return
    try:
        validate_backend(backend, job.graph_spec, probes)
    except ValidationError as exc:
        raise ValidationError(
            f"{backend.describe()} ignores values its recorded calls never varied: an integer input that was all "
            f"ones in every recorded call (an attention mask without padding) was padded, and the output "
            f"differs from the original module's ({exc})") from exc
