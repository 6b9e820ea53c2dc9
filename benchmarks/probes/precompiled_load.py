"""Does a precompiled function of a transformers model load in a fresh process on this torch?

Each row makes the precompiled function of one tiny transformers model (random weights, from a config) with
`aitune_core.precompiling.make_precompiled`, then loads it in a fresh process (`PrecompiledBackend.build`, which
validates it on the recorded calls) and compares an unseen call with eager. `--keep-defaults-guards` keeps the
guards on functions' default values that `savable_guards` leaves out before torch 2.13 (torch 2.11's guard loader
fails on them), to show why they are left out.

    python -m benchmarks.probes.precompiled_load --device cuda
    python -m benchmarks.probes.precompiled_load --models bert --keep-defaults-guards

Results: a table on stdout and a JSON file (benchmarks/results/local/ unless `--out` names one), with the
environment header of benchmarks/common.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks import common

MODELS = ("bert", "gpt2")


def build(name: str, device: torch.device) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    if name == "bert":
        config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=128, vocab_size=100)
        return transformers.BertModel(config).eval().to(device)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=100, n_positions=64)
    return transformers.GPT2Model(config).eval().to(device)


def call(batch: int, device: torch.device) -> tuple[tuple, dict[str, torch.Tensor]]:
    ids = torch.randint(1, 100, (batch, 12), device=device)
    return (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _recorded(model: torch.nn.Module, device: torch.device) -> tuple[Any, list[Any]]:
    from aitune_core.recording.graph_recorder import GraphRecorder

    torch.manual_seed(1)
    recorder = GraphRecorder(model)
    with torch.no_grad():
        for batch in (2, 4, 8):
            args, kwargs = call(batch, device)
            recorder.record(args, kwargs, model(*args, **kwargs))
    spec = recorder.graph_specs[0]
    return spec, recorder.samples(spec)


def _keep_defaults_guards() -> None:
    from aitune_core import precompiling

    precompiling.DEFAULTS_GUARDS_LOAD = True


def load(name: str, device: torch.device, path: Path, digest: str) -> dict[str, Any]:
    """In the fresh process: load and validate the file, then answer an unseen call."""
    from aitune_core.backends.precompiled import PrecompiledBackend, PrecompiledBackendConfig

    model = build(name, device)
    spec, samples = _recorded(model, device)
    start = time.perf_counter()
    try:
        backend = PrecompiledBackend(PrecompiledBackendConfig(artifact=str(path), sha256=digest))
        built = backend.build(model, spec, samples, device, path.parent)
    except Exception as exc:
        traceback.print_exc()
        return {"loaded": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    load_s = time.perf_counter() - start
    args, kwargs = call(3, device)
    with torch.no_grad():
        got, want = built(*args, **kwargs).last_hidden_state, model(*args, **kwargs).last_hidden_state
    return {"loaded": True, "load_s": round(load_s, 3), "max_abs_err": float((got - want).abs().max())}


def row(name: str, device: torch.device, keep: bool, folder: Path) -> dict[str, Any]:
    from aitune_core.precompiling import make_precompiled

    if keep:
        _keep_defaults_guards()
    model = build(name, device)
    spec, samples = _recorded(model, device)
    path = folder / f"{name}-{device.type}-{'keep' if keep else 'default'}.aotc"
    start = time.perf_counter()
    try:
        digest = make_precompiled(model, spec, samples, device, path)
    except Exception as exc:
        traceback.print_exc()
        return {"model": name, "made": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    made_s = time.perf_counter() - start
    done = subprocess.run([sys.executable, "-m", "benchmarks.probes.precompiled_load", "--load", name, str(path),
                           digest, "--device", str(device)] + (["--keep-defaults-guards"] if keep else []),
                          capture_output=True, text=True, cwd=common.REPO, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOAD ")]
    loaded = json.loads(lines[-1][5:]) if lines else {"loaded": False, "error": done.stderr[-400:]}
    if not loaded.get("loaded"):
        print(done.stderr[-3000:], file=sys.stderr)
    return {"model": name, "made": True, "make_s": round(made_s, 3), **loaded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--keep-defaults-guards", action="store_true")
    parser.add_argument("--load", nargs=3, metavar=("MODEL", "FILE", "SHA256"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--git-commit")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.load:
        if args.keep_defaults_guards:
            _keep_defaults_guards()
        print("LOAD " + json.dumps(load(args.load[0], device, Path(args.load[1]), args.load[2])), flush=True)
        return
    header = common.environment("precompiled_load", args.device, args.git_commit)
    with tempfile.TemporaryDirectory(prefix="aitune-precompiled-") as folder:
        rows = [row(name, device, args.keep_defaults_guards, Path(folder)) for name in args.models]
    _table(rows, header)
    variant = "keep-defaults" if args.keep_defaults_guards else None
    common.write_result(common.result_path(header, variant, out=args.out),
                        {**header, "keep_defaults_guards": args.keep_defaults_guards, "rows": rows})


def _table(rows: list[dict[str, Any]], header: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"precompiled functions, torch {header['torch']}, {header['device']['name']}")
    for column in ("model", "made", "loaded", "make s", "load s", "max abs err", "error"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["model"], str(r["made"]), str(r.get("loaded", "-")), str(r.get("make_s", "-")),
                      str(r.get("load_s", "-")), f"{r['max_abs_err']:.2e}" if "max_abs_err" in r else "-",
                      r.get("error", ""))
    Console().print(table)


if __name__ == "__main__":
    main()
