"""object_signature: a cache object's layout separates prefill from decode, not one decode step from the next."""

from __future__ import annotations

import torch

from aitune_core.specs.object_signature import object_signature


class Layer:
    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.is_initialized = False
        self.layer_idx = 0


class Cache:
    def __init__(self, layers: int = 2) -> None:
        self.layers = [Layer() for _ in range(layers)]

    def fill(self, length: int) -> Cache:
        for layer in self.layers:
            layer.keys = torch.zeros(1, 2, length, 4)
            layer.is_initialized = True
        return self


def test_empty_and_filled_caches_differ():
    assert object_signature(Cache()) != object_signature(Cache().fill(3))


def test_lengths_and_counters_do_not_matter():
    a, b = Cache().fill(3), Cache().fill(9)
    b.layers[1].layer_idx = 7
    assert object_signature(a) == object_signature(b)


def test_layer_count_and_dtype_matter():
    assert object_signature(Cache(2).fill(3)) != object_signature(Cache(3).fill(3))
    half = Cache().fill(3)
    half.layers[0].keys = half.layers[0].keys.half()
    assert object_signature(half) != object_signature(Cache().fill(3))


def test_signature_is_a_short_stable_string_and_survives_cycles():
    cache = Cache().fill(2)
    cache.layers[0].owner = cache  # a reference cycle
    signature = object_signature(cache)
    assert isinstance(signature, str) and len(signature) == 12
    assert signature == object_signature(cache)


# -- the faster walk gives the digests the plain walk gave (decisions stored with them stay valid) -----------------

def _plain_layout(value, depth=0, seen=None, budget=None):
    """The walk as first written: one isinstance chain per value, the reference for the table-driven one."""
    import enum
    from collections.abc import Mapping

    seen = set() if seen is None else seen
    budget = [1024] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        return "..."
    if isinstance(value, torch.Tensor):
        return ("T", value.dim(), str(value.dtype))
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float, complex, str, bytes)):
        return type(value).__name__
    if isinstance(value, (torch.dtype, torch.device, enum.Enum)):
        return repr(value)
    name = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, (torch.nn.Module, type)) or depth >= 5 or id(value) in seen:
        return name
    seen.add(id(value))

    def walk(item):
        return _plain_layout(item, depth + 1, seen, budget)

    if isinstance(value, (list, tuple)):
        return (name, len(value), tuple(walk(item) for item in value))
    if isinstance(value, Mapping):
        return (name, tuple((repr(k), walk(v)) for k, v in value.items()))
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict) or callable(value):
        return name
    return (name, tuple((k, walk(v)) for k, v in sorted(attributes.items())))


def _plain_signature(value):
    import hashlib

    return hashlib.sha1(repr(_plain_layout(value)).encode("utf-8", "backslashreplace")).hexdigest()[:12]


class _Color(__import__("enum").IntEnum):
    RED = 1


class _Name(str):
    pass


class _Callable:
    def __call__(self):
        return 1


class _Everything:
    def __init__(self) -> None:
        import collections

        self.keys = torch.zeros(1, 2, 3, 4)
        self.flag, self.idx, self.scale, self.none = True, 3, 0.5, None
        self.device, self.dtype = torch.device("cpu"), torch.float16
        self.color, self.name = _Color.RED, _Name("x")
        self.fn, self.builtin, self.module, self.cls = _Callable(), len, torch.nn.Linear(2, 2), Layer
        self.items = [Cache().fill(2), Cache()]
        self.mapping = {"a": torch.ones(2), 3: None}
        self.ordered = collections.OrderedDict(b=1.0)
        self.point = collections.namedtuple("Point", "x y")(torch.ones(1), 2)
        self.scalars = (1, "s", b"b", 2j)
        self.me = self
        self.deep = [[[[[[[1]]]]]]]


def test_the_table_driven_walk_gives_the_plain_walks_digests():
    values = [_Everything(), Cache().fill(3), Cache(), [Layer() for _ in range(400)],  # (over the node budget)
              torch.ones(2, dtype=torch.bfloat16), None, 3, (None, True), {"k": [1.0, None]}]
    for value in values:
        assert object_signature(value) == _plain_signature(value)
        assert object_signature(value) == _plain_signature(value)  # (the second time from the digest table)


def test_a_real_dynamic_cache_has_the_plain_walks_digest_before_and_after_a_decoding_step():
    transformers = __import__("pytest").importorskip("transformers")
    config = transformers.GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=32, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 32, (1, 4)), use_cache=True).past_key_values
        prefill = object_signature(cache)
        model(torch.randint(0, 32, (1, 1)), past_key_values=cache, use_cache=True)
    assert prefill == _plain_signature(cache) == object_signature(cache)
    assert object_signature(transformers.DynamicCache()) != prefill
