import torch

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
