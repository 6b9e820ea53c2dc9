"""benchmarks/probes/quantized_backends.py: skip rules, error measures, table, and a tiny CPU run end to end."""

import json

import pytest
import torch

from benchmarks.probes import quantized_backends as qb

pytest.importorskip("torchao")


def test_float8_is_skipped_without_a_capable_gpu(monkeypatch):
    assert qb.skip_reason("torchao:float8-dynamic", torch.device("cpu")) == "float8 needs a CUDA device"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "has 8.0" in qb.skip_reason("torchao:float8-dynamic", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert qb.skip_reason("torchao:float8-dynamic", torch.device("cuda")) is None
    assert qb.skip_reason("torchao:int8-weight-only", torch.device("cpu")) is None
    assert qb.skip_reason("torchao:float8-dynamic-row", torch.device("cpu")) == "float8 needs a CUDA device"


def test_every_torchao_contender_has_a_config():
    from torchao.quantization import PerRow

    for contender in qb.TORCHAO_CONTENDERS:
        assert qb.torchao_config(contender) is not None
    assert isinstance(qb.torchao_config("torchao:float8-dynamic-row").granularity[0], PerRow)


def test_errors_are_relative_to_the_reference_scale():
    ref = torch.tensor([[1.0, -4.0], [2.0, 0.0]])
    out = ref + torch.tensor([[0.0, 0.4], [0.0, 0.1]])
    e = qb.errors(out, (ref,))
    assert e["max_abs_err"] == pytest.approx(0.4)
    assert e["max_rel_err"] == pytest.approx(0.1)
    assert e["rel_l2"] == pytest.approx((0.4**2 + 0.1**2) ** 0.5 / (1 + 16 + 4) ** 0.5)


def test_tiny_cpu_run_writes_rows_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "q.json"
    code = qb.main(["--cpu", "--models", "tiny_resnet", "--contenders", "torchao:int8-weight-only",
                    "torchao:float8-dynamic", "--no-compile", "--batch", "4", "--warmup", "1", "--settle", "1",
                    "--iters", "2", "--out", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "quantized_backends" and doc["device"]["type"] == "cpu" and doc["packages"]["torch"]
    assert doc["git_commit"] and doc["args"]["batch"] == 4
    rows = {r["contender"]: r for r in doc["rows"]}
    assert rows["eager"]["status"] == "ok" and rows["eager"]["speedup"] == 1.0
    int8 = rows["torchao:int8-weight-only"]
    assert int8["status"] == "ok", int8
    assert 0 < int8["max_rel_err"] < 0.1 and int8["throughput"] > 0
    assert int8["backend"] == "TorchAOBackend(quantization_config=Int8WeightOnlyConfig(),compile=False)"
    assert rows["torchao:float8-dynamic"]["status"] == "skipped"
    assert "tiny_resnet | torchao:int8-weight-only" in capsys.readouterr().out


def test_a_rejected_candidate_is_timed_for_reference_only(tmp_path, capsys):
    from aitune_core.config import config

    out = tmp_path / "q.json"
    argv = ["--cpu", "--models", "tiny_resnet", "--contenders", "torchao:int8-weight-only", "--no-inductor",
            "--no-compile", "--batch", "4", "--warmup", "1", "--settle", "1", "--iters", "2", "--out", str(out)]
    with config.override(quantized_rtol=0.0, quantized_atol=0.0):  # nothing quantized passes this
        assert qb.main(argv) == 0
        row = {r["contender"]: r for r in json.loads(out.read_text())["rows"]}["torchao:int8-weight-only"]
        assert row["status"] == "rejected" and "ValidationError" in row["error"]
        reference = row["reference"]
        assert reference["latency_ms"] > 0 and 0 < reference["max_rel_err"] < 0.1
        assert "rejected (timed for reference only)" in capsys.readouterr().out
        assert qb.main([*argv, "--no-time-rejected"]) == 0
        row = {r["contender"]: r for r in json.loads(out.read_text())["rows"]}["torchao:int8-weight-only"]
        assert row["status"] == "rejected" and "reference" not in row
