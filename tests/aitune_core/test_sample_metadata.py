import enum
import json

import torch

from aitune_core.specs.sample_metadata import (
    OpaqueConstant,
    SampleMetadata,
    call_identity,
    constant_key,
    decode_constant,
    encode_constant,
)
from aitune_core.specs.tree import flatten_values


class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


def test_names_from_paths_and_prefix():
    value = {"x": torch.ones(2), "pair": (torch.ones(1), torch.ones(3)), "flag": True}
    meta = SampleMetadata.from_value(value)
    assert meta.names == ["x", "pair_0", "pair_1"]
    assert [t.locator for t in meta.tensors] == ["['x']", "['pair'][0]", "['pair'][1]"]
    assert meta.constants == (("['flag']", True),)

    out = SampleMetadata.from_value(torch.ones(1), names_prefix="outputs")
    assert out.names == ["outputs"] and out.tensors[0].locator == ""
    out = SampleMetadata.from_value({"logits": torch.ones(1)}, names_prefix="outputs")
    assert out.names == ["outputs_logits"]


def test_duplicate_names_are_made_unique():
    meta = SampleMetadata.from_value({"a_b": torch.ones(1), "a": {"b": torch.ones(1)}})
    assert meta.names == ["a_b", "a_b_1"]


def test_identity_strict_and_non_strict():
    a = SampleMetadata.from_value({"x": torch.ones(2, 3), "n": 1})
    b = SampleMetadata.from_value({"x": torch.ones(5, 7), "n": 2})
    c = SampleMetadata.from_value({"x": torch.ones(5, 7, 1), "n": 1})
    d = SampleMetadata.from_value({"x": torch.ones(2, 3, dtype=torch.float16), "n": 1})
    assert a.identity(strict=False) == b.identity(strict=False)
    assert a.identity(strict=True) != b.identity(strict=True)
    assert a.identity(strict=False) != c.identity(strict=False)  # rank
    assert a.identity(strict=False) != d.identity(strict=False)  # dtype


def test_call_identity_matches_metadata_identity():
    value = {"x": torch.ones(2, 3), "n": 1.5, "s": "abc", "m": Mode.FAST, "o": object()}
    values, td = flatten_values(value)
    meta = SampleMetadata.from_leaves(values, td)
    for strict in (True, False):
        assert call_identity(values, td, strict) == meta.identity(strict)


def test_constant_keys():
    assert constant_key(1) != constant_key(True)
    assert constant_key(float("nan")) == constant_key(float("nan"))
    assert constant_key(object()) == constant_key(object())  # arbitrary objects: type only
    assert constant_key(Mode.FAST) != constant_key(Mode.SLOW)
    assert constant_key(torch.float16) != constant_key(torch.float32)


def test_constant_json_round_trip_keeps_identity():
    values = [None, True, 3, 2.5, "s", float("inf"), b"\x00\x01", torch.Size([2, 3]), torch.int8,
              torch.device("cpu"), Mode.SLOW, object(), 1 + 2j]
    for value in values:
        decoded = decode_constant(json.loads(json.dumps(encode_constant(value))))
        assert constant_key(decoded) == constant_key(value), value
    assert isinstance(decode_constant(encode_constant(object())), OpaqueConstant)


def test_unflatten_from_tensors_uses_recorded_constants():
    value = (torch.ones(2), None, {"logits": torch.zeros(3), "n": 4})
    meta = SampleMetadata.from_value(value, names_prefix="outputs")
    rebuilt = meta.unflatten([torch.full((2,), 5.0), torch.full((3,), 6.0)])
    assert rebuilt[1] is None and rebuilt[2]["n"] == 4
    assert torch.equal(rebuilt[2]["logits"], torch.full((3,), 6.0))


def test_json_round_trip_and_hash():
    meta = SampleMetadata.from_value({"x": torch.ones(2, 3), "p": (torch.ones(1, dtype=torch.int64), "tag")})
    again = SampleMetadata.from_dict(json.loads(json.dumps(meta.to_dict())))
    assert again == meta and hash(again) == hash(meta)
    assert again.identity(True) == meta.identity(True)


def test_non_static_axes():
    meta = SampleMetadata.from_value({"x": torch.ones(2, 3)})
    assert meta.non_static_axes() == {} and not meta.has_batch_axis()


class _KV:
    def __init__(self, filled: bool) -> None:
        self.keys = torch.zeros(1, 3) if filled else None


def test_object_constants_are_keyed_by_type_and_layout_and_never_kept_live():
    empty, filled = _KV(False), _KV(True)
    assert constant_key(empty) != constant_key(filled)  # prefill vs decode: two graphs
    assert constant_key(filled) == constant_key(_KV(True))
    meta = SampleMetadata.from_value({"x": torch.ones(1), "cache": filled})
    (_locator, kept), = meta.constants
    assert isinstance(kept, OpaqueConstant) and kept.key == constant_key(filled)
    filled.keys = None  # the caller's object changes later: the recorded identity does not
    assert meta.constant_keys() == (constant_key(_KV(True)),)
    again = SampleMetadata.from_dict(json.loads(json.dumps(meta.to_dict())))
    assert again.identity(strict=True) == meta.identity(strict=True)
