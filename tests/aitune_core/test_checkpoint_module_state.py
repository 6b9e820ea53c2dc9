"""Module entries of a checkpoint: weights, graph specs, backends, and the "same model" check."""

import pytest
import torch

from aitune_core.backends.backend import BackendState
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.checkpoint.manifest import CheckpointReader, CheckpointWriter
from aitune_core.checkpoint.module_state import check_module, load_backends, load_weights, save_module
from aitune_core.errors import CheckpointError
from aitune_core.recording.graph_recorder import GraphRecorder


def _tuned(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    recorder = GraphRecorder(module.forward)
    for bs in (1, 2):
        x = torch.randn(bs, 4)
        recorder.record((x,), {}, module(x), batch_size=bs)
    (spec,) = recorder.graph_specs
    backend = TorchEagerBackend().build(module, spec, recorder.samples(spec), torch.device("cpu"), tmp_path)
    return module, spec, backend


def _save(tmp_path, module, spec, backend):
    with CheckpointWriter(tmp_path / "ckpt") as writer:
        entry = save_module(writer, name="m", module=module, graphs=[(spec, backend)], folder="modules/m", path="x")
        writer.commit({"modules": [entry]})
    reader = CheckpointReader(tmp_path / "ckpt")
    reader.verify()
    return reader, reader.manifest["modules"][0]


def test_save_and_restore_weights_specs_and_backends(tmp_path):
    module, spec, backend = _tuned(tmp_path)
    reader, entry = _save(tmp_path, module, spec, backend)
    assert entry["class"] == "Sequential" and entry["path"] == "x"
    assert entry["parameters"]["0.weight"] == {"shape": [3, 4], "dtype": "torch.float32"}
    assert entry["graphs"][0]["backend"]["type"] == "TorchEagerBackend"

    torch.manual_seed(1)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    check_module(entry, fresh)
    load_weights(reader, entry, fresh)
    assert torch.equal(fresh[0].weight, module[0].weight)
    ((loaded_spec, loaded),) = load_backends(reader, entry, fresh)
    assert loaded_spec.to_dict() == spec.to_dict()
    assert loaded.state is BackendState.CHECKPOINT_LOADED
    loaded.deploy("cpu")
    x = torch.randn(2, 4)
    assert torch.equal(loaded(x), module(x))


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (
            torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU()),
            r"different shape/dtype: 0.bias: saved \[3\].*0.weight: saved \[3, 4\] torch.float32, model \[5, 4\]",
        ),
        (torch.nn.Sequential(torch.nn.Linear(4, 3, bias=False), torch.nn.ReLU()), r"missing in the model: 0.bias"),
        (torch.nn.Linear(4, 3), r"saved from a Sequential, but the model has a Linear"),
    ],
)
def test_a_different_model_is_rejected(tmp_path, other, match):
    _, entry = _save(tmp_path, *_tuned(tmp_path))
    with pytest.raises(CheckpointError, match=match):
        check_module(entry, other)


def test_a_malformed_entry_is_reported_as_corrupt(tmp_path):
    module, spec, backend = _tuned(tmp_path)
    _, entry = _save(tmp_path, module, spec, backend)
    del entry["weights"]
    entry["graphs"] = None
    with pytest.raises(CheckpointError, match="corrupt: module 'm' lacks valid weights, graphs"):
        check_module(entry, module)
