import pytest
import torch

from aitune_core.errors import ValidationError
from aitune_core.recording.sample import Sample
from aitune_core.validation.private_inputs import PrivateInputs, copy_inputs, has_floating_tensors


class _Cache:
    def __init__(self):
        self.keys: list[torch.Tensor] = []


class _Lock:
    """An argument deepcopy refuses."""

    def __deepcopy__(self, memo):
        raise TypeError("cannot copy a lock")


def _sample(**kwargs):
    return Sample(args=(torch.arange(6.0).reshape(2, 3),), kwargs=kwargs)


def test_copies_are_private_and_keep_layout():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    cache, lock, layer = _Cache(), _Lock(), torch.nn.Linear(2, 2)
    sample = Sample(args=(x, 3, layer), kwargs={"cache": cache, "lock": lock, "mask": {"m": torch.ones(2, dtype=bool)}})
    args, kwargs = copy_inputs(sample, None)
    assert args[2] is layer  # a module argument is the model, shared
    assert args[0] is not x and torch.equal(args[0], x) and args[0].stride() == x.stride()
    assert args[1] == 3
    assert kwargs["cache"] is not cache and isinstance(kwargs["cache"], _Cache)
    assert kwargs["lock"] is lock  # not copyable: passed as it is
    assert kwargs["mask"]["m"] is not sample.kwargs["mask"]["m"]


def test_perturbed_copies_shuffle_floats_only_and_keep_values_and_strides():
    x = torch.arange(24.0).reshape(2, 3, 2, 2).to(memory_format=torch.channels_last)
    sample = Sample(args=(x, torch.tensor([1.0, float("-inf"), 3.0]), torch.tensor([4, 5])))
    args, _ = copy_inputs(sample, None, perturb=True)
    assert not torch.equal(args[0], x) and args[0].stride() == x.stride()
    assert torch.equal(args[0].reshape(-1).sort().values, x.reshape(-1).sort().values)  # the same values
    assert sorted(args[1].tolist()) == sorted(sample.args[1].tolist())
    assert torch.equal(args[2], sample.args[2])  # integers untouched
    again, _ = copy_inputs(sample, None, perturb=True)
    assert torch.equal(again[0], args[0])  # deterministic
    assert torch.equal(sample.args[0], x)  # the sample keeps its values
    assert has_floating_tensors(sample) and not has_floating_tensors(Sample(args=(torch.tensor([1]),)))


def test_an_unchanged_call_passes_and_the_sample_is_never_touched():
    sample = _sample()
    inputs = PrivateInputs(sample, None)
    assert inputs.check("backend") == []
    inputs.args[0].add_(1)  # what a mutating backend does: only the private copy changes
    assert torch.equal(sample.args[0], torch.arange(6.0).reshape(2, 3))
    with pytest.raises(ValidationError, match=r"mutates its inputs \(args\[0\] changed in place \(6/6 elements\)\)"):
        inputs.check("backend")


def test_changes_to_argument_objects_are_seen_and_written_tensors_returned():
    sample = _sample(cache=_Cache(), extra={"a": torch.ones(1)})
    inputs = PrivateInputs(sample, None)
    written = torch.zeros(2)
    inputs.kwargs["cache"].keys.append(written)
    del inputs.kwargs["extra"]["a"]
    changes, found = inputs.changes()
    assert changes == ["kwargs['cache'].keys[0] was added", "kwargs['extra']['a'] was removed"]
    assert found == [("kwargs['cache'].keys[0]", written)]
    with pytest.raises(ValidationError, match="was added"):
        inputs.check("backend")


def test_a_module_that_mutates_its_inputs_allows_the_backend_to():
    sample = _sample(cache=_Cache())
    sample.mutates_inputs = True  # set by the recorder when the original module changed its inputs
    inputs = PrivateInputs(sample, None)
    inputs.args[0].zero_()
    new = torch.ones(3)
    inputs.kwargs["cache"].keys.append(new)
    assert inputs.check("backend") == [("kwargs['cache'].keys[0]", new)]
