import torch

from aitune_core.log import render_to_str
from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.specs.tables import TENSOR_COLUMNS


def _resnet_like_spec():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10))
    recorder = GraphRecorder(lambda x: model(x))
    for batch in (1, 4):
        x = torch.randn(batch, 3, 2, 2)
        recorder.record((x,), {}, model(x), batch_size=batch)
    return recorder.graph_specs[0]


def test_graph_spec_table_has_seed_columns_and_values():
    text = _resnet_like_spec().table()
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


def test_rich_protocol_and_str():
    spec = _resnet_like_spec()
    assert str(spec) == spec.table()
    assert render_to_str(spec) == spec.table()
    assert "['x']" in spec.input_spec.table()


def test_constants_are_listed():
    recorder = GraphRecorder(lambda x, mode="a": x)
    x = torch.ones(1)
    spec = recorder.record((x,), {"mode": "fast"}, x)
    text = spec.table()
    assert "Constants:" in text and "'fast'" in text
