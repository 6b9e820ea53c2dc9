"""benchmarks/probes/compile_interference.py: the own-code-object view behaves like the module it wraps."""

import torch

from benchmarks.probes import compile_interference as ci


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return self.linear(x) * scale


def test_own_code_runs_the_same_forward_through_a_code_object_of_its_own():
    net = _Net()
    own = ci.OwnCode(net)
    x = torch.randn(2, 4)
    torch.testing.assert_close(own(x), net(x))
    torch.testing.assert_close(own(x, scale=0.5), net(x, scale=0.5))  # defaults and keywords carried over
    assert own.forward.__func__.__code__ is not _Net.forward.__code__
    assert own.forward.__func__.__code__.co_code == _Net.forward.__code__.co_code
    assert own.forward.__self__ is net  # the user's module, weights shared
