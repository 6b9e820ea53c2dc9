"""aitune.torch.tune and Module.tune: recording over batch sizes, per-module tuning, dispatch, hooks."""

import logging

import pytest
import torch
from aot_models import MLP, CountingBackend, build

from aitune_aot.module import Module, ModuleState
from aitune_aot.tune import tune
from aitune_core.backends.backend import BackendState
from aitune_core.config import config
from aitune_core.strategies.first_wins import FirstWinsStrategy


@pytest.fixture(autouse=True)
def _counts():
    CountingBackend.reset()


def _strategy():
    return FirstWinsStrategy([CountingBackend()])


def _dataset(n=8, features=8):
    torch.manual_seed(123)
    return [torch.randn(features) for _ in range(n)]


def test_tune_then_an_unrecorded_batch_size_runs_the_backend_and_matches_eager(caplog):
    model = build()
    reference = build()  # same seed, same weights, never wrapped
    model.encoder = Module(model.encoder, "enc")
    caplog.set_level(logging.INFO, logger="aitune")
    tune(model, _dataset(), batch_sizes=[1, 4], strategy=_strategy())

    assert model.encoder.state is ModuleState.TUNED and model.encoder.is_active
    assert "Recording batch size 1" in caplog.text and "Recorded batch size 4: 2 batch(es)" in caplog.text
    ((spec, backend),) = model.encoder.backends
    assert spec.input_spec.tensors[0].shape == ("batch0", 8) and backend.state is BackendState.ACTIVE
    assert CountingBackend.builds == 1

    x = torch.randn(3, 8)  # batch size 3 was never recorded, but is inside [1, 4]
    before = CountingBackend.infers
    with torch.no_grad():
        assert torch.allclose(model(x), reference(x))
    assert CountingBackend.infers == before + 1


def test_shape_outside_the_tuned_range_falls_back_to_eager_with_a_warning(caplog):
    model = build()
    reference = build()
    model.encoder = Module(model.encoder, "enc")
    tune(model, _dataset(), batch_sizes=[1, 2], strategy=_strategy())
    before = CountingBackend.infers
    caplog.set_level(logging.WARNING, logger="aitune")
    x = torch.randn(16, 8)
    with torch.no_grad():
        assert torch.allclose(model(x), reference(x))
    assert CountingBackend.infers == before
    assert "does not match any tuned graph" in caplog.text and "enc" in caplog.text


def test_hooks_fire_exactly_once_in_the_tuned_state_and_modify_outputs_once():
    model = build()
    reference = build()
    calls = []
    model.encoder.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    model.encoder.register_forward_hook(lambda m, args, out: out + 1.0)
    model.encoder = Module(model.encoder, "enc")
    tune(model, _dataset(4), batch_sizes=[1, 2], strategy=_strategy())
    calls.clear()
    before = CountingBackend.infers
    x = torch.randn(2, 8)
    with torch.no_grad():
        out = model.encoder(x)
    assert calls == ["pre"]
    assert CountingBackend.infers == before + 1  # the backend ran (and called the module without hooks)
    assert torch.allclose(out, reference.encoder(x) + 1.0)


def test_strategy_gets_the_original_module_and_a_cache_dir_per_graph(monkeypatch):
    wrapped = Module(MLP(), "my net")
    strategy = _strategy()
    seen = []
    original_run = strategy.run

    def spy(job):
        seen.append((job.module, job.name, job.graph_spec.name, len(job.samples), job.device, job.cache_dir))
        assert "forward" not in job.module.__dict__  # the module's own forward, not the routing
        return original_run(job)

    monkeypatch.setattr(strategy, "run", spy)
    # two graphs: rank-2 and rank-3 inputs
    dataset = [torch.randn(8)] * 2
    tune(lambda x: (wrapped(x), wrapped(x.unsqueeze(1))), dataset, batch_sizes=[1, 2], strategy=strategy)
    assert [(type(m), n, g) for m, n, g, *_ in seen] == [(MLP, "my_net", "0"), (MLP, "my_net", "1")]
    assert seen[0][0] is wrapped.__wrapped__
    assert [c for *_, c in seen] == [config.cache_dir / "my_net" / "0", config.cache_dir / "my_net" / "1"]
    assert all(c.is_dir() for *_, c in seen)
    assert [spec.name for spec in wrapped.graph_specs] == ["0", "1"]


def test_strategies_per_graph_as_dict_and_list_and_module_strategy_precedence(monkeypatch):
    used = []

    def tracked(label):
        strategy = _strategy()
        original = strategy.run
        def spy(job):
            used.append((job.name, job.graph_spec.name, label))
            return original(job)

        monkeypatch.setattr(strategy, "run", spy)
        return strategy

    by_dict = Module(MLP(), "d", strategies={"1": tracked("dict-1")}, strategy=tracked("module"))
    by_list = Module(MLP(), "l", strategies=[tracked("list-0"), tracked("list-1")])
    too_few = Module(MLP(), "f", strategies=[tracked("only-one")])

    def run(x):
        for m in (by_dict, by_list, too_few):
            m(x)
            m(x.unsqueeze(1))

    with pytest.raises(ValueError, match="recorded 2 graphs but 1 strategies"):
        tune(run, [torch.randn(8)] * 2, batch_sizes=[1, 2], strategy=tracked("tune-arg"))
    assert ("d", "0", "module") in used and ("d", "1", "dict-1") in used
    assert ("l", "0", "list-0") in used and ("l", "1", "list-1") in used
    assert not any(label == "tune-arg" for *_, label in used)
    assert by_dict.state is ModuleState.TUNED and by_list.state is ModuleState.TUNED
    assert too_few.state is ModuleState.PASSTHROUGH  # failed: back to passthrough, recording kept
    assert len(too_few.graph_specs) == 2


def test_other_modules_are_deactivated_while_one_tunes_then_all_are_activated(monkeypatch):
    model = build()
    model.encoder = Module(model.encoder, "enc")
    model.head = Module(model.head, "head")
    strategy = _strategy()
    states = []
    original = strategy.run

    def spy(job):
        states.append((job.name, model.encoder.is_active, model.head.is_active))
        return original(job)

    monkeypatch.setattr(strategy, "run", spy)
    tune(model, _dataset(4), batch_sizes=[1, 2], strategy=strategy)
    assert states == [("enc", False, False), ("head", False, False)]
    assert model.encoder.is_active and model.head.is_active
    assert [b.state for _, b in model.encoder.backends] == [BackendState.ACTIVE]


def test_dry_run_builds_nothing_and_uncalled_modules_stay_passthrough(caplog):
    model = build()
    model.encoder = Module(model.encoder, "enc")
    idle = Module(MLP(), "idle")
    caplog.set_level(logging.INFO, logger="aitune")
    tune(model, _dataset(4), batch_sizes=[1, 2], strategy=_strategy(), dry_run=True)
    assert CountingBackend.builds == 0
    assert model.encoder.state is ModuleState.PASSTHROUGH and len(model.encoder.graph_specs) == 1
    assert idle.state is ModuleState.PASSTHROUGH
    assert "Module `idle` was not called by func" in caplog.text and "Dry run" in caplog.text


def test_already_tuned_modules_are_skipped_and_retuning_needs_force():
    wrapped = Module(MLP(), "m")
    tune(wrapped, _dataset(4), batch_sizes=[1, 2], strategy=_strategy())
    with pytest.raises(ValueError, match="already been tuned"):
        wrapped.tune()
    tune(wrapped, _dataset(4), batch_sizes=[1, 2], strategy=_strategy())  # skipped, no error
    assert CountingBackend.builds == 1
    wrapped.enable_recording(force=True)
    tune(wrapped, _dataset(4), batch_sizes=[2, 3], strategy=_strategy())
    assert CountingBackend.builds == 2 and wrapped.graph_specs[0].input_spec.tensors[0].min_shape == (2, 8)


def test_argument_validation():
    wrapped = Module(MLP(), "m")
    with pytest.raises(TypeError, match="callable"):
        tune("model", _dataset())
    with pytest.raises(ValueError, match="empty"):
        tune(wrapped, [])
    with pytest.raises(ValueError, match=">= 1"):
        tune(wrapped, _dataset(), batch_sizes=[0, 1])
    with pytest.raises(TypeError, match="TuneStrategy"):
        tune(wrapped, _dataset(), strategy="fast")
    assert wrapped.state is ModuleState.INIT  # nothing started
    del wrapped
    import gc

    gc.collect()
    with pytest.raises(ValueError, match=r"no aitune\.torch\.Module"):
        tune(lambda x: x, _dataset())


def test_a_failing_func_leaves_modules_in_passthrough():
    wrapped = Module(MLP(), "m")

    def broken(x):
        wrapped(x)
        raise RuntimeError("user bug")

    with pytest.raises(RuntimeError, match="user bug"):
        tune(broken, _dataset(), batch_sizes=[1, 2], strategy=_strategy())
    assert wrapped.state is ModuleState.PASSTHROUGH


def test_to_dict_and_from_dict_roundtrip_in_memory():
    wrapped = Module(MLP(), "m")
    tune(wrapped, _dataset(4), batch_sizes=[1, 2], strategy=_strategy())
    state = wrapped.to_dict()[""]
    assert Module.is_state_dict_valid(state) and not Module.is_state_dict_valid({"type": "x"})
    assert state["name"] == "m" and state["backends"][0]["backend"]["type"] == "CountingBackend"
    raw = MLP()
    raw.load_state_dict(wrapped.state_dict())  # state_dict() is the wrapped module's own
    restored = Module.from_dict(raw, state)
    assert restored.state is ModuleState.TUNED and restored.name == "m_1"  # "m" is still alive
    assert [b.state for _, b in restored.backends] == [BackendState.DEPLOYED]
    x = torch.randn(2, 8)
    before = CountingBackend.infers
    with torch.no_grad():
        assert torch.equal(restored(x), MLP.forward(wrapped.__wrapped__, x))
    assert CountingBackend.infers == before + 1
    with pytest.raises(ValueError, match="Invalid dictionary format"):
        Module.from_dict(MLP(), {"type": "something else"})


def test_backend_failing_at_run_time_answers_with_the_original_module(caplog, monkeypatch):
    model = build()
    reference = build()
    model.encoder = Module(model.encoder, "enc")
    tune(model, _dataset(), batch_sizes=[1, 4], strategy=_strategy())
    ((_spec, backend),) = model.encoder.backends

    def broken(*args, **kwargs):
        raise RuntimeError("engine lost")

    monkeypatch.setattr(backend, "_infer", broken)
    caplog.set_level(logging.WARNING, logger="aitune")
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(model(x), reference(x))
    assert caplog.text.count("failed at run time (RuntimeError: engine lost)") == 1
    with pytest.raises(RuntimeError, match="mat1 and mat2"):  # the caller's own error still reaches the caller
        model(torch.randn(3, 5))


class _Checked(torch.nn.Module):
    """Rejects negative inputs itself, as a model may validate its input inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < -100).any()):
            raise ValueError("inputs below -100 are not supported")
        return self.fc(x)


def test_an_error_of_the_callers_own_forward_is_not_blamed_on_the_backend(caplog):
    model = Module(_Checked().eval(), "checked")
    tune(model, _dataset(), batch_sizes=[1, 4], strategy=_strategy())
    caplog.set_level(logging.WARNING, logger="aitune")
    with torch.no_grad(), pytest.raises(ValueError, match="below -100") as info:
        model(torch.full((2, 8), -1000.0))  # the backend runs the same forward: it raises, and so does eager
    # reported as the forward's error, chained as without aitune: no backend failure anywhere in its chain
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert "failed at run time" not in caplog.text
    before = CountingBackend.infers
    with torch.no_grad():
        model(torch.randn(2, 8))
    assert CountingBackend.infers == before + 1  # the backend still serves the next call


def test_a_script_that_configured_no_logging_sees_the_out_of_range_warning_once(tmp_path):
    # the `aitune` logger has only a NullHandler: the one warning a fallback owes the user was invisible
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(
        "import torch, aitune.torch as ait\n"
        "from aitune_core.backends.torch_eager import TorchEagerBackend\n"
        "net = ait.Module(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), 'net')\n"
        "ait.tune(net, [torch.randn(8) for _ in range(4)], batch_sizes=[2, 4],\n"
        "         strategy=ait.FirstWinsStrategy([TorchEagerBackend()]))\n"
        "with torch.no_grad():\n"
        "    for batch in (16, 32):\n"
        "        net(torch.randn(batch, 8))\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path, env={**__import__("os").environ, "AITUNE_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    shown = [line for line in result.stderr.splitlines() if "outside the tuned range" in line]
    assert len(shown) == 1 and shown[0].startswith("[aitune] WARNING")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_tuning_on_a_device_this_machine_lacks_is_refused_with_the_reason():
    from aitune_core.errors import ConfigError

    Module(MLP().eval(), "gpu_only")
    with pytest.raises(ConfigError, match="no cuda device is available"):
        tune(lambda x: x, [torch.randn(4)], batch_sizes=[1, 2], device="cuda")


def test_a_device_string_torch_does_not_know_is_refused_naming_the_argument():
    from aitune_core.errors import ConfigError

    Module(MLP().eval(), "bad_device")
    with pytest.raises(ConfigError, match=r"tune\(device='gpu'\): not a torch device"):
        tune(lambda x: x, [torch.randn(4)], batch_sizes=[1, 2], device="gpu")
