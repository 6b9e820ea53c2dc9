"""Acceptance: tune, save, and load into a freshly initialised instance in a new process (`model = ait.load(fresh,
path)`): a whole model (root wrapped), part of a model, and a diffusers pipeline built tiny from configs. The loaded
model computes what the saved one did, although the fresh instance was initialised with other weights."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from aot_models import build

import aitune.torch as ait
from aitune_core.backends.torch_eager import TorchEagerBackend

HERE = Path(__file__).parent


def _eager() -> ait.FirstWinsStrategy:
    return ait.FirstWinsStrategy([TorchEagerBackend()])


def _data() -> list[torch.Tensor]:
    torch.manual_seed(5)
    return [torch.randn(8) for _ in range(6)]


_CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    import aitune.torch as ait
    from aitune_core.strategies.strategy import TuneStrategy
    from aot_models import build

    def forbidden(*args, **kwargs):
        raise AssertionError("tuning happened during load")

    TuneStrategy.tune = TuneStrategy.tune_with_report = TuneStrategy.run = forbidden
    ckpts, io = json.loads(sys.argv[1]), torch.load(sys.argv[2])
    results = {}
    for scenario, ckpt in ckpts.items():
        if scenario == "pipeline":
            from tiny_diffusers import build_pipeline
            model = ait.load(build_pipeline(seed=11), ckpt)
            with torch.no_grad():
                out = model(*io["pipeline_inputs"])
            wrapped = [type(w.__wrapped__).__name__ for _, w in ait_find(model)]
        else:
            model = ait.load(build(seed=11), ckpt)  # other weights: the checkpoint must restore all of them
            with torch.no_grad():
                out = model(io["x"])
            wrapped = [type(w.__wrapped__).__name__ for _, w in ait_find(model)]
        results[scenario] = {
            "max_abs_diff": (out - io[scenario]).abs().max().item(),
            "returned": type(model).__name__,
            "wrapped": wrapped,
            "states": [w.state.value for _, w in ait_find(model)],
        }
    print(json.dumps(results))
    """
).replace("ait_find(", "__import__('aitune_aot.checkpoint_io').checkpoint_io.find_modules(")


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_whole_part_and_pipeline_load_into_fresh_instances_in_a_new_process(tmp_path):
    tiny_diffusers = pytest.importorskip("tiny_diffusers", reason="diffusers is not installed")
    io: dict = {"x": torch.randn(2, 8)}  # a tuned batch size: the backends answer
    ckpts = {}

    whole = ait.Module(build(seed=0), "net", strategy=_eager())  # the root wrapped
    ait.tune(whole, _data(), batch_sizes=[1, 2])
    ait.save(whole, tmp_path / "whole")
    ckpts["whole"] = str(tmp_path / "whole")

    part = build(seed=0)
    part.encoder = ait.Module(part.encoder, "enc", strategy=_eager())  # only a part wrapped
    ait.tune(part, _data(), batch_sizes=[1, 2])
    ait.save(part, tmp_path / "part")
    ckpts["part"] = str(tmp_path / "part")
    with torch.no_grad():
        io["whole"], io["part"] = whole(io["x"]), part(io["x"])

    pipe = tiny_diffusers.build_pipeline(seed=0)
    pipe.unet = ait.Module(pipe.unet, "unet", strategy=_eager())
    latents, text = tiny_diffusers.pipeline_inputs()
    ait.tune(lambda lat, txt: pipe(lat, txt), [(latents[i], text[i]) for i in range(2)], batch_sizes=[1, 2])
    ait.save(pipe, tmp_path / "pipeline")
    ckpts["pipeline"] = str(tmp_path / "pipeline")
    io["pipeline_inputs"] = (latents, text)
    with torch.no_grad():
        io["pipeline"] = pipe(latents, text)
    torch.save(io, tmp_path / "io.pt")

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(ckpts), str(tmp_path / "io.pt")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["whole"]["returned"] == "Module"  # the root wrapper is the model to use
    assert results["whole"]["wrapped"] == ["Pipeline"]
    assert results["part"]["returned"] == "Pipeline" and results["part"]["wrapped"] == ["MLP"]
    assert results["pipeline"]["returned"] == "TinyDiffusionPipeline"
    assert results["pipeline"]["wrapped"] == ["UNet2DConditionModel"]
    for scenario, result in results.items():
        assert result["states"] == ["tuned"], scenario
        assert result["max_abs_diff"] < 1e-5, (scenario, result)
