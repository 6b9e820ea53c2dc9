"""ArgumentWatch: recorded inputs are what the forward received; changes to arguments are found."""

from __future__ import annotations

import torch

from aitune_core.recording.argument_watch import ArgumentWatch


class Cache:
    def __init__(self) -> None:
        self.layers: list[torch.Tensor] = []
        self.seen = 0


def test_unchanged_arguments_report_nothing():
    cache = Cache()
    cache.layers.append(torch.ones(2))
    x = torch.randn(3)
    watch = ArgumentWatch.before((x, cache), {"scale": 2.0, "mask": None})
    _ = x * 2 + cache.layers[0].sum()
    assert watch.changes() is None


def test_in_place_write_into_an_input_tensor_is_found():
    x = torch.zeros(3)
    watch = ArgumentWatch.before((x,), {}, positional_names=("hidden",))
    x.add_(1)
    assert watch.changes() == "its input tensor `hidden` (in place)"


def test_appending_to_a_caller_object_is_found():
    cache = Cache()
    watch = ArgumentWatch.before((torch.ones(1),), {"past": cache})
    cache.layers.append(torch.ones(1))
    assert watch.changes() == "its argument `past` (Cache)"


def test_replacing_a_tensor_attribute_is_found():
    cache = Cache()
    cache.layers.append(torch.ones(2, 3))
    watch = ArgumentWatch.before((cache,), {}, positional_names=("kv",))
    cache.layers[0] = torch.cat([cache.layers[0], torch.ones(2, 1)], dim=1)
    assert watch.changes() == "its argument `kv` (Cache)"


def test_a_counter_attribute_is_a_change():
    cache = Cache()
    watch = ArgumentWatch.before((cache,), {})
    cache.seen += 1
    assert watch.changes() == "its argument `args[0]` (Cache)"


def test_keys_added_to_an_input_dict_are_found_and_not_recorded():
    features = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
    watch = ArgumentWatch.before((features,), {}, positional_names=("features",))
    features["embedding"] = torch.zeros(2)
    assert watch.changes() == "its argument `features` (dict)"
    # what is recorded is the dict as the forward received it
    assert list(watch.args[0]) == ["input_ids"]
    assert watch.args[0]["input_ids"] is features["input_ids"]


def test_inference_tensors_are_watched_without_version_counters():
    with torch.inference_mode():
        x = torch.ones(2)
    watch = ArgumentWatch.before((x,), {})
    assert watch.changes() is None


def test_modules_and_functions_are_opaque_and_cheap():
    layer = torch.nn.Linear(2, 2)
    watch = ArgumentWatch.before((layer, print), {})
    layer.weight.data.mul_(2)  # weights are the module's state, not the call's
    assert watch.changes() is None
