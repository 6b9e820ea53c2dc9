"""aitune_jit/torch_call_site.py: a forward called through `call_forward` warns from torch's own line, as when
torch's `Module._call_impl` calls it, and is recorded once where torch's warnings are."""

from __future__ import annotations

import inspect
import warnings

import torch

from aitune_jit import torch_call_site
from aitune_jit.torch_call_site import call_forward


class _Deprecating(torch.nn.Module):
    def forward(self, x: torch.Tensor, old: object = None) -> torch.Tensor:
        if old is not None:
            warnings.warn("`old` is deprecated", FutureWarning, stacklevel=2)
        return x + 1


def _warning_place(call) -> tuple[str, int]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    assert len(caught) == 1
    return caught[0].filename, caught[0].lineno


def test_the_warning_names_the_place_torch_calls_forwards_from():
    net = _Deprecating()
    plain = _warning_place(lambda: net(torch.ones(1), old=1))
    through_aitune = _warning_place(lambda: call_forward(net.forward, (torch.ones(1),), {"old": 1}))
    assert through_aitune == plain
    assert plain[0] == inspect.getsourcefile(torch.nn.Module._call_impl)


def test_answers_exceptions_and_torchs_namespace_are_unchanged():
    net = _Deprecating()
    assert torch.equal(call_forward(net.forward, (torch.ones(2),), {}), torch.full((2,), 2.0))
    try:
        call_forward(net.forward, (), {})
    except TypeError as exc:
        assert "missing" in str(exc)
    else:
        raise AssertionError("a wrong call must raise as plainly")
    assert "_aitune_call_impl" not in vars(torch.nn.modules.module)


def test_without_torchs_line_it_is_a_plain_call(monkeypatch):
    monkeypatch.setattr(torch_call_site, "CALL_LINE", "this line is not in torch")
    assert torch_call_site._compiled_call() is torch_call_site._plain_call
