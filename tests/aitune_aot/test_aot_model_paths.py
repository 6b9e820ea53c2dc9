"""Paths of a model's parts: torch submodules, dict keys, list items and attributes of a pipeline object."""

import torch
from aot_models import build

from aitune_aot.model_paths import find_modules, model_parts, resolve_path, unwrapped
from aitune_aot.module import Module


class _Pipe:
    def __init__(self):
        self.model = build()
        self.extras = {"heads": [torch.nn.Linear(2, 2)], 3: "three"}
        self.name = "pipe"
        self.torch = torch  # a Python module: never searched


def test_model_parts_of_a_torch_model_is_the_model_itself():
    model = build()
    assert model_parts(model) == [("", model)]
    wrapper = Module(model, "net")
    assert model_parts(wrapper) == [("", model)]  # unwrapped


def test_model_parts_of_a_pipeline_are_its_outermost_torch_modules():
    pipe = _Pipe()
    assert [(path, type(m).__name__) for path, m in model_parts(pipe)] == [
        ("model", "Pipeline"),
        ("extras.heads.0", "Linear"),
    ]


def test_resolve_path_walks_modules_dicts_lists_and_attributes():
    pipe = _Pipe()
    assert resolve_path(pipe, "") is pipe
    assert resolve_path(pipe, "model.head.0") is pipe.model.head[0]
    assert resolve_path(pipe, "extras.heads.0") is pipe.extras["heads"][0]
    assert resolve_path(pipe, "extras.3") == "three"
    for missing in ("model.nope", "extras.heads.5", "extras.heads.x", "nothing", "model.head.0.weight.x"):
        assert resolve_path(pipe, missing) is None, missing


def test_resolve_path_sees_through_wrappers_and_finds_routed_raw_modules():
    pipe = _Pipe()
    raw = pipe.model.encoder
    pipe.model.encoder = Module(raw, "enc")
    assert unwrapped(resolve_path(pipe, "model.encoder")) is raw
    assert resolve_path(pipe, "model.encoder.fc1") is raw.fc1
    head = Module(pipe.model.head, "head")  # the model keeps the raw head: found through its routing
    assert [(p, m.name) for p, m in find_modules(pipe)] == [("model.encoder", "enc"), ("model.head", "head")]
    assert find_modules(head) == [("", head)]
