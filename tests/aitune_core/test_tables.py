import torch

from aitune_core.log import render_to_str
from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.specs.tables import (
    TENSOR_COLUMNS,
    graph_spec_renderable,
    render_graph_spec,
    render_sample_metadata,
)


def _resnet_like_spec():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10))
    recorder = GraphRecorder(lambda x: model(x))
    for batch in (1, 4):
        x = torch.randn(batch, 3, 2, 2)
        recorder.record((x,), {}, model(x), batch_size=batch)
    return recorder.graph_specs[0]


def test_graph_spec_table_has_the_spec_columns_and_values():
    text = render_graph_spec(_resnet_like_spec())
    lines = text.splitlines()
    assert lines[0] == "Name=0"
    assert "Input_spec:" in lines and "Output_spec:" in lines and "Tensors:" in lines
    header = next(line for line in lines if "Locator" in line)
    assert [c.strip() for c in header.strip("│").split("│")] == list(TENSOR_COLUMNS)
    assert "['batch0', 3, 2, 2]" in text
    assert "[1, 3, 2, 2]" in text and "[4, 3, 2, 2]" in text
    assert "['batch0', 10]" in text and "outputs" in text
    assert "torch.float32" in text
    assert lines[lines.index("Tensors:") + 1].startswith("╒")
    assert "\x1b[" not in text


def test_renderable_draws_the_logged_text():
    spec = _resnet_like_spec()
    assert render_to_str(graph_spec_renderable(spec)) == render_graph_spec(spec)
    assert "['x']" in render_sample_metadata(spec.input_spec)


def test_spec_types_hold_data_only():
    """Drawing depends on the data, not the other way round: the types have no table methods."""
    spec = _resnet_like_spec()
    assert not hasattr(spec, "table") and not hasattr(spec, "__rich__")
    assert not hasattr(spec.input_spec, "table") and not hasattr(spec.input_spec, "__rich__")


def test_constants_are_listed():
    recorder = GraphRecorder(lambda x, mode="a": x)
    x = torch.ones(1)
    spec = recorder.record((x,), {"mode": "fast"}, x)
    text = render_graph_spec(spec)
    assert "Constants:" in text and "'fast'" in text
