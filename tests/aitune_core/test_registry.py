import pytest
from core_fakes import GoodBackend

from aitune_core.backends import registry
from aitune_core.backends.backend import Backend
from aitune_core.backends.registry import backend_class, register_backend, registered_backends


def test_builtin_backends_are_found_by_name():
    from aitune_core.backends.torch_eager import TorchEagerBackend
    from aitune_core.backends.torch_inductor import TorchInductorBackend

    assert backend_class("TorchEagerBackend") is TorchEagerBackend
    assert backend_class("TorchInductorBackend") is TorchInductorBackend
    assert {"TorchEagerBackend", "TorchInductorBackend"} <= set(registered_backends())


def test_any_imported_subclass_is_found():
    assert backend_class("GoodBackend") is GoodBackend
    assert "Backend" not in registered_backends()  # abstract classes are not backends


def test_unknown_name_lists_known_backends():
    with pytest.raises(KeyError) as info:
        backend_class("NoSuchBackend")
    message = str(info.value)
    assert "NoSuchBackend" in message and "TorchEagerBackend" in message and "TorchInductorBackend" in message


def test_explicit_registration_wins(monkeypatch):
    monkeypatch.setattr(registry, "_EXPLICIT", {})

    @register_backend
    class GoodBackend(Backend):  # same name as the fake: the registered one is returned
        def _build(self, module, graph_spec, data, cache_dir):
            pass

        def _infer(self, *args, **kwargs):
            return None

    assert backend_class("GoodBackend") is GoodBackend
    with pytest.raises(TypeError):
        register_backend(int)


def test_round_trip_through_registry(tmp_path):
    import torch
    from core_fakes import TinyMLP, record

    model = TinyMLP().eval()
    spec, data = record(model)
    built = GoodBackend().build(model, spec, data, torch.device("cpu"), tmp_path)
    state = built.to_dict()
    loaded = backend_class(state["type"]).from_dict(model, state)
    loaded.deploy("cpu")
    x = torch.randn(2, 8)
    assert torch.equal(loaded.infer(x), model(x))
