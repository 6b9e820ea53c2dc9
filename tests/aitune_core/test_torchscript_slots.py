"""torchscript_slots: `torch.jit.script` of a module whose tree has aitune forward slots compiles the user's
forwards, and the slots are back afterwards; install/uninstall are counted."""

from __future__ import annotations

import pytest
import torch

from aitune_core import torchscript_slots
from aitune_core.forward_slot import ForwardSlot


class Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2


@pytest.fixture(autouse=True)
def none_installed():
    """Each test starts with the wrap off (an `aitune.torch.Module` made by an earlier test keeps it on for the
    process) and the count as it was is restored afterwards."""
    users = torchscript_slots._users
    for _ in range(users):
        torchscript_slots.uninstall()
    yield
    while torchscript_slots.installed():
        torchscript_slots.uninstall()
    for _ in range(users):
        torchscript_slots.install()


@pytest.fixture
def installed():
    torchscript_slots.install()
    yield
    torchscript_slots.uninstall()


def test_scripting_sees_the_users_forwards_and_the_slots_come_back(installed):
    model = Outer().eval()
    x = torch.randn(3, 4)
    expected = model(x)
    slots = [ForwardSlot(m, lambda args, kwargs: "routed").install() for m in (model, model.inner)]
    scripted = torch.jit.script(model)
    torch.testing.assert_close(scripted(x), expected)
    assert all(slot.installed for slot in slots) and model(x) == "routed"


def test_without_it_scripting_fails_on_the_slot():
    model = Inner().eval()
    ForwardSlot(model, lambda args, kwargs: "routed").install()
    assert not torchscript_slots.installed()
    with pytest.raises(TypeError, match="SlotForward"):
        torch.jit.script(model)


def test_install_is_counted():
    torchscript_slots.install()
    torchscript_slots.install()
    torchscript_slots.uninstall()
    assert torchscript_slots.installed()
    torchscript_slots.uninstall()
    assert not torchscript_slots.installed()
    torchscript_slots.uninstall()  # one too many: no harm
    assert not torchscript_slots.installed()
