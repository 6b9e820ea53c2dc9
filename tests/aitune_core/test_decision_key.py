"""Decision keys: equal for identical modules (weights aside), different for anything that changes the decision."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.decision_key import decision_key, graph_structure, module_structure
from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.strategies.first_wins import FirstWinsStrategy


def _spec(module: torch.nn.Module, *shapes: tuple[int, ...]):
    recorder = GraphRecorder(module.forward, name="m")
    with torch.no_grad():
        for shape in shapes:
            x = torch.randn(*shape)
            recorder.record((x,), {}, module(x))
    return recorder.graph_specs[0]


def _key(module: torch.nn.Module, spec=None, strategy=None) -> str:
    spec = spec if spec is not None else _spec(module, (2, 8), (4, 8))
    strategy = strategy if strategy is not None else FirstWinsStrategy([TorchEagerBackend()])
    return decision_key(module, spec, strategy, "cpu")[0]


def test_identical_modules_share_a_key_whatever_their_weights():
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    torch.manual_seed(1)
    b = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    assert not torch.equal(a[0].weight, b[0].weight)
    assert _key(a) == _key(b)


def test_shapes_dtypes_graph_and_candidates_change_the_key():
    base = torch.nn.Linear(8, 8)
    assert _key(base) != _key(torch.nn.Linear(8, 4))  # another parameter shape
    assert _key(base) != _key(torch.nn.Linear(8, 8).double(), _spec(base, (2, 8), (4, 8)))  # another dtype
    assert _key(base) != _key(base, _spec(base, (2, 8), (2, 8)))  # another graph (static batch)
    other = FirstWinsStrategy([TorchEagerBackend(), TorchEagerBackend()])
    assert _key(base) != _key(base, strategy=other)


def test_graph_names_do_not_count_and_parts_are_readable():
    module = torch.nn.Linear(8, 8)
    spec = _spec(module, (2, 8))
    assert "name" not in graph_structure(spec)
    structure = module_structure(module)
    assert structure["class"] == "torch.nn.modules.linear.Linear"
    expected = [["weight", [8, 8], "torch.float32", "cpu"], ["bias", [8], "torch.float32", "cpu"]]
    assert structure["parameters"] == expected
    key, parts = decision_key(module, spec, FirstWinsStrategy([TorchEagerBackend()]), "cpu")
    assert len(key) == 64 and parts["environment"]["torch"] == torch.__version__


def test_keys_are_stable_across_processes():
    here = str(Path(__file__).parent)
    code = (
        f"import torch, sys; sys.path.insert(0, {here!r}); import test_decision_key as t; torch.manual_seed(5);"
        "print(t._key(torch.nn.Linear(8, 8)))"
    )
    out = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
           for _ in range(2)]
    assert out[0] == out[1] == _key(torch.nn.Linear(8, 8))


def test_strategy_thresholds_are_part_of_the_key():
    from aitune_core.strategies.highest_throughput import HighestThroughputStrategy

    module = torch.nn.Linear(8, 8)
    spec = _spec(module, (2, 8))
    strict = HighestThroughputStrategy([TorchEagerBackend()], min_speedup=1.5)
    lenient = HighestThroughputStrategy([TorchEagerBackend()], min_speedup=1.0)
    assert _key(module, spec, strict) != _key(module, spec, lenient)


def test_a_graph_called_under_autocast_has_a_key_of_its_own():
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    plain = _spec(module, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = _spec(module, (2, 8))
    assert cast.autocast and not plain.autocast
    assert _key(module, plain) != _key(module, cast)
