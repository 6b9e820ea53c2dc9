import pytest
import torch

from aitune_core.errors import NotReplayableError
from aitune_core.recording.sample import Sample


def test_capture_detaches_and_clones():
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    kw = {"mask": torch.zeros(2), "n": 3}
    s = Sample.capture((x, [y]), kw, {"out": y}, batch_size=2)
    with torch.no_grad():
        x.add_(1)
    kw["mask"].fill_(7)
    assert torch.equal(s.args[0], torch.ones(2))
    assert torch.equal(s.kwargs["mask"], torch.zeros(2)) and s.kwargs["n"] == 3
    assert not s.args[0].requires_grad and s.args[1][0].grad_fn is None
    assert s.output["out"].grad_fn is None
    assert s.batch_size == 2
    assert isinstance(s.args[1], list)


def test_to_and_run():
    s = Sample((torch.ones(2),), {"b": torch.ones(2)}, output=torch.full((2,), 2.0))
    moved = s.to("cpu")
    assert moved is not s and moved.output.device.type == "cpu"
    assert torch.equal(s.run(lambda a, b: a + b), s.output)
    args, kwargs = s.inputs_to("cpu")
    assert torch.equal(args[0], s.args[0]) and set(kwargs) == {"b"}
    doubled = s.map_tensors(lambda t: t * 2)
    assert torch.equal(doubled.output, torch.full((2,), 4.0))


class _Cache:
    def __init__(self) -> None:
        self.entries = [torch.ones(2)]


class _Uncopyable:
    def __deepcopy__(self, memo):
        raise TypeError("cannot pickle '_thread.lock' object")


def test_capture_owns_copies_of_object_arguments():
    """Replaying a sample must never touch the caller's live objects (a KV cache, a scheduler)."""
    cache = _Cache()
    shared = [cache, cache]
    sample = Sample.capture((torch.zeros(1), shared), {"cache": cache})
    copied = sample.kwargs["cache"]
    assert copied is not cache and isinstance(copied, _Cache)
    assert sample.args[1][0] is copied and sample.args[1][1] is copied  # one memo: sharing is kept
    copied.entries.append(torch.zeros(1))
    assert len(cache.entries) == 1


def test_capture_refuses_an_input_object_that_cannot_be_copied():
    with pytest.raises(NotReplayableError, match="_Uncopyable cannot be copied for replaying"):
        Sample.capture((torch.zeros(1), _Uncopyable()), {})


def test_capture_keeps_an_uncopyable_output_object_by_reference():
    thing = _Uncopyable()
    sample = Sample.capture((torch.zeros(1),), {}, output=(torch.ones(1), thing))
    assert sample.output[1] is thing


def test_capture_shares_modules_and_functions():
    layer = torch.nn.Linear(2, 2)
    sample = Sample.capture((torch.zeros(1, 2),), {"layer": layer, "fn": torch.relu})
    assert sample.kwargs["layer"] is layer and sample.kwargs["fn"] is torch.relu


def test_replay_keeps_the_callers_placement():
    """A CPU timestep passed to a module on an accelerator stays on the CPU when the call is replayed."""
    from aitune_core.recording.sample import replay_device

    cpu = torch.zeros(2)
    assert replay_device(cpu, "cuda") == torch.device("cpu")
    assert replay_device(cpu, None) == torch.device("cpu")
    meta = torch.empty(2, device="meta")  # another device type than the target's: moved
    assert replay_device(meta, "cpu") == torch.device("cpu")
    args, kwargs = Sample.capture((cpu,), {"t": torch.tensor(3)}).inputs_to("cuda")
    assert args[0].device.type == "cpu" and kwargs["t"].device.type == "cpu"


class _KVCache:
    def __init__(self) -> None:
        self.keys = [torch.zeros(1, 0)]


def test_a_stateful_sample_keeps_the_state_before_and_after_and_replays_on_fresh_copies():
    from aitune_core.recording.sample import owned_inputs

    cache = _KVCache()
    x = torch.ones(1, 2)
    before = owned_inputs((x,), {"cache": cache})
    cache.keys[0] = torch.cat([cache.keys[0], x], dim=1)  # what the forward did
    sample = Sample.capture(*before, output=(x * 2, cache), after=((x,), {"cache": cache}))
    assert sample.mutates_inputs
    assert sample.kwargs["cache"].keys[0].shape == (1, 0)  # as the call received it
    after = sample.inputs_after[1]["cache"]
    assert after.keys[0].shape == (1, 2) and after is not cache
    assert sample.output[1] is after  # the returned cache is the argument object, in one copy
    first, second = sample.inputs_to("cpu"), sample.inputs_to("cpu")
    assert first[1]["cache"] is not second[1]["cache"] is not sample.kwargs["cache"]
    first[1]["cache"].keys.append(torch.ones(1))  # a replay changing its copy changes nothing else
    assert len(second[1]["cache"].keys) == len(sample.kwargs["cache"].keys) == 1
    moved = sample.map_tensors(lambda t: t.double())
    assert moved.mutates_inputs and moved.inputs_after is not None


def test_a_plain_sample_replays_on_its_own_objects():
    sample = Sample.capture((torch.ones(2),), {"cache": _KVCache()})
    assert not sample.mutates_inputs and sample.inputs_after is None
    assert sample.inputs_to("cpu")[1]["cache"] is sample.kwargs["cache"]
