"""Changes a user makes to a model after it was tuned, applied to the tuned model and to an eager twin alike.

Shared by the JIT and AOT tests of "tuned modules follow the model": `run_scenarios` applies every change in
turn and checks that the tuned model's next two calls equal the eager twin's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch


class FollowNet(torch.nn.Module):
    """Linear -> BatchNorm -> ReLU -> Dropout -> Linear: weights, buffers (running statistics), training-mode
    paths, and a random one (dropout)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.drop = torch.nn.Dropout(0.25)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


def make_net(seed: int = 0) -> FollowNet:
    torch.manual_seed(seed)
    net = FollowNet()
    with torch.no_grad():  # non-trivial running statistics
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 1.5)
    return net.eval()


def _random_state(net: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: (torch.rand(value.shape, generator=generator) + 0.5 if value.is_floating_point() else value.clone())
        for name, value in net.state_dict().items()
    }


def _inplace(net: torch.nn.Module) -> None:
    with torch.no_grad():
        net.fc2.weight.mul_(-2.0)


def _load(net: torch.nn.Module) -> None:
    net.load_state_dict(_random_state(net, 1))


def _load_assign(net: torch.nn.Module) -> None:
    net.load_state_dict(_random_state(net, 2), assign=True)


def _replace(net: torch.nn.Module) -> None:
    torch.manual_seed(3)
    net.fc2 = torch.nn.Linear(16, 4).eval()


def _train_step(net: torch.nn.Module) -> None:
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(4)  # the same dropout masks for the tuned net and its eager twin
    loss = net(x).square().mean()
    loss.backward()
    optimizer.step()
    net.eval()


#: (name, change) in the order they are applied; `.to(dtype)` is last (it changes the inputs' dtype too)
CHANGES: list[tuple[str, Callable[[torch.nn.Module], None]]] = [
    ("in-place weight edit", _inplace),
    ("load_state_dict", _load),
    ("load_state_dict(assign=True)", _load_assign),
    ("submodule replaced", _replace),
    ("train step then eval", _train_step),
]


def _double_output(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output * 2.0


def _dropout_flag(tuned: Callable[[torch.Tensor], torch.Tensor], net: torch.nn.Module, eager: torch.nn.Module,
                  x: torch.Tensor, run_eager: Callable[[Callable[[], Any]], Any], *, atol: float, rtol: float) -> None:
    """`net.drop.training = True` without `train()` (Monte Carlo dropout): the same masks as eager from the same
    seed, and the program's random stream left where eager leaves it; then the flag goes back."""
    net.drop.training = True
    run_eager(lambda: setattr(eager.drop, "training", True))
    for call in range(2):
        with torch.no_grad():
            torch.manual_seed(7 + call)
            got, after = tuned(x), torch.rand(3)
            torch.manual_seed(7 + call)
            want, expected = run_eager(lambda: eager(x)), torch.rand(3)
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol,
                                   msg=lambda m, call=call: f"MC dropout, call {call}: {m}")
        torch.testing.assert_close(after, expected, msg=lambda m: f"random stream after MC dropout: {m}")
    net.drop.training = False
    run_eager(lambda: setattr(eager.drop, "training", False))


def run_scenarios(
    tuned: Callable[[torch.Tensor], torch.Tensor],
    net: torch.nn.Module,
    eager: torch.nn.Module,
    *,
    run_eager: Callable[[Callable[[], Any]], Any] = lambda fn: fn(),
    serving: Callable[[], bool] = lambda: True,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> list[str]:
    """Apply every change to `net` (the module behind `tuned`) and to `eager`; compare two calls after each.

    `run_eager(fn)` runs `fn` outside aitune (the JIT bypass); `serving()` says whether a tuned backend answers
    again (checked after each change that leaves no hook or training flag behind). Returns the checks done."""
    done = []
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))

    def compare(what: str, inputs: torch.Tensor) -> None:
        for call in range(2):
            with torch.no_grad():
                got = tuned(inputs)
                want = run_eager(lambda: eager(inputs))
            torch.testing.assert_close(
                got, want, atol=atol, rtol=rtol, msg=lambda m, call=call: f"{what}, call {call}: {m}"
            )
        done.append(what)

    compare("tuned", x)
    _dropout_flag(tuned, net, eager, x, run_eager, atol=atol, rtol=rtol)
    done.append("training flag set directly (MC dropout)")
    compare("training flag set back", x)
    assert serving(), "no backend serves after the training flag was set back"
    for name, change in CHANGES:
        change(net)
        run_eager(lambda change=change: change(eager))
        compare(name, x)
        assert serving(), f"no backend serves after: {name}"

    calls: list[str] = []
    handles = [
        net.fc1.register_forward_hook(lambda *a: calls.append("tuned")),
        net.fc1.register_forward_hook(_double_output),
        eager.fc1.register_forward_hook(_double_output),
    ]
    compare("hook added on a child", x)
    assert calls == ["tuned", "tuned"], calls  # once per call
    for handle in handles:
        handle.remove()
    compare("hook removed", x)
    assert serving(), "no backend serves after the hook was removed"

    net.to(torch.float64)
    run_eager(lambda: eager.to(torch.float64))
    compare(".to(float64)", x.double())
    return done


def eager_twin(net: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(net)


#: LoRA-like swaps: how many, and which attention projections of a BertLayer they replace
SWAPS = 20
PROJECTIONS = ("query", "key", "value")


def bert_block() -> torch.nn.Module:
    """A transformers BertLayer from a tiny config (random weights)."""
    import transformers
    from transformers.models.bert.modeling_bert import BertLayer

    config = transformers.BertConfig(hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                     attn_implementation="eager")  # a standalone layer: no dispatch warning
    torch.manual_seed(0)
    return BertLayer(config).eval()


def swap_projections(block: torch.nn.Module, twin: torch.nn.Module, step: int) -> None:
    """Odd steps assign new Parameters (an adapter swapped in), even steps copy into the weights in place."""
    generator = torch.Generator().manual_seed(100 + step)
    for name in PROJECTIONS:
        weight = getattr(block.attention.self, name).weight
        new = torch.randn(weight.shape, generator=generator) * 0.2
        for target in (block, twin):
            projection = getattr(target.attention.self, name)
            if step % 2:
                projection.weight = torch.nn.Parameter(new.clone(), requires_grad=False)
            else:
                with torch.no_grad():
                    projection.weight.copy_(new)
