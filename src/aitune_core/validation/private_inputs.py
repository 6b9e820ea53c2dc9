"""The inputs validation feeds a backend: private copies of a recorded sample's inputs, checked after the call.

Validation must not change the recorded samples (other candidates are validated with them after this one), so a
backend never sees the sample's own objects: every tensor is copied (placed as the caller placed it, see
`recording.sample.replay_device`; layout kept) and every other argument object that can be deep-copied is (a cache
object, a dict the module reads back); plain constants, modules (the model, not the call's data) and classes are
shared. After the call, `PrivateInputs` tells

- whether the backend changed its inputs: a tensor's values changed in place, or a tensor put into, replaced in or
  removed from an argument object. A backend may only do that when the original module does it too
  (`Sample.mutates_inputs`, read with `getattr` so samples without that field count as "leaves its inputs
  unchanged"); otherwise the caller's objects would be changed by the tuned module and not by the original;
- which tensors the backend wrote into argument objects (new or replaced ones): the caller can keep those just
  like outputs, so the output-aliasing check of `kept_outputs.py` watches them too.

`perturb=True` gives inputs with different values and the same shapes: the elements of each floating tensor
the call walks are shuffled by a fixed permutation. A backend that reuses one output buffer per input shape returns
the same values for the same inputs, so only a call with other values shows that the buffer is written again. A
shuffle keeps the set of values, so a float that the model turns into an index or a timestep stays in its range
(noise could push an index out of range, and on a GPU an out-of-range index is a device-side assert that ends the
process), and unlike a scale or a shift it is not undone by a normalization layer.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.errors import ValidationError
from aitune_core.log import get_logger
from aitune_core.recording.sample import replay_device
from aitune_core.specs.tree import flatten_values, unflatten
from aitune_core.validation.tensor_slots import Reachable, count_changed, reachable, snapshot, tensor_slots

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample

_logger = get_logger("validation")

_SHARED = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def _copy_leaf(leaf: Any, device: torch.device | None) -> Any:
    if isinstance(leaf, torch.Tensor):
        return leaf.detach().to(device=replay_device(leaf, device), copy=True)
    if isinstance(leaf, _SHARED) or callable(leaf):  # modules, classes, functions
        return leaf
    try:
        return copy.deepcopy(leaf)
    except Exception as exc:  # not copyable: the backend gets the sample's object, still checked afterwards
        _logger.debug("Validation cannot copy a %s argument (%s); passing the recorded one", type(leaf).__name__, exc)
        return leaf


def _perturbed(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if not tensor.is_floating_point() or tensor.numel() < 2:
        return tensor
    try:
        order = torch.randperm(tensor.numel(), generator=generator).to(tensor.device)
        return tensor.copy_(tensor.reshape(-1)[order].reshape(tensor.shape))  # in place: the strides stay
    except Exception:  # a dtype without indexing, an expanded tensor: left as it is
        return tensor


def copy_inputs(
    sample: Sample, device: torch.device | None, *, perturb: bool = False
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Private `(args, kwargs)` for one backend call: tensors copied to `device`, other objects deep-copied.

    `perturb`: the elements of floating tensors are shuffled (see the module docstring).
    """
    leaves, treedef = flatten_values((tuple(sample.args), dict(sample.kwargs)))
    copies = [_copy_leaf(leaf, device) for leaf in leaves]
    if perturb:
        generator = torch.Generator().manual_seed(0)
        copies = [_perturbed(leaf, generator) if isinstance(leaf, torch.Tensor) else leaf for leaf in copies]
    args, kwargs = unflatten(treedef, copies)
    return tuple(args), dict(kwargs)


def argument_state(inputs: tuple[Any, Any]) -> Reachable:
    """The tensors, objects and constants of a call's `(args, kwargs)`, paths rooted at `args` / `kwargs`."""
    args, kwargs = reachable(inputs[0], "args"), reachable(inputs[1], "kwargs")
    return Reachable({**args.tensors, **kwargs.tensors}, {**args.objects, **kwargs.objects},
                     {**args.constants, **kwargs.constants})


def has_floating_tensors(sample: Sample) -> bool:
    """Whether `copy_inputs(sample, perturb=True)` changes anything."""
    leaves, _ = flatten_values((tuple(sample.args), dict(sample.kwargs)))
    return any(isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel() for leaf in leaves)


class PrivateInputs:
    """Private copies of one sample's inputs, with a snapshot of every tensor in them taken before the call."""

    def __init__(self, sample: Sample, device: torch.device | None, *, perturb: bool = False) -> None:
        self.args, self.kwargs = copy_inputs(sample, device, perturb=perturb)
        self.mutates_inputs = bool(getattr(sample, "mutates_inputs", False))
        self._before = self._slots()
        self._snapshots = {path: snapshot(tensor) for path, tensor in self._before.items()}

    def _slots(self) -> dict[str, torch.Tensor]:
        return {**tensor_slots(self.args, "args"), **tensor_slots(self.kwargs, "kwargs")}

    def state(self) -> Reachable:
        """The tensors, objects and constants of these inputs now (after the call: what the backend left)."""
        return argument_state((self.args, self.kwargs))

    def returned_objects(self, sample: Sample) -> dict[int, Any]:
        """For a stateful sample: `{id(argument object in sample.inputs_after): the object at the same place in
        these inputs}`. An output that is one of the caller's argument objects (a cache returned with the logits)
        must be that object in the backend's output too."""
        if sample.inputs_after is None:
            return {}
        reference = argument_state(sample.inputs_after).objects
        mine = self.state().objects
        return {id(obj): mine.get(path) for path, obj in reference.items()}

    def changes(self) -> tuple[list[str], list[tuple[str, torch.Tensor]]]:
        """`(descriptions of every change to the inputs, [(path, tensor) written into the arguments])`."""
        after = self._slots()
        changes: list[str] = []
        written: list[tuple[str, torch.Tensor]] = []
        for path, tensor in after.items():
            before = self._before.get(path)
            if before is None:
                changes.append(f"{path} was added")
                written.append((path, tensor))
            elif tensor is not before:
                changes.append(f"{path} was replaced")
                written.append((path, tensor))
            elif self._snapshots[path] is not None:
                changed = count_changed(tensor, self._snapshots[path])
                if changed:
                    changes.append(f"{path} changed in place ({changed}/{tensor.numel()} elements)")
        changes += [f"{path} was removed" for path in self._before if path not in after]
        return changes, written

    def check(self, where: str) -> list[tuple[str, torch.Tensor]]:
        """Raise `ValidationError` when the backend changed inputs the original module leaves unchanged.

        Returns the tensors the backend wrote into argument objects (outputs the caller may keep).
        """
        changes, written = self.changes()
        if changes and not self.mutates_inputs:
            shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")
            raise ValidationError(
                f"{where}: the backend mutates its inputs ({shown}), but the original module leaves its inputs "
                "unchanged; a tuned call would change the caller's objects"
            )
        return written
