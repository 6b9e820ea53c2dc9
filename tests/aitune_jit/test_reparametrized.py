"""reparametrized: a module tree counts as swapped exactly while `torch.func.functional_call` has swapped it, on
every exit path; a program's own compiled function that calls functional_call is traced as before."""

from __future__ import annotations

import pytest
import torch

from aitune_jit import reparametrized


@pytest.fixture(autouse=True)
def _installed():
    reparametrized.install()
    yield
    reparametrized.uninstall()


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_the_tree_is_swapped_during_the_call_only_and_the_answer_is_torchs():
    net, other = _net(), _net()
    seen = []
    net[2].register_forward_hook(lambda m, a, o: seen.append((reparametrized.swapped(net), reparametrized.swapped(m))))
    x = torch.randn(3, 4)
    out = torch.func.functional_call(net, dict(other.named_parameters()), (x,))
    torch.testing.assert_close(out, other(x))
    assert seen == [(True, True)]
    assert not reparametrized.swapped(net) and not reparametrized.swapped(net[0])
    assert not reparametrized.swapped(other)


def test_an_error_inside_the_call_and_nested_calls_leave_nothing_swapped():
    net, other = _net(), _net()
    params = dict(other.named_parameters())

    def inner(x):
        assert reparametrized.swapped(net)
        return torch.func.functional_call(net, params, (x,))

    with pytest.raises(RuntimeError):
        torch.func.functional_call(net, params, (torch.randn(3, 5),))  # wrong width: the forward raises
    assert not reparametrized.swapped(net)
    with torch.nn.utils.stateless._reparametrize_module(net, params):
        inner(torch.randn(2, 4))
        assert reparametrized.swapped(net)  # the outer one is still entered
    assert not reparametrized.swapped(net)


def test_uninstall_puts_torchs_own_back():
    from torch.nn.utils import stateless

    wrapped = stateless._reparametrize_module
    reparametrized.uninstall()
    assert stateless._reparametrize_module is not wrapped
    assert stateless._reparametrize_module is wrapped.__wrapped__


def test_a_compiled_function_that_calls_functional_call_traces_torchs_own():
    net, other = _net(), _net()
    params = dict(other.named_parameters())

    @torch.compile(backend="eager", fullgraph=True)
    def run(x):
        return torch.func.functional_call(net, params, (x,))

    x = torch.randn(3, 4)
    torch.testing.assert_close(run(x), other(x))
    assert not reparametrized.swapped(net)
