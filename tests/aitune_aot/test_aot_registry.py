"""Wrapper names: sanitized, unique, weakly held."""

import gc

from aitune_aot.registry import ModuleRegistry, default_name, sanitize_name


class _Thing:
    pass


def test_sanitize_name():
    assert sanitize_name("my model/v1 (fp16)") == "my_model_v1_fp16"
    assert sanitize_name("  ") is None
    assert sanitize_name(None) is None
    assert sanitize_name("../etc") == "_etc"  # no hidden folders, no parent references
    assert default_name(_Thing()) == "_Thing"


def test_names_are_unique_and_weakly_held():
    registry = ModuleRegistry()
    a, b, c = _Thing(), _Thing(), _Thing()
    assert registry.register("m", a, explicit=True) == "m"
    assert registry.register("m", b, explicit=True) == "m_1"
    assert registry.register("m", c, explicit=False) == "m_2"
    assert registry.register("m", a, explicit=True) == "m"  # re-registering the same object keeps its name
    assert registry.modules() == [a, b, c]
    del b
    gc.collect()
    assert registry.names() == ["m", "m_2"]
    assert registry.register("m", _keep := _Thing(), explicit=True) == "m_1"  # freed names are reused
    assert registry.get("m_1") is _keep


def test_a_dropped_wrapper_gives_its_name_back_before_the_garbage_collector_runs():
    import torch

    from aitune_aot.module import Module

    gc.collect()
    gc.disable()  # the wrapper <-> routed forward cycle is then freed only by the registry's own collection
    try:
        first = Module(torch.nn.Linear(2, 2), "reused")
        assert first.name == "reused"
        del first
        second = Module(torch.nn.Linear(2, 2), "reused")
        assert second.name == "reused"
        third = Module(torch.nn.Linear(2, 2), "reused")  # a live holder still forces a suffix
        assert third.name == "reused_1"
    finally:
        gc.enable()
