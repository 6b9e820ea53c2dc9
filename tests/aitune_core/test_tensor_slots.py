import dataclasses

import pytest
import torch

from aitune_core.validation import tensor_slots as slots_module
from aitune_core.validation.tensor_slots import count_changed, snapshot, tensor_slots


class _Layer:
    def __init__(self, keys):
        self.keys = keys
        self.name = "layer"


class _Cache:
    def __init__(self, layers):
        self.layers = layers


class _Slotted:
    __slots__ = ("unset", "value")

    def __init__(self, value):
        self.value = value


@dataclasses.dataclass
class _Pair:
    first: torch.Tensor
    second: object


def test_walks_containers_attributes_and_slots():
    a, b, c, d = (torch.full((2,), float(i)) for i in range(4))
    value = ({"x": a, "cache": _Cache([_Layer(b)])}, [_Slotted(c)], _Pair(d, "text"))
    found = tensor_slots(value, "args")
    assert found == {
        "args[0]['x']": a,
        "args[0]['cache'].layers[0].keys": b,
        "args[1][0].value": c,
        "args[2].first": d,
    }
    assert all(found[path] is tensor for path, tensor in zip(found, (a, b, c, d)))


def test_skips_modules_and_cycles_and_respects_limits(monkeypatch):
    module = torch.nn.Linear(2, 2)
    cyclic: list = []
    cyclic.append(cyclic)
    cyclic.append(torch.ones(1))
    assert list(tensor_slots((module, cyclic))) == ["[1][1]"]
    deep: object = torch.ones(1)
    for _ in range(20):
        deep = [deep]
    assert tensor_slots(deep) == {}
    monkeypatch.setattr(slots_module, "MAX_DEPTH", 30)
    assert list(tensor_slots(deep)) == ["[0]" * 20]


def test_count_changed():
    base = torch.tensor([1.0, float("nan"), 3.0])
    assert count_changed(base.clone(), base) == 0  # NaN equals NaN
    changed = base.clone()
    changed[0] = 5.0
    assert count_changed(changed, base) == 1
    assert count_changed(base[:2], base) == 3  # another shape: every element counts
    assert count_changed(torch.tensor([1, 2]), torch.tensor([1, 3])) == 1
    assert count_changed(torch.empty(0), torch.empty(0)) == 0


class _Incomparable(torch.Tensor):
    def __ne__(self, other):
        raise NotImplementedError("no element-wise comparison")


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_snapshots_of_sparse_quantized_and_incomparable_tensors():
    sparse = torch.eye(3).to_sparse()
    copy = snapshot(sparse)
    assert copy is not None and count_changed(sparse, copy) == 0
    quantized = torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.1, 0, torch.quint8)
    copy = snapshot(quantized)
    assert copy is not None and count_changed(quantized, copy) == 0
    assert count_changed(torch.quantize_per_tensor(torch.tensor([0.5, 2.0]), 0.1, 0, torch.quint8), copy) == 1
    assert snapshot(torch.ones(2).as_subclass(_Incomparable)) is None


def test_reachable_finds_objects_and_constants_beside_tensors():
    from aitune_core.validation.tensor_slots import reachable

    class Layer:
        def __init__(self) -> None:
            self.keys = torch.zeros(2)
            self.ready = True
            self.seen = 3

    class Cache:
        def __init__(self) -> None:
            self.layers = [Layer(), Layer()]
            self.device = torch.device("cpu")  # skipped: neither state nor a place to look

    cache = Cache()
    found = reachable({"cache": cache}, "kwargs")
    assert set(found.tensors) == {"kwargs['cache'].layers[0].keys", "kwargs['cache'].layers[1].keys"}
    assert found.objects["kwargs['cache']"] is cache and found.objects["kwargs['cache'].layers[1]"] is cache.layers[1]
    assert "kwargs['cache'].layers" not in found.objects  # a list is a container, not an object of the state
    assert found.constants["kwargs['cache'].layers[0].seen"] == 3
    assert found.constants["kwargs['cache'].layers[1].ready"] is True


class _Layer:
    def __init__(self, keys: torch.Tensor | None) -> None:
        self.keys = keys


def test_an_object_that_holds_tensors_is_told_from_containers_and_plain_objects():
    from aitune_core.validation.tensor_slots import holds_state_object, holds_tensors

    cache = _Layer(torch.zeros(2))
    assert holds_tensors(cache) and not holds_tensors(_Layer(None)) and not holds_tensors(torch.zeros(2))
    assert holds_state_object({"logits": torch.ones(1), "cache": [cache]})  # found inside containers
    assert not holds_state_object({"logits": torch.ones(1), "names": ["a"], "empty": _Layer(None)})
