"""Acceptance: attacks on a checkpoint, and loads that fail half-way, leave the model exactly as it was.

Planted pickles (in every file a load reads), symlinks out of the folder, path traversal, truncated and edited
files, malformed manifests, an unknown backend type, an unavailable device and a backend that fails to deploy:
each load raises CheckpointError, runs no code from the checkpoint, and the model keeps its weights bit for bit,
its wrappers (none, or the tuned ones with their working backends) and its registry names.
"""

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from aot_models import CountingBackend, ExportedProgramBackend, build

from aitune_aot.checkpoint_io import find_modules, load, save
from aitune_aot.load_transaction import TensorSnapshot
from aitune_aot.module import Module, ModuleState
from aitune_aot.registry import MODULE_REGISTRY
from aitune_aot.tune import tune
from aitune_core.backends.backend import BackendState
from aitune_core.errors import CheckpointError
from aitune_core.strategies.first_wins import FirstWinsStrategy

PWNED = Path("/tmp/aitune-pwned-by-checkpoint")


class _Boom:
    """Unpickling it would run a shell command: what a planted pickle does."""

    def __reduce__(self):
        return (os.system, (f"touch {PWNED}",))


def _tuned(seed=0):
    model = build(seed)
    model.encoder = Module(model.encoder, "enc", strategy=FirstWinsStrategy([CountingBackend()]))
    model.head = Module(model.head, "head", strategy=FirstWinsStrategy([ExportedProgramBackend()]))
    torch.manual_seed(5)
    tune(model, [torch.randn(8) for _ in range(4)], batch_sizes=[1, 2])
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from aitune_core.config import config

    tmp = tmp_path_factory.mktemp("ckpt")
    MODULE_REGISTRY.clear()
    with config.override(cache_dir=tmp / "cache"):
        save(_tuned(), tmp / "ckpt")
    MODULE_REGISTRY.clear()
    return tmp / "ckpt"


@pytest.fixture
def ckpt(checkpoint, tmp_path):
    """A private copy to attack."""
    PWNED.unlink(missing_ok=True)
    return Path(shutil.copytree(checkpoint, tmp_path / "ckpt"))


def _manifest(ckpt):
    return json.loads((ckpt / "manifest.json").read_text())


def _write_manifest(ckpt, manifest):
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _rehash(ckpt, rel):
    """Re-index `rel` in the manifest, as a forger who rewrites the unsigned manifest would."""
    manifest = _manifest(ckpt)
    data = (ckpt / rel).read_bytes()
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    _write_manifest(ckpt, manifest)


def _plant_pickle(ckpt, rel):
    (ckpt / rel).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"weight": _Boom()}, ckpt / rel)
    _rehash(ckpt, rel)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_unchanged(model, before, wrapped_names=()):
    after = model.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and after[key].device == value.device, key
        assert torch.equal(after[key], value), key  # bit for bit
    assert sorted(w.name for _, w in find_modules(model)) == sorted(wrapped_names)
    assert sorted(MODULE_REGISTRY.names()) == sorted(wrapped_names)
    assert not PWNED.exists(), "code from the checkpoint ran"


def _load_fails(model, ckpt, match, **kwargs):
    before = _state(model)
    with pytest.raises(CheckpointError, match=match):
        load(model, ckpt, **kwargs)
    return before


# ------------------------------------------------------------------------------------------------ planted pickles
@pytest.mark.parametrize(
    "rel",
    [
        "model/0.pt",  # the whole model's state
        "modules/enc/weights.pt",  # a tuned module's weights
        "modules/head/weights.pt",
    ],
)
def test_planted_pickle_as_weights_is_refused_and_never_runs(ckpt, rel):
    _plant_pickle(ckpt, rel)
    model = build(seed=1)
    before = _load_fails(model, ckpt, "Weights only load failed|Unsupported global")
    _assert_unchanged(model, before)


def test_planted_pickle_as_a_backend_state_file_is_refused(ckpt):
    """TorchEagerBackend (here its counting subclass) writes no state file; a forger adds one."""
    _plant_pickle(ckpt, "modules/enc/graphs/0/state.pt")
    manifest = _manifest(ckpt)
    manifest["modules"][0]["graphs"][0]["backend"]["state_file"] = "modules/enc/graphs/0/state.pt"
    _write_manifest(ckpt, manifest)
    model = build(seed=1)
    before = _load_fails(model, ckpt, r"module 'enc', graph '0'.*Weights only load failed|Unsupported global")
    _assert_unchanged(model, before)


def test_planted_pickle_as_an_artifact_is_never_unpickled(ckpt):
    """The artifact is read only by its backend's own loader (torch.export.load), which refuses it: the load
    fails while deploying, after weights were copied in, and is rolled back."""
    rel = "modules/head/graphs/0/artifacts/program.pt2"
    (ckpt / rel).unlink()
    _plant_pickle(ckpt, rel)
    model = build(seed=1)
    before = _load_fails(model, ckpt, r"module 'head': cannot deploy")
    _assert_unchanged(model, before)


def test_a_pickle_as_manifest_is_corrupt(ckpt):
    torch.save({"x": _Boom()}, ckpt / "manifest.json")
    model = build(seed=1)
    before = _load_fails(model, ckpt, "corrupt")
    _assert_unchanged(model, before)


# ------------------------------------------------------------------------------------------------ paths
def test_symlinked_weights_file_is_refused_even_with_the_right_checksum(ckpt, tmp_path):
    outside = tmp_path / "outside.pt"
    shutil.copy(ckpt / "modules/enc/weights.pt", outside)  # same bytes: the checksum alone would pass
    (ckpt / "modules/enc/weights.pt").unlink()
    (ckpt / "modules/enc/weights.pt").symlink_to(outside)
    model = build(seed=1)
    before = _load_fails(model, ckpt, "symlink")
    _assert_unchanged(model, before)


def test_symlinked_modules_folder_is_refused(ckpt, tmp_path):
    shutil.move(ckpt / "modules", tmp_path / "elsewhere")
    (ckpt / "modules").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    model = build(seed=1)
    before = _load_fails(model, ckpt, "symlink")
    _assert_unchanged(model, before)


@pytest.mark.parametrize(
    ("where", "value", "match"),
    [
        ("files", "../outside.pt", "outside the checkpoint"),
        ("files", "/etc/passwd", "outside the checkpoint"),
        ("weights", "../ckpt/modules/enc/weights.pt", "outside the checkpoint"),
        ("artifact", "modules/../../x", "outside the checkpoint"),
    ],
)
def test_path_traversal_is_refused(ckpt, where, value, match):
    manifest = _manifest(ckpt)
    if where == "files":
        manifest["files"][value] = {"sha256": "0" * 64, "size": 1}
    elif where == "weights":
        manifest["modules"][0]["weights"] = value
    else:
        manifest["modules"][1]["graphs"][0]["backend"]["state"]["program"] = {"__aitune_artifact__": value}
    _write_manifest(ckpt, manifest)
    model = build(seed=1)
    before = _load_fails(model, ckpt, match)
    _assert_unchanged(model, before)


# ------------------------------------------------------------------------------------------------ damaged files
def test_truncated_weights_file_is_refused(ckpt):
    data = (ckpt / "model/0.pt").read_bytes()
    (ckpt / "model/0.pt").write_bytes(data[: len(data) // 2])
    model = build(seed=1)
    before = _load_fails(model, ckpt, "size mismatch for model/0.pt")
    _assert_unchanged(model, before)


def test_edited_weights_file_with_forged_checksum_must_still_fit_the_model(ckpt):
    torch.save({"nothing": torch.zeros(1)}, ckpt / "model/0.pt")
    _rehash(ckpt, "model/0.pt")
    model = build(seed=1)
    before = _load_fails(model, ckpt, "cannot restore weights")
    _assert_unchanged(model, before)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(format_version=0),
        lambda m: m.update(format_version=-1),
        lambda m: m.update(format_version="2"),
        lambda m: m.update(format_version=2.0),
        lambda m: m.update(format_version=True),
        lambda m: m.update(format_version=99),
        lambda m: m.update(modules={"enc": {}}),
        lambda m: m.update(model={"parts": "all"}),
        lambda m: m["modules"][0].update(graphs=None),
        lambda m: m["modules"][0].update(graphs=[None]),
        lambda m: m["modules"][0].update(parameters={"fc1.weight": [16, 8]}),
        lambda m: m["modules"][0].update(path=7),
        lambda m: m["modules"][0].update(graph_specs=[{"name": 1}]),
        lambda m: m["modules"][0]["graphs"][0].update(backend="TorchEagerBackend"),
        lambda m: m["modules"][0]["graphs"][0]["backend"].update(type=None),
        lambda m: m["modules"][0]["graphs"][0]["backend"].update(state={"__aitune_torch__": 5}),
        lambda m: m["modules"][0]["graphs"][0]["backend"].update(state_file=["x"]),
        lambda m: m["files"].update({"model/0.pt": {"sha256": "abc"}}),
    ],
)
def test_malformed_manifest_is_a_checkpoint_error(ckpt, edit):
    manifest = _manifest(ckpt)
    edit(manifest)
    _write_manifest(ckpt, manifest)
    model = build(seed=1)
    before = _load_fails(model, ckpt, "")
    _assert_unchanged(model, before)


def test_unknown_backend_type_leaves_a_tuned_model_tuned_with_its_backends(ckpt):
    """The issue's case: a tuned model given a bad checkpoint must not end "tuned" with no backend."""
    model = _tuned(seed=2)
    manifest = _manifest(ckpt)
    manifest["modules"][1]["graphs"][0]["backend"]["type"] = "WarpDriveBackend"
    _write_manifest(ckpt, manifest)
    backends = [b for m in (model.encoder, model.head) for _, b in m.backends]
    x = torch.randn(2, 8)
    with torch.no_grad():
        expected = model(x)
    before = _load_fails(model, ckpt, r"module 'head', graph '0'.*unknown backend.*WarpDriveBackend")
    _assert_unchanged(model, before, wrapped_names=("enc", "head"))
    assert [b for m in (model.encoder, model.head) for _, b in m.backends] == backends
    assert all(b.state is BackendState.ACTIVE for b in backends)
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def test_unavailable_device_is_refused_before_anything_changes(ckpt):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    model = build(seed=1)
    before = _load_fails(model, ckpt, "device cuda cannot be used: no cuda device is available", device="cuda")
    _assert_unchanged(model, before)


def test_deploy_failure_after_weights_and_device_rolls_everything_back(ckpt, monkeypatch):
    """A backend that fails to deploy, after the model was moved to the device and got the checkpoint's weights:
    same tensor objects, values and devices as before, no wrapper, no registry name."""
    def broken(self):
        raise RuntimeError("engine does not fit")

    monkeypatch.setattr(ExportedProgramBackend, "_activate", broken)
    model = build(seed=1)
    params = dict(model.named_parameters())
    # "meta": a device move that a CPU machine can make (every tensor's data is replaced), then rolled back
    before = _load_fails(model, ckpt, "engine does not fit", device="meta")
    _assert_unchanged(model, before)
    assert all(p is params[name] for name, p in model.named_parameters())
    assert not isinstance(model.encoder, Module) and "forward" not in model.encoder.__dict__


def test_failed_load_into_the_root_leaves_no_root_wrapper(ckpt, monkeypatch):
    monkeypatch.setattr(ExportedProgramBackend, "_activate", lambda self: (_ for _ in ()).throw(OSError("gone")))
    model = build(seed=1)
    before = _load_fails(model, ckpt, "gone")
    _assert_unchanged(model, before)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_successful_load_after_a_failed_one(ckpt, checkpoint):
    model = build(seed=1)
    manifest = _manifest(ckpt)
    manifest["format_version"] = 0
    _write_manifest(ckpt, manifest)
    with pytest.raises(CheckpointError):
        load(model, ckpt)
    loaded = load(model, checkpoint)
    assert loaded is model and model.encoder.state is ModuleState.TUNED and model.head.state is ModuleState.TUNED
    assert sorted(MODULE_REGISTRY.names()) == ["enc", "head"]  # the names as saved, no suffix


def test_tensor_snapshot_restores_objects_values_and_devices():
    model = build(seed=1)
    model.register_buffer("steps", torch.tensor([3]))
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    reference = copy.deepcopy(model.state_dict())
    snapshot = TensorSnapshot([model])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.steps = torch.tensor([9])  # a buffer slot replaced (what Module.to() does)
    model.half()  # dtypes changed in place
    snapshot.restore()
    assert all(p is params[n] for n, p in model.named_parameters())
    assert all(b is buffers[n] for n, b in model.named_buffers())
    for key, value in reference.items():
        assert model.state_dict()[key].dtype == value.dtype and torch.equal(model.state_dict()[key], value)


def test_planted_pickle_as_the_torchao_quantized_state_is_refused(tmp_path):
    quantization = pytest.importorskip("torchao.quantization")
    from aitune_core.backends.torchao import TorchAOBackend, TorchAOBackendConfig

    PWNED.unlink(missing_ok=True)
    model = build()
    config = TorchAOBackendConfig(quantization_config=quantization.Int8WeightOnlyConfig(), compile=False)
    backend = TorchAOBackend(config)
    model.encoder = Module(model.encoder, "enc", strategy=FirstWinsStrategy([backend]))
    tune(model, [torch.randn(8) for _ in range(4)], batch_sizes=[1, 2])
    save(model, tmp_path / "ckpt")
    manifest = _manifest(tmp_path / "ckpt")
    (artifact,) = manifest["modules"][0]["graphs"][0]["backend"]["artifacts"]
    assert manifest["modules"][0]["graphs"][0]["backend"]["state_file"] is None  # the torchao config is JSON
    _plant_pickle(tmp_path / "ckpt", artifact["path"])
    del model, backend
    MODULE_REGISTRY.clear()
    fresh = build(seed=1)
    before = _load_fails(fresh, tmp_path / "ckpt", r"module 'enc': cannot deploy.*Weights only load failed")
    _assert_unchanged(fresh, before)
