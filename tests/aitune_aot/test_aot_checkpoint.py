"""aitune.torch.save / load: restore a tuned model in a fresh process without tuning; refuse bad checkpoints."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from aot_models import MLP, CountingBackend, ExportedProgramBackend, build

from aitune_aot.checkpoint_io import find_modules, load, save
from aitune_aot.module import Module, ModuleState
from aitune_aot.tune import tune
from aitune_core.backends.backend import BackendState
from aitune_core.errors import CheckpointError
from aitune_core.strategies.first_wins import FirstWinsStrategy

HERE = Path(__file__).parent


def _tuned_pipeline():
    """encoder on the (JIT-type) counting eager backend, head on the exported-program (artifact) backend."""
    model = build()
    model.encoder = Module(model.encoder, "enc", strategy=FirstWinsStrategy([CountingBackend()]))
    model.head = Module(model.head, "head", strategy=FirstWinsStrategy([ExportedProgramBackend()]))
    torch.manual_seed(5)
    tune(model, [torch.randn(8) for _ in range(8)], batch_sizes=[1, 2, 4])
    assert model.encoder.state is ModuleState.TUNED and model.head.state is ModuleState.TUNED
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from aitune_aot.registry import MODULE_REGISTRY

    MODULE_REGISTRY.clear()
    tmp = tmp_path_factory.mktemp("saved")
    from aitune_core.config import config

    with config.override(cache_dir=tmp / "cache"):
        model = _tuned_pipeline()
        save(model, tmp / "ckpt")
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x)
    torch.save({"x": x, "expected": expected}, tmp / "io.pt")
    MODULE_REGISTRY.clear()
    return tmp / "ckpt", tmp / "io.pt"


def test_manifest_layout(saved):
    ckpt, _ = saved
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["kind"] == "aot" and manifest["versions"]["torch"] == torch.__version__
    enc, head = manifest["modules"]
    assert (enc["name"], enc["path"], enc["class"]) == ("enc", "encoder", "MLP")
    assert (head["name"], head["path"], head["class"]) == ("head", "head", "Sequential")
    assert enc["graph_specs"][0]["input_spec"]["tensors"][0]["shape"] == ["batch0", 8]
    assert enc["graphs"][0]["backend"]["type"] == "CountingBackend"
    backend = head["graphs"][0]["backend"]
    assert backend["type"] == "ExportedProgramBackend" and backend["key"].startswith("ExportedProgramBackend_")
    (artifact,) = backend["artifacts"]
    assert artifact["path"] == "modules/head/graphs/0/artifacts/program.pt2" and len(artifact["sha256"]) == 64
    assert backend["state"]["program"] == {"__aitune_artifact__": artifact["path"]}
    (part,) = manifest["model"]["parts"]  # the whole model's state: a fresh instance computes the same
    assert (part["path"], part["class"], part["weights"]) == ("", "Pipeline", "model/0.pt")
    assert set(manifest["files"]) == {
        "model/0.pt",
        "modules/enc/weights.pt",
        "modules/head/weights.pt",
        "modules/head/graphs/0/artifacts/program.pt2",
    }


_CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    import aitune.torch as ait
    from aitune_core.backends.backend import Backend
    from aitune_core.strategies.strategy import TuneStrategy
    from aot_models import CountingBackend, ExportedProgramBackend, build

    def forbidden(*args, **kwargs):
        raise AssertionError("tuning or building happened during load")

    TuneStrategy.tune = TuneStrategy.tune_with_report = TuneStrategy.run = forbidden
    Backend.build = forbidden

    ckpt, io = sys.argv[1], sys.argv[2]
    data = torch.load(io)
    results = {}
    for scenario in ("wrap", "no-wrap"):
        model = build(seed=1)  # different weights: the checkpoint must restore them
        if scenario == "wrap":
            model.encoder = ait.Module(model.encoder, "enc")
            model.head = ait.Module(model.head, "head")
        loads, calls = ExportedProgramBackend.loads, CountingBackend.infers
        ait.load(model, ckpt)
        with torch.no_grad():
            out = model(data["x"])
        results[scenario] = {
            "max_abs_diff": (out - data["expected"]).abs().max().item(),
            "states": [model.encoder.state.value, model.head.state.value],
            "backends": [b.state.value for m in (model.encoder, model.head) for _, b in m.backends],
            "encoder_backend_calls": CountingBackend.infers - calls,
            "program_loads": ExportedProgramBackend.loads - loads,
            "wrapped": [type(model.encoder).__name__, type(model.head).__name__],
        }
    print(json.dumps(results))
    """
)


def test_load_in_a_fresh_process_restores_without_tuning(saved, tmp_path):
    """The child forbids every strategy and backend build, loads into differently seeded models (wrapped by
    the user, or not wrapped at all) and must reproduce the parent's outputs through the restored backends."""
    ckpt, io = saved
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ckpt), str(io)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == {"wrap", "no-wrap"}
    for result in results.values():
        assert result["max_abs_diff"] < 1e-5
        assert result["states"] == ["tuned", "tuned"]
        assert result["backends"] == ["deployed", "deployed"]
        assert result["encoder_backend_calls"] == 1  # the restored backend served the call
        assert result["program_loads"] == 1  # the head's program came from the checkpoint's artifact
        assert result["wrapped"] == ["Module", "Module"]


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _fresh_wrapped(seed=1):
    model = build(seed=seed)
    model.encoder = Module(model.encoder, "enc")
    model.head = Module(model.head, "head")
    return model


def test_corrupt_or_missing_manifest(saved, tmp_path):
    ckpt = _copy(saved[0], tmp_path / "ckpt")
    model = _fresh_wrapped()
    (ckpt / "manifest.json").write_text('{"format": "aitune-checkpoint", "format_version": 1, "files": ')
    with pytest.raises(CheckpointError, match="corrupt"):
        load(model, ckpt)
    (ckpt / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"manifest\.json is missing"):
        load(model, ckpt)
    assert model.encoder.state is ModuleState.INIT


@pytest.mark.parametrize("victim", ["modules/head/graphs/0/artifacts/program.pt2", "modules/enc/weights.pt"])
def test_tampered_file_is_rejected_before_anything_is_loaded(saved, tmp_path, victim):
    ckpt = _copy(saved[0], tmp_path / "ckpt")
    with open(ckpt / victim, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([last[0] ^ 0xFF]))
    model = _fresh_wrapped()
    weights = model.encoder.fc1.weight.clone()
    with pytest.raises(CheckpointError, match=f"checksum mismatch for {victim}"):
        load(model, ckpt)
    assert torch.equal(model.encoder.fc1.weight, weights)  # untouched
    assert model.encoder.state is ModuleState.INIT and model.head.state is ModuleState.INIT


def test_different_model_is_rejected(saved):
    ckpt, _ = saved
    other = build()
    other.encoder = Module(MLP(8, 32, 6), "enc")  # another hidden size
    other.head = Module(other.head, "head")
    with pytest.raises(CheckpointError, match=r"'enc' does not match the model.*fc1.weight: saved \[16, 8\]"):
        load(other, ckpt)
    renamed = build()
    renamed.encoder = Module(renamed.encoder, "encoder_v2")
    with pytest.raises(
        CheckpointError, match=r"modules \['enc', 'head'\] of the checkpoint were not found.*Modules \['encoder_v2'\]"
    ):
        load(torch.nn.ModuleDict({"x": renamed.encoder}), ckpt)
    wrong_class = build()
    wrong_class.encoder = Module(torch.nn.Linear(8, 6), "enc")
    with pytest.raises(CheckpointError, match="saved from a MLP, but the model has a Linear"):
        load(wrong_class, ckpt)


def test_unknown_backend_type(saved, tmp_path):
    ckpt = _copy(saved[0], tmp_path / "ckpt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["modules"][0]["graphs"][0]["backend"]["type"] = "WarpDriveBackend"
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"unknown backend.*WarpDriveBackend"):
        load(_fresh_wrapped(), ckpt)


def test_same_process_roundtrip_and_resave(saved, tmp_path):
    ckpt, io = saved
    model = _fresh_wrapped()
    load(model, ckpt)
    data = torch.load(io)
    with torch.no_grad():
        assert torch.allclose(model(data["x"]), data["expected"], atol=1e-6)
    assert all(b.state is BackendState.DEPLOYED for m in (model.encoder, model.head) for _, b in m.backends)
    save(model, tmp_path / "again")  # a loaded model can be saved again
    again = _fresh_wrapped(seed=2)
    load(again, tmp_path / "again")
    with torch.no_grad():
        assert torch.allclose(again(data["x"]), data["expected"], atol=1e-6)


def test_save_errors_and_overwrite(tmp_path):
    with pytest.raises(CheckpointError, match="no aitune Module"):
        save(build(), tmp_path / "a")
    model = build()
    model.encoder = Module(model.encoder, "enc")
    with pytest.raises(CheckpointError, match="none of the aitune Modules in the model is tuned"):
        save(model, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    tune(model, [torch.randn(8)] * 2, batch_sizes=[1, 2], strategy=FirstWinsStrategy([CountingBackend()]))
    with pytest.raises(CheckpointError, match="not an aitune checkpoint"):
        save(model, tmp_path / "notes")
    save(model, tmp_path / "a")
    save(model, tmp_path / "a")  # overwriting a checkpoint is fine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "cache", "notes"]  # no temporary folders left
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_find_modules_in_modules_and_plain_objects():
    model = build()
    model.encoder = Module(model.encoder, "enc")
    raw_head = model.head
    head = Module(raw_head, "head")  # the model still holds the raw module: found through its routing

    class Pipe:
        def __init__(self):
            self.parts = {"model": model}
            self.torch = torch  # not searched

    assert [(p, m.name) for p, m in find_modules(model)] == [("encoder", "enc"), ("head", "head")]
    found = [(p, m.name) for p, m in find_modules(Pipe())]
    assert found == [("parts.model.encoder", "enc"), ("parts.model.head", "head")]
    assert find_modules(head) == [("", head)]


def test_failed_load_into_an_unwrapped_model_leaves_it_unwrapped(saved):
    ckpt, _ = saved
    model = build()  # never wrapped: load() would wrap `encoder` and `head` at their saved paths
    model.head = torch.nn.Identity()  # ...but the head is not the saved one
    encoder = model.encoder
    with pytest.raises(CheckpointError, match=r"modules \['head'\] of the checkpoint were not found"):
        load(model, ckpt)
    assert model.encoder is encoder and not isinstance(model.encoder, Module)  # nothing was wrapped
    assert find_modules(model) == []


def test_the_rest_of_the_model_must_match_too(tmp_path):
    """save() stores the whole model: a fresh model whose untuned part differs is refused, not half-loaded."""
    model = build()
    model.encoder = Module(model.encoder, "enc", strategy=FirstWinsStrategy([CountingBackend()]))
    tune(model, [torch.randn(8)] * 2, batch_sizes=[1, 2])
    save(model, tmp_path / "ckpt")
    other = build(seed=1)
    other.head = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh())
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"model part '<root>' does not match.*head.0.weight: saved \[5, 6\]"):
        load(other, tmp_path / "ckpt")
    assert all(torch.equal(other.state_dict()[k], v) for k, v in before.items())
    assert find_modules(other) == []


def test_load_returns_the_root_wrapper_for_a_fresh_unwrapped_model(tmp_path):
    model = Module(build(), "net", strategy=FirstWinsStrategy([CountingBackend()]))
    tune(model, [torch.randn(8)] * 2, batch_sizes=[1, 2])
    save(model, tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert manifest["modules"][0]["path"] == "" and manifest["modules"][0]["weights"] == "model/0.pt"  # stored once
    del model
    from aitune_aot.registry import MODULE_REGISTRY

    MODULE_REGISTRY.clear()
    fresh = build(seed=1)
    loaded = load(fresh, tmp_path / "ckpt")
    assert isinstance(loaded, Module) and loaded.__wrapped__ is fresh and loaded.state is ModuleState.TUNED
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), build()(x))  # the saved weights, through the restored backend
    assert load(loaded, tmp_path / "ckpt") is loaded  # loading into the wrapper returns the wrapper
