"""JIT steady state vs plain eager on the CPU, per real workload, interleaved in one process per workload.

    python -m benchmarks.probes.cpu_steady_state [--workloads gpt2 llama ...] [--rounds 15] [--steps 2] [--out FILE]

The CI-sized workloads of benchmarks/real_workloads/workload.py (same tiny configurations, random weights), run
the way users run them: greedy `generate()` (GPT-2, LLaMA, T5, BART), a DDIM loop step of a tiny UNet
(classifier-free guidance, batch 2), a BERT classifier over varying sequence lengths, a sentence-transformers
style encoder that adds keys to its input dict, and a residual MLP. Per workload, in a fresh process with
`OMP_NUM_THREADS=1`:

1. the model is copied before the JIT is switched on (the copy stays plain torch);
2. the JIT is switched on (`aitune.torch.jit.enable`, the env-var mode, with `jit_config.blocking`) and the
   workload's step (a few calls with fixed inputs) is repeated until tuning has settled (no node records, and
   `QUIET_STEPS` steps in a row tuned nothing);
3. `--rounds` rounds, each timing the same number of steps of the plain copy and of the JIT model (at least
   `--steps`, and enough for `--min-round-s` of plain time), the order flipping every round. While the plain
   copy runs, `torch.nn.Module.__call__` is torch's own again (not aitune's hook), so that side is exactly
   plain eager.

The figure is the median over rounds of (plain median step time / JIT median step time): values >= 1 mean the
JIT is at least as fast. Target (issue 15, acceptance 4): >= 0.97 for every workload.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.probes.sibling_tuning import tuning_seconds

TARGET = 0.97
MAX_WARMUP_STEPS = 60
#: steps in a row that tuned nothing (and no node recording) before tuning counts as settled
QUIET_STEPS = 4
Step = Callable[[Any], Any]


def _generate_step(vocab: int, lengths: tuple[int, ...] = (5, 7, 9), new_tokens: int = 6) -> Step:
    import torch

    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (1, n), generator=generator) for n in lengths]

    def step(m: Any) -> Any:
        return [m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                           pad_token_id=0) for ids in prompts]

    return step


def gpt2() -> tuple[Any, Step]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=96, n_positions=64)
    return GPT2LMHeadModel(config).eval(), _generate_step(config.vocab_size)


def llama() -> tuple[Any, Step]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=96, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval(), _generate_step(config.vocab_size)


def t5() -> tuple[Any, Step]:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=96, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(config).eval(), _generate_step(config.vocab_size)


def bart() -> tuple[Any, Step]:
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=96, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                        max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=1,
                        decoder_start_token_id=2, forced_eos_token_id=None)
    return BartForConditionalGeneration(config).eval(), _generate_step(config.vocab_size)


def bert() -> tuple[Any, Step]:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=160)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(3, 96, (8, n), generator=generator) for n in (32, 128, 64, 96)]

    def step(m: Any) -> Any:
        return [m(input_ids=ids, attention_mask=torch.ones_like(ids)).logits for ids in batches]

    return BertForSequenceClassification(config).eval(), step


def unet() -> tuple[Any, Step]:
    import torch
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
    ).eval()
    generator = torch.Generator().manual_seed(1)
    text = torch.randn(2, 5, 32, generator=generator)
    latents = torch.randn(1, 4, 8, 8, generator=generator)
    timesteps = [torch.tensor(t) for t in (75, 50, 25, 0)]

    def step(m: Any) -> Any:  # one image's denoising calls (the scheduler's arithmetic is the same either way)
        x = latents
        for t in timesteps:
            uncond, cond = m(torch.cat([x] * 2), t, encoder_hidden_states=text).sample.chunk(2)
            x = x - 0.1 * (uncond + 7.5 * (cond - uncond))
        return x

    return model, step


def sentence_encoder() -> tuple[Any, Step]:
    import torch

    from benchmarks.real_workloads.workload import Pooling  # the workloads' sentence-transformers-style module

    generator = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, 64, (2, n), generator=generator) for n in (6, 9, 7, 12)]

    def step(m: Any) -> Any:
        return [m({"input_ids": x})["sentence_embedding"] for x in ids]

    return Pooling().eval(), step


def mlp() -> tuple[Any, Step]:
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(128, 512), torch.nn.Linear(512, 128)
            self.norm = torch.nn.LayerNorm(128)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    model = torch.nn.Sequential(*(Block() for _ in range(4))).eval()
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(b, 128, generator=generator) for b in (16, 8, 12)]
    return model, lambda m: [m(x) for x in inputs]


WORKLOADS: dict[str, Callable[[], tuple[Any, Step]]] = {
    f.__name__: f for f in (gpt2, llama, t5, bart, bert, unet, sentence_encoder, mlp)
}


@contextlib.contextmanager
def _plain_torch(original: Any) -> Iterator[None]:
    """`torch.nn.Module.__call__` is `original` (torch's own, taken before the JIT was switched on) for the
    duration; aitune's hook is put back afterwards."""
    import torch

    patched = torch.nn.Module.__call__
    torch.nn.Module.__call__ = original
    try:
        yield
    finally:
        torch.nn.Module.__call__ = patched


def _timed(step: Step, model: Any, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(model)
        times.append(time.perf_counter() - start)
    return times


def _warm_up(step: Step, model: Any) -> tuple[int, float]:
    """Step the JIT model until tuning settled; (steps, seconds)."""
    from aitune.torch import PatchedModule, jit_config

    # a graph whose later calls fall outside its tuned ranges is tuned again after `retune_after_misses` of them:
    # the warm-up lasts long enough for that to happen (a step has at least one such call)
    least = jit_config.retune_after_misses + QUIET_STEPS
    start, quiet, steps = time.perf_counter(), 0, 0
    while steps < MAX_WARMUP_STEPS and (quiet < QUIET_STEPS or steps < least):
        before = len(PatchedModule.history)
        step(model)
        steps += 1
        recording = any(n.state.name in ("RECORDING", "INIT") for n in PatchedModule.walk())
        quiet = quiet + 1 if len(PatchedModule.history) == before and not recording else 0
    return steps, time.perf_counter() - start


def child(name: str, rounds: int, steps: int, min_round_s: float) -> dict[str, Any]:
    import torch

    from aitune.torch import PatchedModule, jit_config
    from aitune.torch.jit import enable

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, step = WORKLOADS[name]()
    plain = copy.deepcopy(model)
    original_call = torch.nn.Module.__call__  # torch's own, before the JIT patches it
    jit_config.blocking = True
    with torch.no_grad():
        enable()
        warmup_steps, warmup_s = _warm_up(step, model)
        with _plain_torch(original_call):
            plain_step_s = statistics.median(_timed(step, plain, 3))
        steps = max(steps, math.ceil(min_round_s / max(plain_step_s, 1e-6)))
        settled_events = len(PatchedModule.history)
        ratios, plain_all, jit_all = [], [], []
        retuned_rounds = 0
        for index in range(rounds):
            events = len(PatchedModule.history)
            sides = ("plain", "jit") if index % 2 == 0 else ("jit", "plain")
            measured: dict[str, list[float]] = {}
            for side in sides:
                if side == "plain":
                    with _plain_torch(original_call):
                        measured[side] = _timed(step, plain, steps)
                else:
                    measured[side] = _timed(step, model, steps)
            if len(PatchedModule.history) > events:  # tuning happened during the round: not a steady state
                retuned_rounds += 1
                continue
            ratios.append(statistics.median(measured["plain"]) / statistics.median(measured["jit"]))
            plain_all += measured["plain"]
            jit_all += measured["jit"]
    nodes = list(PatchedModule.walk())
    return {
        "workload": name, "speed_jit_over_plain": round(statistics.median(ratios or [math.nan]), 4),
        "ratio_spread": [round(min(ratios or [math.nan]), 4), round(max(ratios or [math.nan]), 4)],
        "plain_step_ms": round(1000 * statistics.median(plain_all), 3),
        "jit_step_ms": round(1000 * statistics.median(jit_all), 3), "rounds": rounds, "steps_per_round": steps,
        "warmup_steps": warmup_steps, "warmup_s": round(warmup_s, 2),
        "tuning_s": round(tuning_seconds(PatchedModule.history), 2),
        "events_during_rounds": len(PatchedModule.history) - settled_events, "rounds_dropped": retuned_rounds,
        "tuned": sorted(n.path for n in nodes if n.state.name == "TUNED"),
        "tuned_detail": [n.reports[-1].backend.describe() if n.reports else "" for n in nodes
                         if n.state.name == "TUNED"],
    }


def _run(name: str, args: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="aitune-steady-") as scratch:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AITUNE_JIT_", "TORCHINDUCTOR_"))}
        env.update(OMP_NUM_THREADS="1", AITUNE_JIT_CACHE_DIR=str(Path(scratch) / "jit"))
        command = [sys.executable, "-m", "benchmarks.probes.cpu_steady_state", "--child", name, str(args.rounds),
                   str(args.steps), str(args.min_round_s)]
        done = subprocess.run(command, env=env, cwd=common.REPO, capture_output=True, text=True,
                              timeout=args.timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"workload": name, "error": done.stderr[-3000:]}
    return json.loads(lines[-1])


def _table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"JIT steady state vs plain eager, CPU, one thread (target >= {TARGET:g}x)")
    for column in ("workload", "JIT speed vs plain", "round spread", "plain ms/step", "JIT ms/step", "tuning s",
                   "tuned modules"):
        table.add_column(column)
    for row in rows:
        if "error" in row:
            table.add_row(row["workload"], "failed", "", "", "", "", "")
            continue
        low, high = row["ratio_spread"]
        table.add_row(row["workload"], f"{row['speed_jit_over_plain']:.3f}x", f"{low:.2f}..{high:.2f}",
                      f"{row['plain_step_ms']:.2f}", f"{row['jit_step_ms']:.2f}", f"{row['tuning_s']:.1f}",
                      ", ".join(row["tuned"]) or "-")
    Console(width=180).print(table)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))), flush=True)
        return 0
    parser = common.parser(__doc__)
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=2, help="at least this many steps per side and round")
    parser.add_argument("--min-round-s", type=float, default=0.1, help="at least this much plain time per round")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per workload")
    args = parser.parse_args(argv)
    rows = []
    for name in args.workloads:
        rows.append(_run(name, args))
        print(json.dumps(rows[-1])[:400], flush=True)
    _table(rows)
    header = common.environment("cpu_steady_state", "cpu", args.git_commit)
    doc = {**header, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "target": TARGET, "rows": rows}
    common.write_result(common.result_path(header, out=args.out), doc)
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
