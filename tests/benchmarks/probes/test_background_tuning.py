"""benchmarks/probes/background_tuning.py: the request schedule, the stall sampler, a run killed by a signal."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import pytest
import torch

from benchmarks.probes import background_tuning as bench


def test_request_shapes_follow_the_schedule():
    rng = torch.Generator().manual_seed(0)
    assert [bench._shape("mixed", i, rng)[0] for i in range(8)] == [1, 1, 1, 32, 1, 1, 1, 32]
    lengths = {bench._shape("varlen", i, rng)[1] for i in range(200)}
    assert min(lengths) >= 32 and max(lengths) <= 128 and len(lengths) > 20


def test_stall_sampler_records_where_a_slow_request_waits():
    sampler = bench.StallSampler(stall_s=0.02, period_s=0.005)
    gate = threading.Event()
    sampler.current = (3, time.perf_counter())
    gate.wait(0.15)  # a "request" that waits here for 150 ms
    sampler.current = None
    samples = sampler.samples[3]
    assert 1 <= len(samples) <= 3 and samples[0]["after_ms"] >= 20
    assert any("test_stall_sampler_records_where_a_slow_request_waits" in frame for frame in samples[0]["main"])
    assert 0 not in sampler.samples  # requests that ran fast are not sampled


def test_a_run_killed_by_a_signal_keeps_the_faulthandler_stacks(tmp_path, monkeypatch):
    stacks = "Fatal Python error: Segmentation fault\n" + "  File x.py, line 1 in f\n" * 400

    def fake_run(command, env, **kwargs):
        assert env["PYTHONFAULTHANDLER"] == "1"
        out = command[command.index("--out") + 1]
        Path(out).write_text('{"rows": []}')
        torch.save([], command[command.index("--check-out") + 1])
        return type("Done", (), {"returncode": -11, "stderr": stacks})()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    args = argparse.Namespace(requests=10, after=5, device="cpu", interval_ms=20.0,
                              stall_ms=50.0, timeout_s=60.0, packages="off")
    data = bench._run("jit-cold", "tiny_resnet", "mixed", args, tmp_path)
    assert data["exit_status"] == -11
    assert "launch_to_start_s" not in data  # (the fake child wrote no start time)
    assert len(data["stderr_tail"]) > 1000 and data["stderr_tail"].endswith(stacks[-100:])


def test_a_run_without_a_result_keeps_its_first_traceback(tmp_path, monkeypatch):
    stderr = ("Traceback (most recent call last):\n  File serve.py\nRuntimeError: boom\n"
              + "New child module: ReLU\n" * 500 + "aitune JIT tuning summary\n")

    def fake_run(command, env, **kwargs):
        return type("Done", (), {"returncode": 1, "stderr": stderr})()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    args = argparse.Namespace(requests=10, after=5, device="cpu", interval_ms=20.0,
                              stall_ms=50.0, timeout_s=60.0, packages="off")
    data = bench._run("jit-cold", "tiny_resnet", "mixed", args, tmp_path)
    assert data["exit_status"] == 1
    assert data["error"].startswith("Traceback") and "RuntimeError: boom" in data["error"]
    assert data["error"].endswith("aitune JIT tuning summary\n")


def test_the_step_is_none_while_the_progress_module_is_half_imported(monkeypatch):
    import types

    monkeypatch.setitem(bench.sys.modules, "aitune_core.strategies.progress", types.ModuleType("half"))
    assert bench._job_phase() is None


def test_the_probe_reads_the_jobs_step():
    from aitune_core.strategies.progress import progress

    with progress("Validating X"):
        assert bench._job_phase() == "Validating X"


def test_a_failed_cudagraph_pool_check_is_kept_whole_and_still_raised(monkeypatch):
    import torch._inductor.cudagraph_trees as trees
    from torch._inductor import config

    def failing_check(*args, **kwargs):
        raise RuntimeError("Detected 2 tensor(s) in the cudagraph pool not tracked as outputs\nhistory: ...")

    monkeypatch.setattr(trees, "check_memory_pool", failing_check)
    monkeypatch.setattr(config.triton, "cudagraph_trees_history_recording", False)
    failures = bench._watch_cudagraph_pool()
    assert config.triton.cudagraph_trees_history_recording is True
    with pytest.raises(RuntimeError, match="not tracked"):
        trees.check_memory_pool(0, (0, 0), [])
    assert len(failures) == 1 and "history: ..." in failures[0] and "RuntimeError" in failures[0]


def test_a_request_is_due_when_its_inputs_are_ready_if_they_outlast_the_pause():
    assert bench.request_due(10.0, 9.5) == 10.0  # inputs ready within the pause: due as scheduled
    assert bench.request_due(10.0, 10.25) == 10.25  # inputs made after the pause ended: their time is not lateness
