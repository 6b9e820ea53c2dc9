"""Tuning never replays on the caller's live objects, and nothing that fails inside aitune reaches the program.

In-process, with the counting stand-in backend (no compiles): the real-library cases are in
test_real_workloads.py.
"""

from __future__ import annotations

import logging

import torch
from jit_helpers import CountingBackend

from aitune_jit import tuner
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


class Log:
    def __init__(self) -> None:
        self.entries: list[torch.Tensor] = []


class Appending(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, log: Log) -> torch.Tensor:
        h = self.proj(x)
        log.entries.append(h)
        return self.out(h + torch.stack(log.entries).mean(0))


class Opaque:
    """An output object with no `==`: validation could never accept it."""


class ReturnsObject(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Opaque]:
        return self.fc(x), Opaque()


def _setup() -> None:
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0


def _calls(model: torch.nn.Module, log: Log, n: int = 6) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        return [model(torch.randn(2, 16, generator=generator), log) for _ in range(n)]


def test_a_forward_that_appends_to_its_argument_stays_eager_and_its_children_are_tuned():
    torch.manual_seed(0)
    model = Appending().eval()
    plain_log = Log()
    expected = _calls(model, plain_log)
    _setup()
    enable()
    log = Log()
    outputs = _calls(model, log)
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER
    assert "changes its argument `log` (Log)" in node.reason
    assert [child.state for child in node.children] == [NodeState.TUNED, NodeState.TUNED]
    assert CountingBackend.infers > 0
    assert len(log.entries) == len(plain_log.entries) == 6  # never replayed on the caller's object
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got, want)


def test_an_output_object_that_cannot_be_compared_is_found_before_any_build():
    _setup()
    enable()
    model = ReturnsObject().eval()
    with torch.no_grad():
        for _ in range(3):
            out = model(torch.randn(2, 8))
    assert isinstance(out[1], Opaque)
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER and "output[1] is a Opaque object" in node.reason
    assert CountingBackend.builds == 0


def test_a_failure_inside_tuning_answers_eagerly_with_one_warning(monkeypatch, caplog):
    def broken(node):
        raise KeyError("a bug in aitune")

    monkeypatch.setattr(tuner, "_tune_node", broken)
    _setup()
    enable()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8)).eval()  # containers are not nodes: the Linear is the root
    layer = model[0]
    x = torch.randn(3, 8)
    with caplog.at_level(logging.WARNING, logger="aitune"), torch.no_grad():
        outputs = [model(x) for _ in range(5)]
    for out in outputs:
        torch.testing.assert_close(out, torch.nn.functional.linear(x, layer.weight, layer.bias))
    node = PatchedModule.of(layer)
    assert node.state is NodeState.EAGER
    assert "aitune failed while tuning it (KeyError" in node.reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "aitune failed" in r.getMessage()]
    assert len(warnings) == 1


def test_torch_logs_during_tuning_go_to_the_history(monkeypatch, capsys):
    original = tuner._tune_node

    def noisy(node):
        logging.getLogger("torch._dynamo").error("guard creation failed (retrying)")
        return original(node)

    monkeypatch.setattr(tuner, "_tune_node", noisy)
    _setup()
    enable()
    model = torch.nn.Linear(8, 8).eval()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(2, 8))
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert "guard creation failed" not in capsys.readouterr().err
    assert any("torch logged 1 line(s) (1 at ERROR)" in line for line in PatchedModule.history)


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embed(input_ids))


class Pooling(torch.nn.Module):
    """sentence-transformers style: adds keys to the features dict it is given and returns it."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        tokens = self.encoder(features["input_ids"])
        features["sentence_embedding"] = tokens.mean(1)
        return features


def test_a_forward_that_adds_keys_to_its_input_dict_stays_eager_and_its_encoder_is_tuned_and_used():
    torch.manual_seed(0)
    model = Pooling().eval()
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 32, (2, n), generator=generator) for n in (5, 7, 6, 9, 8)]
    with torch.no_grad():
        expected = [model({"input_ids": ids})["sentence_embedding"] for ids in batches]
    _setup()
    enable()
    with torch.no_grad():
        results = [model({"input_ids": ids}) for ids in batches]
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER and "changes its argument `features` (dict)" in node.reason
    encoder = PatchedModule.of(model.encoder)
    assert encoder.state is NodeState.TUNED
    infers_before = CountingBackend.infers
    with torch.no_grad():
        again = model({"input_ids": batches[2]})  # a recorded length (ranges do not grow yet)
    assert CountingBackend.infers > infers_before  # the tuned path serves the encoder's calls
    for result, want in zip(results, expected):
        assert sorted(result) == ["input_ids", "sentence_embedding"]
        torch.testing.assert_close(result["sentence_embedding"], want)
    torch.testing.assert_close(again["sentence_embedding"], expected[2])
