import collections
import dataclasses
import json
from collections import OrderedDict, UserDict, namedtuple
from typing import Any

import pytest
import torch

from aitune_core.specs.tree import (
    CONST,
    TENSOR,
    TreeDef,
    flatten,
    flatten_values,
    tensor_leaves,
    tree_map,
    unflatten,
)

Pair = namedtuple("Pair", ["first", "second"])


@dataclasses.dataclass
class Batch:
    ids: torch.Tensor
    meta: dict
    scale: float = 1.0


class BatchEncodingLike(UserDict):
    """Like transformers.BatchEncoding: a UserDict (a Mapping, not a dict) with attribute access."""

    def __getattr__(self, item):
        try:
            return self.data[item]
        except KeyError as e:
            raise AttributeError(item) from e


class ModelOutput(OrderedDict):
    """Imitates transformers.utils.ModelOutput: a dataclass-backed OrderedDict of its non-None fields."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value


@dataclasses.dataclass
class CausalLMOutput(ModelOutput):
    logits: Any = None
    past: Any = None
    hidden_states: Any = None


def _assert_same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, (dict, UserDict)):
        assert list(a.keys()) == list(b.keys())
        for k in a:
            _assert_same(a[k], b[k])
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name))
    else:
        assert a == b


def test_bare_tensor_and_constants():
    t = torch.ones(2)
    leaves, td = flatten(t)
    assert leaves == [("", t)] and td.kind == TENSOR
    leaves, td = flatten(3)
    assert leaves == [("", 3)] and td.kind == CONST
    assert unflatten(td, [5]) == 5


def test_locators_for_nested_builtin_containers():
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    value = {"x": (a, [b, None]), 3: c, "flag": True}
    leaves, td = flatten(value)
    assert [loc for loc, _ in leaves] == ["['x'][0]", "['x'][1][0]", "['x'][1][1]", "[3]", "['flag']"]
    assert leaves[0][1] is a and leaves[2][1] is None
    assert td.leaf_kinds() == [TENSOR, TENSOR, CONST, TENSOR, CONST]
    assert [loc for loc, _ in tensor_leaves(value)] == ["['x'][0]", "['x'][1][0]", "[3]"]
    _assert_same(unflatten(td, leaves), value)
    _assert_same(unflatten(td, [v for _, v in leaves]), value)


def test_torch_size_is_a_leaf():
    leaves, td = flatten((torch.Size([2, 3]), torch.ones(1)))
    assert leaves[0] == ("[0]", torch.Size([2, 3]))
    assert td.leaf_kinds() == [CONST, TENSOR]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Pair(torch.ones(2), [torch.zeros(1), 4]),
        lambda: Batch(ids=torch.arange(3), meta={"lens": torch.tensor([3])}, scale=0.5),
        lambda: BatchEncodingLike({"input_ids": torch.ones(1, 4), "attention_mask": torch.ones(1, 4)}),
        lambda: CausalLMOutput(logits=torch.randn(1, 4, 10), hidden_states=(torch.ones(1), torch.zeros(1))),
        lambda: OrderedDict(b=torch.ones(1), a=torch.zeros(1)),
        lambda: collections.defaultdict(list, {"k": torch.ones(1)}),
        lambda: [Batch(ids=torch.ones(1), meta={}), Pair(1, "s")],
    ],
    ids=["namedtuple", "dataclass", "batchencoding-like", "modeloutput-like", "ordereddict", "defaultdict", "mixed"],
)
def test_round_trip_restores_container_types(make):
    value = make()
    leaves, td = flatten(value)
    rebuilt = unflatten(td, leaves)
    _assert_same(rebuilt, value)
    # structural identity is the same for a second, equal-shaped value
    assert flatten(make())[1] == td
    assert hash(flatten(make())[1]) == hash(td)


def test_attribute_locators_for_fields():
    out = CausalLMOutput(logits=torch.randn(1, 2), hidden_states=(torch.ones(1),))
    assert [loc for loc, _ in flatten(out)[0]] == [".logits", ".hidden_states[0]"]  # None field skipped
    assert [loc for loc, _ in flatten(Pair(1, 2))[0]] == [".first", ".second"]
    enc = BatchEncodingLike({"input_ids": torch.ones(1)})
    assert [loc for loc, _ in flatten(enc)[0]] == ["['input_ids']"]


def test_modeloutput_rebuilt_has_mapping_and_attribute_access():
    out = CausalLMOutput(logits=torch.randn(1, 2))
    rebuilt = tree_map(lambda t: t * 2, out)
    assert isinstance(rebuilt, CausalLMOutput)
    assert torch.equal(rebuilt.logits, out.logits * 2)
    assert torch.equal(rebuilt["logits"], out.logits * 2)
    assert list(rebuilt.keys()) == ["logits"]


def test_structure_differs_by_kind_keys_and_leaf_kind():
    t = torch.ones(1)
    assert flatten((t, t))[1] != flatten([t, t])[1]
    assert flatten({"a": t})[1] != flatten({"b": t})[1]
    assert flatten((t, None))[1] != flatten((t, t))[1]
    assert flatten((t, 1))[1] == flatten((t, 2))[1]  # constants' values are not structure


def test_treedef_json_round_trip():
    value = {"enc": BatchEncodingLike({"ids": torch.ones(1)}), "p": Pair(torch.ones(1), 2), 0: [torch.ones(1)]}
    _, td = flatten(value)
    td2 = TreeDef.from_dict(json.loads(json.dumps(td.to_dict())))
    assert td2 == td and hash(td2) == hash(td)
    leaves = flatten_values(value)[0]
    _assert_same(unflatten(td2, leaves), value)


def test_unimportable_class_keeps_identity_and_falls_back_to_builtin():
    @dataclasses.dataclass
    class Local:
        x: torch.Tensor

    _, td = flatten(Local(torch.ones(1)))
    td2 = TreeDef.from_dict(json.loads(json.dumps(td.to_dict())))
    assert td2 == td
    assert td2.cls is None
    rebuilt = unflatten(td2, [torch.zeros(1)])
    assert isinstance(rebuilt, dict) and torch.equal(rebuilt["x"], torch.zeros(1))


def test_a_type_read_from_a_file_never_imports_a_module_and_must_be_its_kind(monkeypatch):
    """A checkpoint's manifest is not trusted: an edited type path once ran `this`'s import (the Zen of Python
    printed inside `aitune.torch.load`) and built `subprocess.Popen` from the file's values at every call."""
    import sys

    monkeypatch.delitem(sys.modules, "this", raising=False)
    forged = TreeDef.from_dict({"kind": "dict", "type": "this:s", "keys": ["x"], "children": [{"kind": "tensor"}]})
    assert forged.cls is None and "this" not in sys.modules
    popen = TreeDef.from_dict({"kind": "list", "type": "subprocess:Popen",
                               "children": [{"kind": "const"}, {"kind": "const"}]})
    assert popen.cls is None
    assert unflatten(popen, ["touch", "/tmp/never"]) == ["touch", "/tmp/never"]
    ordered = TreeDef.from_dict({"kind": "dict", "type": "collections:OrderedDict", "keys": ["x"],
                                 "children": [{"kind": "tensor"}]})
    assert ordered.cls is OrderedDict, "a class of an imported module that is the kind it claims is kept"


def test_unflatten_checks_leaf_count():
    _, td = flatten((torch.ones(1), torch.ones(1)))
    with pytest.raises(ValueError, match="2 leaves"):
        unflatten(td, [torch.ones(1)])


def test_real_transformers_containers_round_trip():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_outputs import BaseModelOutputWithPast

    enc = transformers.BatchEncoding(
        {"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 5)}
    )
    leaves, td = flatten(enc)
    assert td.kind == "mapping"
    assert [loc for loc, _ in leaves] == ["['input_ids']", "['attention_mask']"]
    rebuilt = unflatten(td, leaves)
    assert isinstance(rebuilt, transformers.BatchEncoding)
    assert torch.equal(rebuilt.input_ids, enc.input_ids)

    out = BaseModelOutputWithPast(last_hidden_state=torch.randn(2, 5, 8), hidden_states=(torch.ones(1),))
    leaves, td = flatten(out)
    assert td.kind == "model_output"
    assert [loc for loc, _ in leaves] == [".last_hidden_state", ".hidden_states[0]"]
    rebuilt = unflatten(td, leaves)
    assert isinstance(rebuilt, BaseModelOutputWithPast)
    assert rebuilt.past_key_values is None
    assert torch.equal(rebuilt[0], out.last_hidden_state)


def test_a_dataclass_mapping_hybrid_keeps_its_type_and_fields():
    """diffusers' BaseOutput is an OrderedDict and a dataclass: rebuilt by keyword, not from (key, value) pairs."""
    @dataclasses.dataclass
    class SampleOutput(OrderedDict):
        sample: torch.Tensor = None  # type: ignore[assignment]

        def __post_init__(self) -> None:
            if self.sample is not None:
                self["sample"] = self.sample

    value = SampleOutput(sample=torch.ones(2))
    leaves, td = flatten(value)
    assert td.kind == "model_output" and [loc for loc, _ in leaves] == [".sample"]
    rebuilt = unflatten(td, [torch.zeros(2)])
    assert type(rebuilt) is SampleOutput
    assert isinstance(rebuilt.sample, torch.Tensor) and torch.equal(rebuilt["sample"], torch.zeros(2))
    mapped = tree_map(lambda t: t + 1, value)
    assert type(mapped) is SampleOutput and torch.equal(mapped.sample, torch.full((2,), 2.0))


def test_diffusers_unet_output_round_trips():
    outputs = pytest.importorskip("diffusers.models.unets.unet_2d_condition")
    value = outputs.UNet2DConditionOutput(sample=torch.randn(1, 4, 2, 2))
    rebuilt = tree_map(torch.clone, value)
    assert type(rebuilt) is outputs.UNet2DConditionOutput
    assert isinstance(rebuilt.sample, torch.Tensor) and torch.equal(rebuilt.sample, value.sample)
