"""benchmarks/probes/cudagraph_runtimes.py: Inductor's two CUDA-graph runtimes, side by side (the timing needs CUDA)."""

from benchmarks.probes import cudagraph_runtimes as cgr


def test_plain_runtime_is_cudagraphs_without_trees():
    assert cgr.PLAIN_CUDAGRAPHS == {"triton.cudagraphs": True, "triton.cudagraph_trees": False}
    assert cgr.ROWS[0] == "compile:reduce-overhead"  # the ratios are taken to torch.compile's own mode


def test_table_lists_every_row_with_its_per_round_ratios():
    rows = {"compile:reduce-overhead": {"median_ms": 1.0, "ratios_to_first": [1.0, 1.0], "max_rel_err": 1e-4},
            "aitune:plain-cudagraphs": {"median_ms": 0.8, "ratios_to_first": [1.25, 1.2], "max_rel_err": 2e-4}}
    text = cgr.table([{"model": "m", "batch": 8, "precision": "fp32", "rows": rows}])
    assert "| m | 8 | fp32 | aitune:plain-cudagraphs | 0.800 | 1.25, 1.20 | 2.0e-04 |" in text
    assert text.count("\n") == 3


def test_main_refuses_cuda_without_a_gpu(monkeypatch):
    import pytest

    monkeypatch.setattr(cgr.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        cgr.main(["--device", "cuda"])
