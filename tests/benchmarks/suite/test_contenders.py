"""benchmarks/suite/contenders.py: result rows, the correctness check and the workload's environment."""

from __future__ import annotations

import pytest
import torch

from benchmarks.suite import contenders, models, report


def test_fill_serve_and_check_make_an_ok_row():
    row = contenders.row_template("m", 4, "fp32", "eager")
    served = {"stats": {"median_ms": 2.0, "p10_ms": 1.5, "p90_ms": 3.0}, "first_call_s": 0.5,
              "time_to_steady_s": 0.5, "settled": True, "slow_timed_calls": 0, "n_warmup": 20}
    contenders.fill_serve(row, 4, served)
    assert row["throughput"] == pytest.approx(2000.0)
    ref = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])]
    contenders.fill_check(row, [torch.tensor([1.0, 0.1]), torch.tensor([0.0, 2.0])], ref)
    assert row["rel_err"] == pytest.approx(0.1)
    assert row["status"] == "ok"


def test_fill_serve_keeps_the_start_of_a_long_series_and_its_drift():
    row = contenders.row_template("m", 1, "fp32", "eager")
    timed = [2.0] * 1000 + [1.0] * 1000
    served = {"stats": {"median_ms": 1.5, "p10_ms": 1.0, "p90_ms": 2.0}, "first_call_s": 0.5,
              "time_to_steady_s": 0.5, "settled": True, "slow_timed_calls": 0, "n_warmup": 20,
              "warmup_ms": [5.0], "timed_ms": timed}
    contenders.fill_serve(row, 1, served)
    assert row["series"]["timed_ms"] == timed[: contenders.SERIES_KEPT]
    assert row["timed_chunk_medians_ms"] == [2.0] * 5 + [1.0] * 5


def test_workload_env_never_inherits_the_hook(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOWRAPT_BOOTSTRAP", "aitune_enable_jit_tuning")
    monkeypatch.setenv(contenders.JIT_PRECISION_ENV, "bf16")
    env = contenders.workload_env({}, tmp_path)
    assert "AUTOWRAPT_BOOTSTRAP" not in env and contenders.JIT_PRECISION_ENV not in env
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
    assert contenders.workload_env(contenders.JIT_ENV, None)["AUTOWRAPT_BOOTSTRAP"] == "aitune_enable_jit_tuning"


def test_aot_dataset_is_the_timing_batches_unbatched():
    settings = contenders.Settings(device="cpu", n_inputs=2)
    case = contenders.make_case("tiny_resnet", 3, settings)
    samples = contenders.aot_sample_dataset(case, range(2), "cpu")
    assert len(samples) == 6
    assert torch.equal(samples[4][0], models.build("tiny_resnet", 3).make_inputs(1).args[0][1])
    assert len(case.reference) == len(settings.check_seeds)


def test_jit_summary_is_read_from_the_workload_log(tmp_path):
    log = tmp_path / "w.log"
    log.write_text("serve.py ...\n2026-11-21 10:40:51,320 aitune.jit WARNING: aitune JIT tuning summary: 1 module(s)"
                   " tuned, 45 module(s) seen\n  🎯 BertModel (BertModel, level 0): TorchInductorBackend()\n")
    lines = contenders.jit_summary(log)
    assert lines[0].startswith("aitune JIT tuning summary: 1 module(s) tuned")
    assert lines[1].startswith("🎯 BertModel")
    assert contenders.jit_summary(tmp_path / "missing.log") == []


def test_workload_commands_differ_only_in_what_the_script_is_asked_to_run(tmp_path):
    settings = contenders.Settings(device="cpu", precision="bf16")
    paths = {"out_json": tmp_path / "o.json", "out_pt": tmp_path / "o.pt", "timeout_s": 120.0}
    eager_cmd, eager_env = contenders.workload_command("tiny_vit", 2, settings, "eager (workload)", **paths)
    jit_cmd, jit_env = contenders.workload_command("tiny_vit", 2, settings, "aitune-jit", **paths)
    compile_cmd, compile_env = contenders.workload_command("tiny_vit", 2, settings, report.WORKLOAD_COMPILE,
                                                           **paths)
    assert eager_env == {} and compile_env == {}
    assert jit_env["AUTOWRAPT_BOOTSTRAP"] == "aitune_enable_jit_tuning"
    assert jit_env[contenders.JIT_PRECISION_ENV] == "bf16"  # the JIT gets bf16 from the env, not from autocast
    assert jit_cmd[jit_cmd.index("--autocast") + 1] == "none"
    assert compile_cmd[compile_cmd.index("--autocast") + 1] == "bf16"  # like eager: the same autocast
    assert compile_cmd[-2:] == ["--contender", "compile:default"] and "--contender" not in eager_cmd
    ro_cmd, _ = contenders.workload_command("tiny_vit", 2, settings, "compile:reduce-overhead (workload)", **paths)
    assert ro_cmd[-2:] == ["--contender", "compile:reduce-overhead"]


def test_profile_calls_reach_the_workload_command_and_its_tables_the_row(tmp_path):
    paths = {"out_json": tmp_path / "o.json", "out_pt": tmp_path / "o.pt", "timeout_s": 120.0}
    plain, _ = contenders.workload_command("tiny_vit", 2, contenders.Settings(device="cpu"), "aitune-jit", **paths)
    assert "--profile-calls" not in plain
    settings = contenders.Settings(device="cpu", profile_calls=50)
    cmd, _ = contenders.workload_command("tiny_vit", 2, settings, "compile:reduce-overhead (workload)", **paths)
    assert cmd[cmd.index("--profile-calls") + 1] == "50"
    assert cmd[-2:] == ["--contender", "compile:reduce-overhead"]
    data = {"profile_kernels": ["t", "Self CPU time total: 100.000ms", "Self CUDA time total: 50.000ms"],
            "profile_python": ["p"]}
    row = contenders.fill_profile({}, data, calls=50)
    assert row["profile"] == data and row["profile_per_call_ms"] == {"cpu_ms": 2.0, "cuda_ms": 1.0}
    assert contenders.fill_profile({}, {"serve": {}}, calls=50) == {}


def test_slug_makes_plain_file_name_pieces():
    assert contenders.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert contenders.slug("compile:reduce-overhead (workload)") == "compile-reduce-overhead-workload"
