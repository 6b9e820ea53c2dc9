"""benchmarks/probes/round_profile.py: a profile of a few rounds counts the runtime calls that wait for the device
and names the costliest host ops."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from benchmarks.probes import round_profile


def _event(key, count, cpu_us, device_us=0.0):
    return SimpleNamespace(key=key, count=count, self_cpu_time_total=cpu_us, self_device_time_total=device_us)


def test_waits_are_counted_per_call_and_kernels_give_the_device_time():
    events = [_event("cudaStreamSynchronize", 40, 500.0), _event("cudaMemcpyAsync", 40, 300.0),
              _event("aten::addmm", 200, 4000.0), _event("cudaLaunchKernel", 600, 900.0),
              _event("triton_poi_fused_add_0", 200, 0.0, 2000.0)]
    summary = round_profile.summarize(events, rounds=2, calls_per_round=20, wall_s=0.1)
    assert summary["waits_per_call"] == {"cudaMemcpyAsync": 1.0, "cudaStreamSynchronize": 1.0}
    assert summary["device_ms_per_round"] == 1.0 and summary["wall_ms_per_round"] == 50.0
    assert summary["top_host_ops"][0] == ["aten::addmm", 200, 4.0]
    assert summary["top_kernels"] == [["triton_poi_fused_add_0", 200, 2.0]]


def test_rounds_run_under_the_profiler_on_the_cpu():
    layer = torch.nn.Linear(8, 8)
    seen = []

    def run_round(index):
        seen.append(index)
        with torch.no_grad():
            layer(torch.randn(2, 8))

    summary = round_profile.profile_rounds(run_round, rounds=2, calls_per_round=1, device=torch.device("cpu"))
    assert seen == [0, 1] and summary["rounds"] == 2 and summary["device_ms_per_round"] == 0.0
    assert any(name == "aten::linear" or name == "aten::addmm" for name, _, _ in summary["top_host_ops"])
