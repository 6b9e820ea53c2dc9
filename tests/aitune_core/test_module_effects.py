"""aitune_core/recording/module_effects.py: a call that writes or rebinds the module's tensors, changes its plain
attributes or draws random numbers is named; a pure call, and aitune's or torch's own bookkeeping, are not."""

from __future__ import annotations

import importlib.util
import io
import itertools
import logging
import random
import types

import torch
from torch import nn

from aitune_core.recording.module_effects import ModuleEffects


class _Net(nn.Module):
    def __init__(self, effect: str = "") -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.effect = effect
        self.calls = 0
        self.log: list[int] = []
        self.scale = 2.0
        self.stats = {"steps": torch.zeros(()), "count": 0, "kv": []}
        self.meter = types.SimpleNamespace(n=0, total=torch.zeros(()))
        self.deep = types.SimpleNamespace(inner=types.SimpleNamespace(calls={"n": 0}))  # (three levels down)
        self.config = types.SimpleNamespace(width=4, labels={0: "a"})  # read, never written
        self.logger = logging.getLogger("tests.module_effects")  # a level cache that fills is not the forward's
        self.generator = torch.Generator().manual_seed(1)  # the program's own streams: read, unless drawn from
        self.python_random = random.Random(2)
        self.ticket = itertools.count()  # iterators and an in-memory log: read, unless the forward moves them
        self.queue = iter(range(100))
        self.text_log = io.StringIO()
        self.byte_log = io.BytesIO()
        self.ticks = self._ticks()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        effect = self.effect
        if effect == "buffer":
            self.steps.add_(1)
        elif effect == "rebind":
            self.steps = self.steps + 1
        elif effect == "counter":
            self.calls += 1
        elif effect == "append":
            self.log.append(1)
        elif effect == "torch-random":
            x = x + torch.randn_like(x)
        elif effect == "python-random":
            x = x * random.random()
        elif effect == "own-generator":
            x = x + torch.rand(x.shape, generator=self.generator)
        elif effect == "own-python-random":
            x = x * self.python_random.random()
        elif effect == "numpy-global":
            x = x * float(__import__("numpy").random.rand())
        elif effect == "child-weight":
            self.fc.weight.mul_(1.0)
        elif effect == "dict-tensor":
            self.stats["steps"] += 1
        elif effect == "dict-count":
            self.stats["count"] += 1
        elif effect == "dict-list":
            self.stats["kv"].append(x)
        elif effect == "namespace":
            self.meter.n += 1
        elif effect == "namespace-tensor":
            self.meter.total.add_(x.sum())
        elif effect == "deep-count":
            self.deep.inner.calls["n"] += 1
        elif effect == "count":
            x = x * next(self.ticket)
        elif effect == "iterator":
            x = x * next(self.queue)
        elif effect == "text-log":
            self.text_log.write("called\n")
        elif effect == "byte-log":
            self.byte_log.write(b"called")
        elif effect == "python-generator":
            x = x * next(self.ticks)
        self.logger.isEnabledFor(logging.DEBUG)
        assert self.config.width == x.shape[-1]
        return self.fc(x) * self.scale


    @staticmethod
    def _ticks():
        tick = 0
        while True:
            yield tick
            tick += 1


def _changes(net: nn.Module) -> str | None:
    watch = ModuleEffects.before(net)
    with torch.no_grad():
        net(torch.ones(2, 4))
    return watch.changes()


def test_a_pure_forward_changes_nothing():
    assert _changes(_Net()) is None


def test_each_kind_of_effect_is_named():
    expected = {
        "buffer": "its tensor `steps`",
        "rebind": "its tensor `steps`",
        "counter": "its attribute `calls`",
        "append": "its attribute `log`",
        "torch-random": "torch's random generator",
        "python-random": "Python's random module",
        # generators the program keeps itself (before, replays took their numbers unseen)
        "own-generator": "its random generator `generator`",
        "own-python-random": "its random generator `python_random`",
        "child-weight": "its tensor `fc.weight`",
        # state kept one level down: in a dict attribute, or a plain object's attribute
        "dict-tensor": "its attribute `stats`",
        "dict-count": "its attribute `stats`",
        "dict-list": "its attribute `stats`",
        "namespace": "its attribute `meter`",
        "namespace-tensor": "its attribute `meter`",
        # objects that change behind the same identity (before, a counter read 19 after 10 calls)
        "deep-count": "its attribute `deep`",
        "count": "its attribute `ticket`",
        "iterator": "its attribute `queue`",
        "text-log": "its attribute `text_log`",
        "byte-log": "its attribute `byte_log`",
        "python-generator": "its attribute `ticks`",
    }
    if importlib.util.find_spec("numpy") is not None:
        expected["numpy-global"] = "numpy's global random state"
    for effect, words in expected.items():
        changed = _changes(_Net(effect))
        assert changed is not None and words in changed, (effect, changed)


def test_bookkeeping_and_changes_between_calls_are_not_the_forwards():
    net = _Net()
    watch = ModuleEffects.before(net)
    net.register_forward_hook(lambda *_: None)  # a hook table: torch's bookkeeping
    net.__dict__["_aitune_jit_node"] = object()  # aitune's slot on a module
    with torch.no_grad():
        net(torch.ones(2, 4))
    assert watch.changes() is None
    net.scale = 3.0  # the program's own change, before the next fingerprint: not this call's effect
    assert _changes(net) is None


def test_an_attribute_added_or_removed_by_the_forward_is_named():
    class Adds(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if hasattr(self, "seen"):
                del self.seen
            else:
                self.seen = True
            return x

    module = Adds()
    assert "its attribute `seen`" in _changes(module)
    assert "removes its attribute `seen`" in _changes(module)
