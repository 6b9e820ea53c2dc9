"""benchmarks/probes/replica_tuning.py: replicas launched together per mode, and what each one's history says."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import ClassVar

import torch

from benchmarks.probes import replica_tuning as probe

HISTORIES = {
    "claims": ["Tuning ResNet took 3.0s: TorchInductorBackend() for graph 0",
               "ResNet graph 0: process 7 on this host (claimed 0s ago) is tuning it with the same cache folder; ..."
               "\nResNet graph 0: reused the decision of ResNet from the cache (/c/d.json): ..."],
    "no-claims": ["Tuning ResNet took 3.0s: TorchInductorBackend() for graph 0"] * 2,
}


class FakeReplica:
    """Stands in for one launched serving process: writes its rows and checks, as the real script does."""

    launched: ClassVar[list[dict[str, str]]] = []

    def __init__(self, command, env, **kwargs):
        mode = "claims" if env["AITUNE_JIT_WAIT_FOR_REPLICAS"] == "1" else "no-claims"
        index = sum(e["AITUNE_JIT_WAIT_FOR_REPLICAS"] == env["AITUNE_JIT_WAIT_FOR_REPLICAS"] for e in self.launched)
        FakeReplica.launched.append(env)
        rows = [{"t": 0.1 * i, "latency_s": 0.01, "late_s": 0.0, "tuned": i >= 5, "tuning": i < 5}
                for i in range(10)]
        Path(command[command.index("--out") + 1]).write_text(json.dumps({"rows": rows, "start_wall": 0.0}))
        torch.save([torch.zeros(2)], command[command.index("--check-out") + 1])
        self.stderr = "JIT Tuning History:\n" + HISTORIES[mode][index] + "\n"
        self.returncode = 0

    def communicate(self, timeout=None):
        return "", self.stderr


def test_each_mode_launches_its_replicas_and_reads_who_tuned(tmp_path, monkeypatch, capsys):
    FakeReplica.launched = []
    monkeypatch.setattr(probe.subprocess, "Popen", FakeReplica)
    args = argparse.Namespace(device="cpu", requests=10, after=5, interval_ms=20.0, timeout_s=60.0, replicas=2)
    eager = {"rows": [], "checks": [torch.zeros(2)]}
    rounds = [probe._round(mode, "tiny_resnet", "mixed", args, tmp_path, eager) for mode in probe.MODES]
    claims, no_claims = rounds
    assert [env["AITUNE_JIT_WAIT_FOR_REPLICAS"] for env in FakeReplica.launched] == ["1", "1", "0", "0"]
    assert len({env["AITUNE_JIT_CACHE_DIR"] for env in FakeReplica.launched}) == 2  # a folder per round
    assert claims["replicas_that_ran_the_strategy"] == 1 and no_claims["replicas_that_ran_the_strategy"] == 2
    waiter = claims["replicas"][1]
    assert waiter["waited"] and waiter["reused"] and not waiter["ran_strategy"]
    assert waiter["max_abs_diff_vs_eager"] == 0.0 and waiter["time_to_tuned_s"] is not None
    probe._print(rounds)
    printed = capsys.readouterr().out
    assert "1 process(es) ran the strategy" in printed and "2 process(es) ran the strategy" in printed
