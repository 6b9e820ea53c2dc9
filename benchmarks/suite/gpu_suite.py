"""GPU benchmark suite: eager vs torch.compile (3 modes) vs aitune JIT (env-var hook) vs aitune AOT.

Models: timm resnet50 and vit_base_patch16_224 (torchvision resnet50 / vit_b_16 when timm is missing; the
results record which), transformers BERT-base from BertConfig() at sequence length 128; batch sizes 1, 8, 32;
random weights, nothing downloaded. Two parts, each meant to finish in under 9 minutes on an H100:

    python -m benchmarks.suite.gpu_suite --part 1                    # resnet50
    python -m benchmarks.suite.gpu_suite --part 2                    # vit_base, bert_base
    python -m benchmarks.suite.gpu_suite --part 1 --precision bf16   # opt-in bf16 autocast comparison

then `python -m benchmarks.suite.report benchmarks/results/local/*.json` prints the merged tables (results
go to benchmarks/results/local/; commit the ones docs/benchmarks.md cites into benchmarks/results/).
See docs/benchmarks.md for the method.
"""

from __future__ import annotations

from benchmarks.suite import suite

DEFAULTS = suite.SuiteDefaults(
    suite="gpu",
    device="cuda",
    models={"1": ["resnet50"], "2": ["vit_base", "bert_base"]},
    batches=[1, 8, 32],
    warmup=20,
    iters=100,
    min_timed_s=2.0,
    settle=20,
    max_warmup_s=120.0,
    budget_s=530.0,
    workload_timeout_s=300.0,
    # The eager (workload) control costs a process start per case; the CPU suite runs it, here it is opt-in.
    contenders=tuple(c for c in suite.ALL_CONTENDERS if c != "eager (workload)"),
    # max-autotune-no-cudagraphs autotunes every GEMM/convolution shape: about two minutes for vit_base /
    # BERT-base at batch 32 and over 4 minutes for resnet50 at batch 1 on the GPUs measured (docs/benchmarks.md).
    # A compile cannot be stopped once started, so its guess is high: it runs only when a part has that much
    # budget left.
    estimates_s={"eager": 10, "eager (workload)": 20, "aitune-jit": 90, "compile:default (workload)": 40,
                 "compile:default": 60, "compile:reduce-overhead": 60, "compile:max-autotune-no-cudagraphs": 330,
                 "aitune-aot": 120},
)

if __name__ == "__main__":
    raise SystemExit(suite.main(DEFAULTS, __doc__))
