"""`TuneJob`: the six parts of one tuning as one frozen object, built from what the six-argument API accepts."""

import dataclasses
from pathlib import Path

import pytest
import torch
from core_fakes import TinyMLP, record

from aitune_core.strategies.tune_job import TuneJob


def test_of_normalizes_device_path_and_samples(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    job = TuneJob.of(model, "mlp", spec, iter(data), "cpu", str(tmp_path))
    assert job.device == torch.device("cpu") and job.cache_dir == Path(tmp_path)
    assert job.samples == tuple(data) and job.module is model and job.graph_spec is spec


def test_arguments_are_the_six_of_the_documented_hooks_with_a_fresh_list(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    job = TuneJob.of(model, "mlp", spec, data, "cpu", tmp_path)
    module, name, graph_spec, samples, device, cache_dir = job.arguments()
    assert (module, name, graph_spec, device, cache_dir) == (model, "mlp", spec, torch.device("cpu"), tmp_path)
    assert samples == list(data)
    samples.clear()  # a caller's copy: the job keeps its samples
    assert len(job.data) == len(data) and job.data is not job.data


def test_a_job_is_frozen(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    job = TuneJob.of(model, "mlp", spec, data, "cpu", tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.name = "other"  # type: ignore[misc]
