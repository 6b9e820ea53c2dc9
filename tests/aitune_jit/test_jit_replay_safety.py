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


def test_a_forward_whose_argument_grows_a_new_layout_each_call_stays_eager_and_its_children_are_tuned():
    torch.manual_seed(0)
    model = Appending().eval()
    plain_log = Log()
    expected = _calls(model, plain_log, n=8)
    _setup()
    enable()
    log = Log()
    outputs = _calls(model, log, n=8)
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER
    assert "changes its argument `log` (Log)" in node.reason
    assert "new layout on every call (4 calls" in node.reason  # a list one longer per call: no graph repeats
    assert [child.state for child in node.children] == [NodeState.TUNED, NodeState.TUNED]
    assert CountingBackend.infers > 0
    assert len(log.entries) == len(plain_log.entries) == 8  # never replayed on the caller's object
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
    assert any("torch logged 1 line(s) (1 at error level)" in line for line in PatchedModule.history)


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


def _pooling(lengths: tuple[int, ...]) -> tuple[Pooling, list[torch.Tensor], list[torch.Tensor]]:
    """A Pooling model, token batches of these lengths and its plain outputs for them."""
    torch.manual_seed(0)
    model = Pooling().eval()
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 32, (2, n), generator=generator) for n in lengths]
    with torch.no_grad():
        expected = [model({"input_ids": ids})["sentence_embedding"] for ids in batches]
    return model, batches, expected


def test_a_forward_that_adds_keys_to_its_input_dict_is_tuned_and_the_tuned_call_adds_them_too():
    model, batches, expected = _pooling((5, 7, 6, 6, 7))
    _setup()
    enable()
    with torch.no_grad():
        results = [model({"input_ids": ids}) for ids in batches[:4]]
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED
    assert any("changes its argument `features` (dict); its calls are recorded on copies" in line
               for line in PatchedModule.history)
    infers_before = CountingBackend.infers
    features = {"input_ids": batches[4]}
    with torch.no_grad():
        returned = model(features)
    assert CountingBackend.infers == infers_before + 1  # the tuned backend answered, on the caller's dict
    assert returned is features and sorted(features) == ["input_ids", "sentence_embedding"]
    torch.testing.assert_close(features["sentence_embedding"], expected[4])
    for result, want in zip(results, expected):
        assert sorted(result) == ["input_ids", "sentence_embedding"]
        torch.testing.assert_close(result["sentence_embedding"], want)


def test_with_stateful_calls_off_a_forward_that_adds_keys_stays_eager_and_its_encoder_is_tuned_and_used():
    model, batches, expected = _pooling((5, 7, 6, 9, 8))
    _setup()
    jit_config.stateful_calls = False
    jit_config.min_samples_varying = 2  # (the lengths vary: the encoder is tuned from its first calls)
    enable()
    with torch.no_grad():
        results = [model({"input_ids": ids}) for ids in batches]
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER and "changes its argument `features` (dict)" in node.reason
    assert "stateful_calls is off" in node.reason
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


class KVCache:
    """A fixed-layout cache like transformers' DynamicCache: one tensor, one step counter, grown by each call."""

    def __init__(self) -> None:
        self.keys = torch.zeros(2, 0, 16)
        self.steps = 0


class Step(torch.nn.Module):
    """A decoder step: appends to the caller's cache and reads all of it back."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
        cache.keys = torch.cat([cache.keys, self.proj(x)], dim=1)
        cache.steps += 1
        return self.out(cache.keys.mean(1)), cache


class ForgetsTheCache(CountingBackend):
    """Right outputs from a copy of the cache; the caller's cache is never updated."""

    def _infer(self, x: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
        import copy

        return self._module(x, copy.deepcopy(cache))[0], cache


def _decode(model: torch.nn.Module, steps: int = 8) -> tuple[list[torch.Tensor], KVCache]:
    generator = torch.Generator().manual_seed(0)
    cache = KVCache()
    outputs = []
    with torch.no_grad():
        for _ in range(steps):
            out, returned = model(torch.randn(2, 1, 16, generator=generator), cache)
            assert returned is cache
            outputs.append(out)
    return outputs, cache


def _decoded_plainly_then_under_the_jit(*backends: object) -> PatchedModule:
    """Decode plainly, then with the JIT on (`backends`: jit_config.backends); outputs and the cache's state must
    be the same either way (the cache is never replayed on). Returns the model's node."""
    torch.manual_seed(0)
    model = Step().eval()
    expected, expected_cache = _decode(model)
    _setup()
    if backends:
        jit_config.backends = list(backends)
    enable()
    outputs, cache = _decode(model)
    assert cache.steps == expected_cache.steps == 8
    torch.testing.assert_close(cache.keys, expected_cache.keys)
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got, want)
    return PatchedModule.of(model)


def test_a_module_that_grows_a_kv_cache_is_tuned_and_serves_on_the_callers_cache():
    node = _decoded_plainly_then_under_the_jit()
    assert node.state is NodeState.TUNED
    assert any("changes its argument `cache` (KVCache); its calls are recorded on copies" in line
               for line in PatchedModule.history)
    assert CountingBackend.infers > 0


def test_a_backend_that_leaves_the_kv_cache_behind_is_rejected():
    node = _decoded_plainly_then_under_the_jit(ForgetsTheCache())
    assert node.state is NodeState.EAGER
    assert "args[1].keys after the call has shape" in node.reason, node.reason


def test_a_kv_cache_too_large_to_copy_for_every_recorded_call_keeps_its_module_eager(monkeypatch):
    from aitune_jit import node_recording

    monkeypatch.setattr(node_recording, "STATEFUL_COPY_LIMIT_MB", 1e-4)  # about 100 bytes: the cache is larger
    node = _decoded_plainly_then_under_the_jit()
    assert node.state is NodeState.EAGER
    assert "changes its argument `cache` (KVCache), and its arguments hold" in node.reason
    assert "STATEFUL_COPY_LIMIT_MB=0.0001" in node.reason
    assert [child.state for child in node.children] == [NodeState.TUNED, NodeState.TUNED]
