import dataclasses
import threading
from collections import UserDict

import pytest
import torch

from aitune_core.config import config
from aitune_core.context import BATCH_SIZE_KEY, global_context
from aitune_core.recording.graph_recorder import GraphRecorder


class Net(torch.nn.Module):
    def forward(self, x, mask=None, scale=1.0):
        out = x * scale
        return out if mask is None else out * mask


class Encoding(UserDict):
    pass


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    extra: tuple


def _record(recorder, model, *args, batch_size=None, **kwargs):
    return recorder.record(args, kwargs, model(*args, **kwargs), batch_size=batch_size)


def test_positional_and_keyword_calls_share_a_graph():
    net = Net()
    rec = GraphRecorder(net)
    x, m = torch.randn(2, 3), torch.ones(2, 3)
    a = _record(rec, net, x, m)
    b = _record(rec, net, x=x, mask=m)
    c = _record(rec, net, x, mask=m)
    assert a.name == b.name == c.name == "0"
    assert len(rec.graph_specs) == 1 and rec.num_samples("0") == 3


def test_graph_identity_rules():
    net = Net()
    rec = GraphRecorder(net)
    g0 = _record(rec, net, torch.randn(1, 10))
    assert _record(rec, net, torch.randn(4, 20)).name == g0.name  # same rank, other sizes
    assert _record(rec, net, torch.randn(1, 10), mask=torch.ones(1, 10)).name == "1"  # other arguments
    assert _record(rec, net, torch.randn(1, 10, 5)).name == "2"  # other rank
    assert _record(rec, net, torch.randn(1, 10, dtype=torch.float64)).name == "3"  # other dtype
    assert [s.name for s in rec.graph_specs] == ["0", "1", "2", "3"]
    assert rec.total_calls == 5


def test_strict_and_non_strict_constants():
    net = Net()
    strict = GraphRecorder(net)
    assert strict.strict is True  # config default
    _record(strict, net, torch.randn(1, 4), scale=True)
    _record(strict, net, torch.randn(1, 4), scale=False)
    assert len(strict.graph_specs) == 2

    with config.override(strict_mode=False):
        loose = GraphRecorder(net)
    _record(loose, net, torch.randn(1, 4), scale=2.0)
    _record(loose, net, torch.randn(1, 4), scale=3.0)
    assert len(loose.graph_specs) == 1
    # a tensor in place of a constant is a different structure even in non-strict mode
    _record(loose, net, torch.randn(1, 4), scale=torch.tensor(2.0))
    assert len(loose.graph_specs) == 2


def test_a_call_differing_only_in_int_or_float_values_joins_the_graph_as_free_scalars():
    """A hand-written diffusion loop passes its step as a Python int: one graph, not one per step."""
    net = Net()
    rec = GraphRecorder(net)
    first = _record(rec, net, torch.randn(2, 4), scale=999)
    assert first.free_scalars() == []
    spec = _record(rec, net, torch.randn(3, 4), scale=979)
    assert spec.name == "0" and spec.free_scalars() == ["scale"]
    assert len(rec.graph_specs) == 1 and rec.num_samples("0") == 2
    assert [s.kwargs["scale"] for s in rec.samples("0")] == [999, 979]  # each sample keeps its own value
    assert rec.graph_specs[0].accepts((torch.randn(2, 4),), {"scale": 5})  # any int, once free
    assert not rec.graph_specs[0].accepts((torch.randn(2, 4),), {"scale": 5.0})  # not another type
    assert rec.recorded_at_least((torch.randn(2, 4),), {"scale": 7}, 2)
    # a float, a bool or a string value is another graph (bools and strings pick code paths)
    assert _record(rec, net, torch.randn(2, 4), scale=0.5).name == "1"
    assert _record(rec, net, torch.randn(2, 4), scale=True).name == "2"
    assert _record(rec, net, torch.randn(2, 4), scale=False).name == "3"
    assert _record(rec, net, torch.randn(2, 4), scale=0.25).name == "1"
    assert rec.graph_spec("1").free_scalars() == ["scale"]
    assert rec.graph_spec("2").free_scalars() == []


def test_with_free_scalars_off_every_value_is_a_graph_of_its_own():
    net = Net()
    with config.override(free_scalars=False):
        rec = GraphRecorder(net)
    assert config.free_scalars is True  # (read when the recorder was made)
    for step in (10, 20, 10):
        _record(rec, net, torch.randn(2, 4), scale=step)
    assert [s.name for s in rec.graph_specs] == ["0", "1"] and rec.num_samples("0") == 2
    assert not rec.graph_specs[0].accepts((torch.randn(2, 4),), {"scale": 30})


def test_free_scalars_survive_json_and_never_match_a_flat_export():
    from aitune_core.backends.onnx_export import check_flat_graph
    from aitune_core.errors import BackendBuildError
    from aitune_core.specs.graph_spec import GraphSpec

    net = Net()
    rec = GraphRecorder(net)
    for step in (10, 20, 30):
        _record(rec, net, torch.randn(2, 4), scale=step)
    spec = rec.graph_spec("0")
    again = GraphSpec.from_dict(spec.to_dict())
    assert again.free_scalars() == ["scale"] and again.accepts((torch.randn(2, 4),), {"scale": 40})
    assert spec.to_dict() == again.to_dict()  # the decision key does not hold the first value
    with pytest.raises(BackendBuildError, match="scale change between calls"):
        check_flat_graph(spec, rec.samples("0"))


def test_graphs_beyond_max_graphs_are_not_recorded(caplog):
    """A constant that changes on every call (strict mode) must not grow memory without bound."""
    net = Net()
    with config.override(max_num_graphs=3):
        recorder = GraphRecorder(net, name="net")
    caplog.set_level("WARNING", logger="aitune")
    for i in range(10):
        x = torch.randn(1, 4)
        spec = recorder.record((x,), {"scale": f"request-{i}"}, net(x, scale=1.0))
        assert (spec is None) == (i >= 3)
    assert len(recorder.graph_specs) == 3 and recorder.graphs_refused == 7
    assert caplog.text.count("already 3 graphs recorded") == 1
    assert "strict_mode = False" in caplog.text
    x = torch.randn(2, 4)  # a call of a known graph is still recorded
    assert recorder.record((x,), {"scale": "request-1"}, net(x, scale=1.0)).name == "1"
    with pytest.raises(ValueError, match="max_graphs"):
        GraphRecorder(net, max_graphs=0)


def test_seed_axis_example_through_global_context():
    net = Net()
    rec = GraphRecorder(net)
    for batch, length in ((1, 10), (2, 50)):
        with global_context:
            global_context.set(BATCH_SIZE_KEY, batch)
            x = torch.randn(batch, length, 512)
            spec = rec.record((x,), {}, net(x))
    assert spec.input_spec.tensors[0].shape == ("batch0", "dim1", 512)
    assert spec.input_spec.tensors[0].min_shape == (1, 10, 512)
    assert spec.input_spec.tensors[0].max_shape == (2, 50, 512)
    assert spec.output_spec.tensors[0].shape == ("batch0", "dim1", 512)
    assert [s.batch_size for s in rec.samples(spec)] == [1, 2]


def test_single_observation_is_static():
    net = Net()
    rec = GraphRecorder(net)
    spec = _record(rec, net, torch.randn(3, 7), batch_size=3)
    assert spec.input_spec.tensors[0].shape == (3, 7)
    assert spec.non_static_axes() == {}


def test_jit_lockstep_heuristic_names_batch_axis():
    def two_inputs(ids, mask):
        return ids.float() * mask

    rec = GraphRecorder(two_inputs)
    for batch, length in ((1, 8), (3, 8), (2, 5)):
        ids, mask = torch.ones(batch, length, dtype=torch.long), torch.ones(batch, length)
        spec = rec.record((ids, mask), {}, two_inputs(ids, mask))
    assert [t.shape for t in spec.input_spec.tensors] == [("batch0", "dim1"), ("batch0", "dim1")]
    assert spec.output_spec.tensors[0].shape == ("batch0", "dim1")
    assert spec.non_static_axes() == {"ids": [0, 1], "mask": [0, 1]}

    # inputs whose leading axes disagree: no implied batch, the varying axis is dynamic
    rec = GraphRecorder(two_inputs)
    for a, b in ((1, 2), (3, 4)):
        ids, mask = torch.ones(a, 1), torch.ones(b, 1)
        spec = rec.record((ids, mask), {}, None)
    assert [t.shape for t in spec.input_spec.tensors] == [("dim0", 1), ("dim0", 1)]


def test_nested_inputs_and_outputs():
    def model(enc, cfg=None):
        return Out(logits=enc["input_ids"].float() * 2, extra=(enc["attention_mask"], None))

    rec = GraphRecorder(model)
    for batch in (1, 2):
        enc = Encoding({"input_ids": torch.ones(batch, 4, dtype=torch.long), "attention_mask": torch.ones(batch, 4)})
        spec = rec.record((enc,), {}, model(enc), batch_size=batch)
    assert [t.locator for t in spec.input_spec.tensors] == ["['enc']['input_ids']", "['enc']['attention_mask']"]
    assert spec.input_spec.names == ["enc_input_ids", "enc_attention_mask"]
    assert [t.locator for t in spec.output_spec.tensors] == [".logits", ".extra[0]"]
    assert spec.output_spec.names == ["outputs_logits", "outputs_extra_0"]
    assert spec.output_spec.tensors[0].shape == ("batch0", 4)
    sample = rec.samples(spec)[0]
    assert isinstance(sample.args[0], Encoding) and isinstance(sample.output, Out)
    assert spec.accepts((Encoding({"input_ids": torch.ones(2, 4, dtype=torch.long),
                                   "attention_mask": torch.ones(2, 4)}),), {})


def test_samples_are_copies_and_hold_the_original_output():
    net = Net()
    rec = GraphRecorder(net)
    x = torch.ones(2, 2)
    out = net(x, scale=3.0)
    spec = rec.record((x,), {"scale": 3.0}, out)
    x.fill_(-1)
    out.fill_(-1)
    sample = rec.samples(spec)[0]
    assert torch.equal(sample.args[0], torch.ones(2, 2))
    assert torch.equal(sample.output, torch.full((2, 2), 3.0))
    assert sample.kwargs == {"scale": 3.0}


def test_match_finds_graph_in_range():
    net = Net()
    rec = GraphRecorder(net)
    for n in (1, 4):
        _record(rec, net, torch.randn(n, 6))
    _record(rec, net, torch.randn(2, 6), mask=torch.ones(2, 6))
    assert rec.match((torch.randn(3, 6),), {}).name == "0"
    assert rec.match((torch.randn(2, 6),), {"mask": torch.ones(2, 6)}).name == "1"
    assert rec.match((torch.randn(8, 6),), {}) is None
    assert rec.match((torch.randn(3, 6, 1),), {}) is None


def test_output_structure_change_is_tolerated(caplog):
    flip = [False]

    def model(x):
        flip[0] = not flip[0]
        return x if flip[0] else (x, x)

    rec = GraphRecorder(model)
    for _ in range(3):
        x = torch.ones(2)
        rec.record((x,), {}, model(x))
    assert len(rec.graph_specs) == 1
    assert "output structure changed" in caplog.text


def test_unknown_graph_lookup_raises():
    with pytest.raises(KeyError):
        GraphRecorder(Net()).samples("0")


def test_thread_safety_smoke():
    net = Net()
    rec = GraphRecorder(net, max_samples=4)
    errors = []

    def worker(seed):
        try:
            gen = torch.Generator().manual_seed(seed)
            for i in range(200):
                n = int(torch.randint(1, 9, (1,), generator=gen))
                x = torch.randn(n, 3, generator=gen)
                if i % 2:
                    rec.record((x,), {}, net(x))
                else:
                    rec.record((x,), {"mask": torch.ones(n, 3)}, net(x, torch.ones(n, 3)))
                rec.match((x,), {})
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert rec.total_calls == 800
    assert sorted(s.name for s in rec.graph_specs) == ["0", "1"]
    assert sum(rec.num_samples(s) for s in rec.graph_specs) == 800
    assert all(len(rec.samples(s)) == 4 for s in rec.graph_specs)
    for spec in rec.graph_specs:
        assert spec.input_spec.tensors[0].min_shape[0] == 1
        assert spec.input_spec.tensors[0].max_shape[0] == 8


def test_recorded_at_least_counts_the_calls_of_the_graph_a_call_belongs_to():
    net = Net()
    rec = GraphRecorder(net)
    x = torch.randn(2, 3)
    assert not rec.recorded_at_least((x,), {}, 1)
    _record(rec, net, x)
    _record(rec, net, torch.randn(4, 3))  # the same graph at another size
    assert rec.recorded_at_least((torch.randn(8, 3),), {}, 2) and not rec.recorded_at_least((x,), {}, 3)
    assert not rec.recorded_at_least((torch.randn(2, 3, 4),), {}, 1)  # another rank: another graph
    assert not rec.recorded_at_least((x,), {"unknown": 1}, 1)  # a call the signature refuses: not known


def test_a_graph_called_under_inference_mode_says_so_and_keeps_its_identity():
    from aitune_core.specs.graph_spec import GraphSpec

    model = torch.nn.Linear(4, 2).eval()
    recorder = GraphRecorder(model)
    x = torch.randn(2, 4)
    with torch.no_grad():
        plain = recorder.record((x,), {}, model(x))
    assert plain.inference_mode is False
    with torch.inference_mode():
        spec = recorder.record((x,), {}, model(x))
    assert len(recorder.graph_specs) == 1 and spec.name == plain.name and spec.inference_mode
    assert spec.identity() == plain.identity()
    again = GraphSpec.from_dict(spec.to_dict())
    assert again.inference_mode and "inference_mode" not in plain.to_dict()
