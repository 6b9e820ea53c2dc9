"""dynamo_module_call: under aitune's hook dynamo still goes straight to `forward` for a module without hooks."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch._dynamo
from torch._dynamo.symbolic_convert import InstructionTranslatorBase

from aitune_jit import dynamo_module_call, hook

TORCHS = torch.nn.Module.__call__


def _traced_steps(monkeypatch: pytest.MonkeyPatch) -> int:
    """Bytecode instructions dynamo interprets to compile a 20-block MLP (dynamo's caches emptied first: a model
    of the same classes would reuse an earlier compile)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(20)])
    steps = [0]
    original = InstructionTranslatorBase.step

    def counting(self):  # type: ignore[no-untyped-def]
        steps[0] += 1
        return original(self)

    monkeypatch.setattr(InstructionTranslatorBase, "step", counting)
    with torch.no_grad():
        torch.compile(model, backend="eager", fullgraph=True)(torch.randn(2, 8))
    monkeypatch.setattr(InstructionTranslatorBase, "step", original)
    return steps[0]


def test_the_hook_is_dynamos_module_call_while_installed_and_torchs_after() -> None:
    hook.install()
    try:
        assert torch.nn.Module.__call__ is not TORCHS
        assert dynamo_module_call.current() is torch.nn.Module.__call__
    finally:
        hook.uninstall()
    assert dynamo_module_call.current() is TORCHS
    assert torch._dynamo.utils.unpatched_nn_module_call is TORCHS


def test_a_compile_under_the_hook_traces_as_little_as_without_it(monkeypatch) -> None:
    plain = _traced_steps(monkeypatch)
    hook.install()
    try:
        under_hook = _traced_steps(monkeypatch)
        dynamo_module_call.unregister()  # what dynamo did before: the hook and `_call_impl` inlined per call
        unregistered = _traced_steps(monkeypatch)
    finally:
        hook.uninstall()
    assert under_hook <= plain * 1.1
    assert unregistered > under_hook * 2  # (this CPU: 6064 against 1306)


def test_a_dynamo_imported_after_the_hook_gets_the_reference_when_it_is_imported(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, dynamo_module_call.MODULE)
    monkeypatch.setattr(dynamo_module_call, "_waiting", False)
    registered = []
    monkeypatch.setattr(dynamo_module_call.wrapt, "register_post_import_hook",
                        lambda fn, name: registered.append((fn, name)))

    def hook_call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return TORCHS(self, *args, **kwargs)

    try:
        dynamo_module_call.register(hook_call, TORCHS)
        assert registered == [(dynamo_module_call._on_import, dynamo_module_call.MODULE)]
        imported = types.SimpleNamespace(unpatched_nn_module_call=TORCHS)
        registered[0][0](imported)  # what wrapt calls when dynamo's module is imported
        assert imported.unpatched_nn_module_call is hook_call
    finally:
        dynamo_module_call.unregister()
    later = types.SimpleNamespace(unpatched_nn_module_call=hook_call)  # (imported while the hook was on)
    dynamo_module_call._on_import(later)
    assert later.unpatched_nn_module_call is TORCHS
