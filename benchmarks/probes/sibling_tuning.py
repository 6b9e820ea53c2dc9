"""Time to tuned of a 1-block vs a 24-block tiny transformer under the JIT (blocking mode), CPU.

    python -m benchmarks.probes.sibling_tuning [--scenario blocks root] [--blocks 1 24] [--repeats 2] [--out FILE]

Identical siblings share one tuning decision (aitune_jit/decisions.py): the first block is tuned, the others
reuse its decision, validated on their own samples. This probe measures what that buys where it matters:

- `blocks`: a decoder stack of transformers' `LlamaDecoderLayer`s (hidden 64) whose own forward trims padding
  with a data-dependent length (a graph break, as many real roots have): the root stays eager and its blocks
  are tuned - the first with the strategy, the others through the first one's decision.
- `root`: transformers' `LlamaModel` called with `use_cache=False`: the root has no graph break and is tuned
  whole (one Inductor graph over every block).

Each case runs in a fresh process with empty aitune and Inductor caches (a cold start, as in a new deployment),
`OMP_NUM_THREADS=1`, `jit_config.blocking` (tuning happens inside the call that makes a graph ready), the
default strategy. The same inputs are called until no node records any more; time to tuned is the wall time of
those calls (eager time included: it is tiny next to tuning). The cases are interleaved (1, 24, 1, 24, ...) and
the medians are compared: target ratio (24 blocks / 1 block) <= 3 (issue 15, acceptance 5). Also reported: the
seconds the tuning history reports (probes, strategy runs, reused builds), how many nodes ran the strategy, how
many reused a decision, and how many ended tuned.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common

SCENARIOS = ("blocks", "root")
HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 64, 4, 2, 128, 96
BATCH, LENGTHS = 4, (32, 24)
MAX_CALLS = 12
TARGET_RATIO = 3.0
_SECONDS = re.compile(r"(?:took|after|in) (\d+(?:\.\d+)?)s\b")


def _config(blocks: int) -> Any:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=blocks,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                         max_position_embeddings=128)
    config._attn_implementation = "sdpa"  # what from_pretrained sets (layers built directly would log a warning)
    return config


def _decoder(blocks: int) -> Any:
    """The `blocks` scenario's model: an unpadding decoder stack of `LlamaDecoderLayer`s."""
    import torch
    from transformers.models.llama import modeling_llama as llama

    config = _config(blocks)

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
            self.rotary = llama.LlamaRotaryEmbedding(config)
            self.layers = torch.nn.ModuleList(llama.LlamaDecoderLayer(config, i) for i in range(blocks))
            self.norm = llama.LlamaRMSNorm(HIDDEN)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            keep = int(attention_mask.sum(-1).max())  # drop the padding columns: data-dependent (graph break)
            hidden = self.embed(input_ids[:, :keep])
            positions = torch.arange(keep).unsqueeze(0)
            rotary = self.rotary(hidden, positions)
            for layer in self.layers:
                hidden = layer(hidden, position_embeddings=rotary, position_ids=positions)
            return self.norm(hidden)

    return Decoder().eval()


def _model(scenario: str, blocks: int) -> tuple[Any, Any]:
    """The model and a function that calls it with inputs of length `n`."""
    import torch

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    if scenario == "root":
        from transformers import LlamaModel

        model = LlamaModel(_config(blocks)).eval()
        return model, lambda n: model(torch.randint(3, VOCAB, (BATCH, n), generator=generator), use_cache=False)
    model = _decoder(blocks)
    return model, lambda n: model(torch.randint(3, VOCAB, (BATCH, n), generator=generator),
                                  torch.ones(BATCH, n, dtype=torch.long))


def _settled() -> bool:
    """No node records any more: every candidate was tuned or went eager."""
    from aitune.torch import PatchedModule

    return not any(node.state.name in ("RECORDING", "INIT") for node in PatchedModule.walk())


def tuning_seconds(history: list[str]) -> float:
    """The seconds the tuning history reports: graph-break probes, strategy runs, builds of reused decisions."""
    return sum(float(m) for line in history for m in _SECONDS.findall(line))


def child(scenario: str, blocks: int) -> dict[str, Any]:
    """One case in this (fresh) process: call until settled; what it cost and what tuning did."""
    import torch

    from aitune.torch import PatchedModule, jit_config
    from aitune.torch.jit import enable

    torch.set_num_threads(1)
    jit_config.blocking = True
    _model_kept, call = _model(scenario, blocks)
    with torch.no_grad():
        start = time.perf_counter()
        call(LENGTHS[0])
        eager_call_s = time.perf_counter() - start
        enable()
        start = time.perf_counter()
        calls = 0
        while calls < MAX_CALLS:
            call(LENGTHS[calls % len(LENGTHS)])
            calls += 1
            if calls >= 2 and _settled():
                break
        to_tuned = time.perf_counter() - start
    history = PatchedModule.history
    nodes = list(PatchedModule.walk())
    return {
        "scenario": scenario, "blocks": blocks, "time_to_tuned_s": round(to_tuned, 3),
        "tuning_s": round(tuning_seconds(history), 3), "calls": calls, "settled": _settled(),
        "eager_call_ms": round(1000 * eager_call_s, 3),
        "strategy_runs": sum(1 for h in history if h.startswith("Tuning ")),
        "reused_decisions": sum(1 for h in history if "reused the decision of" in h),
        "graph_break_checks": sum(1 for h in history if "Checking took" in h),
        "tuned_nodes": sum(1 for node in nodes if node.state.name == "TUNED"),
        "tuned": sorted({node.short.split()[0] for node in nodes if node.state.name == "TUNED"}),
    }


def _run_case(scenario: str, blocks: int, timeout: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="aitune-siblings-") as scratch:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AITUNE_JIT_", "TORCHINDUCTOR_"))}
        env.update(OMP_NUM_THREADS="1", AITUNE_JIT_CACHE_DIR=str(Path(scratch) / "jit"))
        command = [sys.executable, "-m", "benchmarks.probes.sibling_tuning", "--child", scenario, str(blocks)]
        done = subprocess.run(command, env=env, cwd=common.REPO, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"scenario": scenario, "blocks": blocks, "error": done.stderr[-2000:]}
    return json.loads(lines[-1])


def _summary(rows: list[dict[str, Any]], scenarios: list[str], blocks: list[int]) -> list[dict[str, Any]]:
    """Per scenario and block count: medians over repeats, and the ratio to the smallest block count."""
    out = []
    for scenario in scenarios:
        base = None
        for n in blocks:
            runs = [r for r in rows if r["scenario"] == scenario and r["blocks"] == n and "error" not in r]
            if not runs:
                out.append({"scenario": scenario, "blocks": n, "error": True})
                continue
            median = statistics.median(r["time_to_tuned_s"] for r in runs)
            base = median if base is None else base
            last = runs[-1]
            out.append({"scenario": scenario, "blocks": n, "runs": len(runs), "time_to_tuned_s": round(median, 3),
                        "tuning_s": round(statistics.median(r["tuning_s"] for r in runs), 3),
                        "ratio": round(median / base, 3), "strategy_runs": last["strategy_runs"],
                        "reused_decisions": last["reused_decisions"], "tuned_nodes": last["tuned_nodes"],
                        "tuned": last["tuned"], "settled": all(r["settled"] for r in runs)})
    return out


def _table(summary: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Time to tuned, CPU, one thread (target: ratio <= {TARGET_RATIO:g})")
    for column in ("scenario", "blocks", "time to tuned s", "tuning s", "ratio", "strategy runs", "reused",
                   "tuned nodes", "tuned"):
        table.add_column(column)
    for row in summary:
        if row.get("error"):
            table.add_row(row["scenario"], str(row["blocks"]), "failed", "", "", "", "", "", "")
            continue
        table.add_row(row["scenario"], str(row["blocks"]), f"{row['time_to_tuned_s']:.1f}", f"{row['tuning_s']:.1f}",
                      f"{row['ratio']:.2f}x", str(row["strategy_runs"]), str(row["reused_decisions"]),
                      str(row["tuned_nodes"]), ", ".join(row["tuned"]))
    Console(width=160).print(table)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1], int(argv[2]))), flush=True)
        return 0
    parser = common.parser(__doc__)
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 24])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per case")
    args = parser.parse_args(argv)
    rows = []
    for _ in range(args.repeats):
        for scenario in args.scenario:
            for n in args.blocks:
                rows.append(_run_case(scenario, n, args.timeout))
                print(json.dumps(rows[-1])[:300], flush=True)
    summary = _summary(rows, args.scenario, args.blocks)
    _table(summary)
    header = common.environment("sibling_tuning", "cpu", args.git_commit)
    doc = {**header, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "target_ratio": TARGET_RATIO, "summary": summary, "runs": rows}
    common.write_result(common.result_path(header, "-".join(args.scenario), out=args.out), doc)
    return 0 if all(not row.get("error") for row in summary) else 1


if __name__ == "__main__":
    raise SystemExit(main())
