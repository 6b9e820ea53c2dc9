import json
import os
import subprocess
import sys

import pytest
import torch
from core_fakes import FakeConfig, GoodBackend, TinyMLP, record

from aitune_core.backends.backend import BackendState
from aitune_core.backends.torch_inductor import TorchInductorBackendConfig
from aitune_core.errors import BackendBuildError, BackendStateError


@pytest.fixture
def graph():
    model = TinyMLP().eval()
    spec, data = record(model)
    return model, spec, data


def _built(graph, tmp_path):
    model, spec, data = graph
    return GoodBackend().build(model, spec, data, torch.device("cpu"), tmp_path)


def _loaded(graph, tmp_path):
    backend = _built(graph, tmp_path)
    return GoodBackend.from_dict(graph[0], backend.to_dict())


def _deployed(graph, tmp_path):
    backend = _loaded(graph, tmp_path)
    backend.deploy("cpu")
    return backend


def _inactive(graph, tmp_path):
    backend = _built(graph, tmp_path)
    backend.deactivate()
    return backend


# ------------------------------------------------------------------------- legal transitions
def test_legal_lifecycle(graph, tmp_path):
    model, spec, data = graph
    backend = GoodBackend()
    assert backend.state is BackendState.INIT and not backend.is_active
    backend.build(model, spec, data, torch.device("cpu"), tmp_path)
    assert backend.state is BackendState.ACTIVE and backend.is_active
    x = torch.randn(3, 8)
    assert torch.equal(backend.infer(x), model(x))
    backend.deactivate()
    assert backend.state is BackendState.INACTIVE
    backend.activate()
    assert backend.state is BackendState.ACTIVE
    backend.activate()  # activating an active backend is a no-op
    state = backend.to_dict()
    assert state["type"] == "GoodBackend"
    loaded = GoodBackend.from_dict(model, state)
    assert loaded.state is BackendState.CHECKPOINT_LOADED
    loaded.activate()
    assert loaded.state is BackendState.ACTIVE
    deployed = GoodBackend.from_dict(model, state)
    deployed.deploy("cpu")
    assert deployed.state is BackendState.DEPLOYED and deployed.is_active


# ------------------------------------------------------------------------- illegal transitions
ILLEGAL = [
    # (factory, operation, state name that must appear in the message)
    ("init", "activate", "INIT"),
    ("init", "deactivate", "INIT"),
    ("init", "deploy", "INIT"),
    ("init", "infer", "INIT"),
    ("init", "to_dict", "INIT"),
    ("active", "build", "ACTIVE"),
    ("active", "deploy", "ACTIVE"),
    ("active", "blueprint_copy", "ACTIVE"),
    ("inactive", "build", "INACTIVE"),
    ("inactive", "deploy", "INACTIVE"),
    ("inactive", "infer", "INACTIVE"),
    ("loaded", "build", "CHECKPOINT_LOADED"),
    ("loaded", "deactivate", "CHECKPOINT_LOADED"),
    ("loaded", "infer", "CHECKPOINT_LOADED"),
    ("deployed", "build", "DEPLOYED"),
    ("deployed", "activate", "DEPLOYED"),
    ("deployed", "deactivate", "DEPLOYED"),
    ("deployed", "deploy", "DEPLOYED"),
]


@pytest.mark.parametrize(("state", "operation", "name"), ILLEGAL)
def test_illegal_transitions_name_the_state(graph, tmp_path, state, operation, name):
    factories = {
        "init": lambda: GoodBackend(),
        "active": lambda: _built(graph, tmp_path),
        "inactive": lambda: _inactive(graph, tmp_path),
        "loaded": lambda: _loaded(graph, tmp_path),
        "deployed": lambda: _deployed(graph, tmp_path),
    }
    backend = factories[state]()
    model, spec, data = graph
    calls = {
        "activate": backend.activate,
        "deactivate": backend.deactivate,
        "deploy": lambda: backend.deploy("cpu"),
        "infer": lambda: backend.infer(torch.randn(2, 8)),
        "to_dict": backend.to_dict,
        "build": lambda: backend.build(model, spec, data, torch.device("cpu"), tmp_path),
        "blueprint_copy": backend.blueprint_copy,
    }
    with pytest.raises(BackendStateError, match=name):
        calls[operation]()


def test_build_wraps_library_errors(graph, tmp_path):
    from core_fakes import BuildFailsBackend

    model, spec, data = graph
    with pytest.raises(BackendBuildError, match="compiler exploded") as info:
        BuildFailsBackend().build(model, spec, data, torch.device("cpu"), tmp_path)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_blueprint_copy_is_independent():
    blueprint = GoodBackend(FakeConfig(tag="x"))
    copy = blueprint.blueprint_copy()
    assert copy is not blueprint and copy.config == blueprint.config and copy.state is BackendState.INIT


def test_config_type_is_checked():
    with pytest.raises(TypeError, match="FakeConfig"):
        GoodBackend(TorchInductorBackendConfig())


# ------------------------------------------------------------------------- config describe / key
def test_describe_lists_changed_fields_only():
    assert GoodBackend().describe() == "GoodBackend()"
    assert GoodBackend(FakeConfig(tag="a")).describe() == "GoodBackend(tag='a')"
    assert FakeConfig(delay_s=0.5, tag="b").describe() == "delay_s=0.5,tag='b'"


def test_key_depends_on_config_and_class():
    assert FakeConfig().key() == FakeConfig().key()
    assert FakeConfig(tag="a").key() != FakeConfig(tag="b").key()
    assert GoodBackend().key().startswith("GoodBackend_")


_KEY_SCRIPT = """
import json, torch
from aitune_core.backends.torch_inductor import TorchInductorBackendConfig
configs = [
    TorchInductorBackendConfig(),
    TorchInductorBackendConfig(mode="max-autotune", fullgraph=True),
    TorchInductorBackendConfig(options={"max_autotune": True, "triton": {"cudagraphs": False, "max_tiles": 2}}),
    TorchInductorBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16),
]
print(json.dumps([c.key() for c in configs]))
"""


def test_key_is_stable_across_processes():
    runs = [
        json.loads(subprocess.run([sys.executable, "-c", _KEY_SCRIPT], capture_output=True, text=True,
                                  check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout)
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1]
    assert len(set(runs[0])) == 4
