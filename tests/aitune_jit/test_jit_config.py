"""jit_config: validation on assignment, environment variables, default backends and strategy."""

from __future__ import annotations

import pytest
import torch

from aitune_core.backends import defaults as backend_defaults
from aitune_core.backends.tensorrt import TensorRTBackend
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.backends.torch_inductor import TorchInductorBackend
from aitune_core.errors import ConfigError
from aitune_core.strategies import defaults as strategy_defaults
from aitune_core.strategies.first_wins import FirstWinsStrategy
from aitune_core.strategies.highest_throughput import HighestThroughputStrategy
from aitune_jit import config as config_module
from aitune_jit.config import JitConfig, default_backends, default_strategy, jit_config


def test_defaults():
    cfg = JitConfig(read_env=False)
    assert cfg.min_samples == 2
    assert cfg.batch_axis_required is False
    assert cfg.max_depth_level == 2
    assert cfg.min_parameters == 1000
    assert cfg.detect_graph_breaks is True
    assert cfg.skip_modules == []
    assert cfg.device is None
    assert cfg.dry_run is False
    assert cfg.backends is None
    assert cfg.strategy is None
    assert cfg.precision is None
    assert cfg.min_speedup is None and cfg.min_eager_latency_us is None and cfg.skip_single_layer is True


def test_an_infinite_time_limit_is_no_limit():
    # an infinite timeout overflowed the worker's waits: nothing was tuned, without a word
    before = jit_config.tuning_timeout_s
    try:
        jit_config.tuning_timeout_s = float("inf")
        assert jit_config.tuning_timeout_s is None
        jit_config.tuning_budget_s = float("inf")
        assert jit_config.tuning_budget_s is None
    finally:
        jit_config.tuning_timeout_s = before
        jit_config.tuning_budget_s = None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("min_samples", 0, ">= 1"),
        ("min_samples", -3, ">= 1"),
        ("min_samples", 2.5, "must be an int"),
        ("max_depth_level", -1, ">= 0"),
        ("min_parameters", -10, ">= 0"),
        ("detect_graph_breaks", "yes", "True or False"),
        ("dry_run", 1, "True or False"),
        ("skip_modules", "LayerNorm", "list of class names"),
        ("skip_modules", [3], "class names"),
        ("backends", ["TorchInductorBackend"], "Backend instances"),
        ("backends", [TorchEagerBackend], "instance"),
        ("backends", [], "empty"),
        ("strategy", "first_wins", "TuneStrategy"),
        ("precision", "int8", "'bf16' or 'fp16'"),
        ("device", "gpu", "not a device"),
        ("cache_dir", "", "non-empty"),
        ("min_speedup", float("nan"), "got nan"),
        ("min_eager_latency_us", float("nan"), "got nan"),
        ("min_speedup", float("inf"), "finite"),
        ("tuning_timeout_s", float("nan"), "got nan"),
    ],
)
def test_invalid_values_raise_clear_errors(name, value, message):
    before = getattr(jit_config, name)
    with pytest.raises(ConfigError, match=message) as info:
        setattr(jit_config, name, value)
    assert f"jit_config.{name}" in str(info.value)
    assert getattr(jit_config, name) == before  # unchanged


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_device_without_gpu_is_rejected():
    with pytest.raises(ConfigError, match="no cuda device is available"):
        jit_config.device = "cuda"


def test_nonexistent_device_index_is_rejected(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"has 1 cuda device\(s\)"):
        jit_config.device = "cuda:7"
    jit_config.device = "cuda:0"  # exists (as far as the patched torch.cuda says)
    assert jit_config.device == torch.device("cuda:0")


def test_unknown_option_and_delete():
    with pytest.raises(ConfigError, match="unknown jit_config option 'min_sample'"):
        jit_config.min_sample = 3
    with pytest.raises(ConfigError, match="cannot be deleted"):
        del jit_config.min_samples


def test_validate_catches_values_put_in_place_behind_the_setter():
    object.__setattr__(jit_config, "min_samples", -1)
    with pytest.raises(ConfigError, match="min_samples"):
        jit_config.validate()


def test_normalisation():
    jit_config.skip_modules = [torch.nn.LayerNorm, "BatchNorm2d"]
    assert jit_config.skip_modules == ["LayerNorm", "BatchNorm2d"]
    jit_config.precision = torch.bfloat16
    assert jit_config.precision == "bf16"
    jit_config.precision = "FP16"
    assert jit_config.precision == "fp16"
    jit_config.device = "cpu"
    assert jit_config.device == torch.device("cpu")
    jit_config.backends = TorchEagerBackend()
    assert [type(b) for b in jit_config.backends] == [TorchEagerBackend]


def test_override_restores():
    with jit_config.override(min_samples=5, dry_run=True):
        assert jit_config.min_samples == 5 and jit_config.dry_run
    assert jit_config.min_samples == 2 and not jit_config.dry_run
    with pytest.raises(ConfigError), jit_config.override(min_samples=0):
        pass
    assert jit_config.min_samples == 2


def test_environment_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("AITUNE_JIT_MIN_SAMPLES", "4")
    monkeypatch.setenv("AITUNE_JIT_DRY_RUN", "true")
    monkeypatch.setenv("AITUNE_JIT_SKIP_MODULES", "LayerNorm, BatchNorm2d")
    monkeypatch.setenv("AITUNE_JIT_BACKENDS", "TorchEagerBackend")
    monkeypatch.setenv("AITUNE_JIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AITUNE_JIT_PRECISION", "bf16")
    cfg = JitConfig()
    assert cfg.min_samples == 4
    assert cfg.dry_run is True
    assert cfg.skip_modules == ["LayerNorm", "BatchNorm2d"]
    assert [type(b) for b in cfg.backends] == [TorchEagerBackend]
    assert cfg.cache_dir == tmp_path
    assert cfg.precision == "bf16"


@pytest.fixture
def fresh_reports(monkeypatch):
    """Each bad variable is reported once per process: start these tests with nothing reported yet."""
    monkeypatch.setattr(config_module, "_reported", set())


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "aitune.jit"]


@pytest.mark.parametrize(
    ("variable", "text", "option", "accepted"),
    [
        ("AITUNE_JIT_MIN_SAMPLES", "-2", "min_samples", "an integer >= 1"),
        ("AITUNE_JIT_MIN_SAMPLES", "abc", "min_samples", "an integer >= 1"),
        ("AITUNE_JIT_DRY_RUN", "maybe", "dry_run", "a boolean"),
        ("AITUNE_JIT_BACKENDS", "NoSuchBackend", "backends", "backend class names"),
        ("AITUNE_JIT_DEVICE", "cuda:7", "device", "a device of this machine"),
        ("AITUNE_JIT_PRECISION", "fp8", "precision", "none, bf16 or fp16"),
    ],
)
def test_bad_environment_value_warns_once_and_keeps_the_default(
    monkeypatch, caplog, fresh_reports, variable, text, option, accepted
):
    monkeypatch.setenv(variable, text)
    with caplog.at_level("WARNING", logger="aitune.jit"):
        cfg = JitConfig()
        JitConfig()  # read again (e.g. reset()): not reported a second time
    assert getattr(cfg, option) == getattr(JitConfig(read_env=False), option)
    (message,) = _warnings(caplog)
    assert f"{variable}={text!r}" in message and accepted in message and f"jit_config.{option} keeps" in message


def test_misspelt_environment_name_warns_once_with_the_closest_name(monkeypatch, caplog, fresh_reports):
    monkeypatch.setenv("AITUNE_JIT_MIN_SAMPLE", "5")
    monkeypatch.setenv("AITUNE_JIT_PRINT_HISTORY", "1")  # known, though not an option
    with caplog.at_level("WARNING", logger="aitune.jit"):
        cfg = JitConfig()
        JitConfig()
    assert cfg.min_samples == 2
    (message,) = _warnings(caplog)
    assert "AITUNE_JIT_MIN_SAMPLE is not an aitune JIT option" in message
    assert "did you mean AITUNE_JIT_MIN_SAMPLES?" in message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("device", b"\xff"),
        ("device", 1.5),
        ("device", True),
        ("cache_dir", "/tmp/a\x00b"),
        ("cache_dir", b"/tmp"),
        ("precision", object()),
        ("min_samples", "3"),
    ],
)
def test_setters_reject_wrong_types_with_config_error(name, value):
    with pytest.raises(ConfigError, match=name):
        setattr(jit_config, name, value)
    with pytest.raises(ConfigError, match=name), jit_config.override(**{name: value}):
        pass


class _Unequal:
    def __eq__(self, other):
        raise RuntimeError("no comparison")


def test_a_value_whose_own_methods_raise_is_a_config_error():
    with pytest.raises(ConfigError, match="precision"):
        jit_config.precision = _Unequal()


def test_default_backends_cpu_without_tensorrt(monkeypatch):
    monkeypatch.setattr(backend_defaults, "tensorrt_available", lambda: False)
    backends = default_backends("cpu")
    assert [b.describe() for b in backends] == ["TorchInductorBackend()"]


def test_default_backends_put_tensorrt_first_when_importable(monkeypatch):
    monkeypatch.setattr(backend_defaults, "tensorrt_available", lambda: True)
    backends = default_backends("cpu")
    assert [type(b) for b in backends] == [TensorRTBackend, TorchInductorBackend]


def test_default_strategy_measures_speed_on_the_cpu_too(monkeypatch):
    monkeypatch.setattr(backend_defaults, "tensorrt_available", lambda: False)
    strategy = default_strategy("cpu")
    assert type(strategy) is HighestThroughputStrategy and strategy.profile_at_recorded_shapes is True
    assert [b.describe() for b in strategy.backends] == ["TorchInductorBackend()"]
    assert strategy.min_speedup == strategy.stop_when_speedup_over == strategy_defaults.DEFAULT_MIN_SPEEDUP["cpu"]
    assert strategy.min_eager_latency_us == strategy_defaults.DEFAULT_MIN_EAGER_LATENCY_US["cpu"]
    assert 1.03 <= strategy.min_speedup <= 1.05
    assert strategy.dispatch_overhead_us == strategy_defaults.JIT_DISPATCH_OVERHEAD_US > 0


def test_min_speedup_and_min_eager_latency_options(monkeypatch):
    monkeypatch.setattr(backend_defaults, "tensorrt_available", lambda: False)
    jit_config.min_speedup = 1.2
    jit_config.min_eager_latency_us = 0
    strategy = jit_config.resolve_strategy(torch.device("cpu"))
    assert strategy.min_speedup == 1.2 and strategy.min_eager_latency_us == 0 and strategy.skip_single_layer
    jit_config.skip_single_layer = False
    assert not jit_config.resolve_strategy(torch.device("cpu")).skip_single_layer
    for name, bad in (("min_speedup", 0.9), ("min_speedup", "fast"), ("min_eager_latency_us", -1)):
        with pytest.raises(ConfigError, match=name):
            setattr(jit_config, name, bad)
    monkeypatch.setenv("AITUNE_JIT_MIN_SPEEDUP", "1.1")
    monkeypatch.setenv("AITUNE_JIT_MIN_EAGER_LATENCY_US", "none")
    fresh = JitConfig()
    assert fresh.min_speedup == 1.1 and fresh.min_eager_latency_us is None


def test_every_default_comes_from_one_place(monkeypatch):
    from aitune_aot import module as aot_module
    from aitune_core.strategies.first_wins import FirstWinsStrategy as FirstWins

    calls = []
    original = backend_defaults.default_backends

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(backend_defaults, "default_backends", spy)
    monkeypatch.setattr(strategy_defaults, "default_backends", spy)
    jit_config.resolve_strategy(torch.device("cpu"))
    assert type(aot_module.default_strategy()) is FirstWins
    FirstWins()
    HighestThroughputStrategy()
    assert len(calls) == 4


def test_default_strategy_cuda_measures_speed_over_inductor_and_cuda_graphs(monkeypatch):
    monkeypatch.setattr(backend_defaults, "tensorrt_available", lambda: False)
    strategy = default_strategy("cuda")
    assert type(strategy) is HighestThroughputStrategy
    assert strategy.measures_speed
    assert strategy.profile_at_recorded_shapes is True
    # CUDA graphs first: the likely winner, so the early stop usually saves the second compile
    assert [b.describe() for b in strategy.backends] == [
        "TorchInductorBackend(mode='reduce-overhead')",
        "TorchInductorBackend()",
    ]
    assert strategy.stop_when_speedup_over == config_module.CUDA_EARLY_STOP_SPEEDUP == strategy.min_speedup


def test_precision_adds_autocast_candidates(monkeypatch):
    monkeypatch.setattr(backend_defaults, "tensorrt_available", lambda: False)
    cpu = default_backends("cpu", precision="bf16")
    # opting in puts the lower-precision candidates first; fp32 stays as the fallback
    assert [b.config.autocast_enabled for b in cpu] == [True, False]
    assert cpu[0].config.autocast_dtype == torch.bfloat16
    cuda = default_backends("cuda", precision="fp16")
    assert [(b.config.mode, b.config.autocast_dtype) for b in cuda] == [
        ("reduce-overhead", torch.float16),
        (None, torch.float16),
        ("reduce-overhead", None),
        (None, None),
    ]
    # the autocast candidate validates with the tolerance of its dtype, wider than fp32's
    assert cpu[0].tolerance(torch.float32).rtol > cpu[1].tolerance(torch.float32).rtol


def test_resolve_strategy(monkeypatch):
    monkeypatch.setattr(backend_defaults, "tensorrt_available", lambda: False)
    assert type(jit_config.resolve_strategy(torch.device("cpu"))) is HighestThroughputStrategy
    jit_config.backends = [TorchEagerBackend()]
    strategy = jit_config.resolve_strategy(torch.device("cpu"))
    assert type(strategy) is FirstWinsStrategy
    assert [type(b) for b in strategy.backends] == [TorchEagerBackend]
    chosen = HighestThroughputStrategy([TorchEagerBackend()])
    jit_config.strategy = chosen
    assert jit_config.resolve_strategy(torch.device("cpu")) is chosen


def test_environment_variable_for_an_object_option_is_not_silently_ignored(monkeypatch, caplog):
    monkeypatch.setenv("AITUNE_JIT_STRATEGY", "HighestThroughputStrategy")
    with caplog.at_level("WARNING", logger="aitune.jit"):
        cfg = JitConfig()
    assert cfg.strategy is None
    assert "AITUNE_JIT_STRATEGY is ignored" in caplog.text


_ENV_SCRIPT = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
torch.manual_seed(1)
inputs = [torch.randn(b, 64) for b in (2, 4, 2, 3, 4)]
with torch.no_grad():
    outputs = [model(x) for x in inputs]
torch.nn.Linear(2, 2)(torch.ones(1, 2))
torch.save(outputs, {out!r})
print("SCRIPT-DONE")
"""


def _reference_outputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    torch.manual_seed(1)
    inputs = [torch.randn(b, 64) for b in (2, 4, 2, 3, 4)]
    with torch.no_grad():
        return [model(x) for x in inputs]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"AITUNE_JIT_MIN_SAMPLES": "abc"}, "AITUNE_JIT_MIN_SAMPLES='abc' is ignored"),
        ({"AITUNE_JIT_MIN_SAMPLE": "5"}, "AITUNE_JIT_MIN_SAMPLE is not an aitune JIT option"),
    ],
)
def test_env_var_mode_with_a_bad_variable_runs_to_completion_with_one_warning(tmp_path, extra, needle):
    """Acceptance 3: the script completes, its outputs are the eager ones, and the variable is reported once."""
    import os
    import subprocess
    import sys

    out = tmp_path / "outputs.pt"
    script = tmp_path / "script.py"
    script.write_text(_ENV_SCRIPT.format(out=str(out)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITUNE_JIT_")}
    env.update(
        AUTOWRAPT_BOOTSTRAP="aitune_enable_jit_tuning",
        AITUNE_JIT_CACHE_DIR=str(tmp_path / "cache"),
        AITUNE_JIT_BACKENDS="TorchEagerBackend",
        AITUNE_JIT_DETECT_GRAPH_BREAKS="0",
        AITUNE_JIT_BLOCKING="1",  # the script ends right after its calls: tune in them, to see tuning ran
        **extra,
    )
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "SCRIPT-DONE" in result.stdout
    assert result.stderr.count(needle) == 1, result.stderr[-4000:]
    assert "aitune JIT tuning summary: 1 module(s) tuned" in result.stderr  # tuning ran (with the defaults)
    for got, expected in zip(torch.load(out), _reference_outputs(), strict=True):
        torch.testing.assert_close(got, expected)
