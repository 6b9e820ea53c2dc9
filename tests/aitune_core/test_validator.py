import math

import pytest
import torch
from core_fakes import GoodBackend, NaNBackend, TinyMLP, WrongValuesBackend, _ModuleBackend, record

from aitune_core.backends.backend import Backend
from aitune_core.errors import ValidationError
from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.specs.sample_metadata import SampleMetadata
from aitune_core.validation import validator
from aitune_core.validation.tolerance import Tolerance, default_tolerance
from aitune_core.validation.validator import validate_backend, validate_output


def tol_fn(dtype):
    return default_tolerance(dtype)


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        logits = self.fc(x)
        return {"logits": logits, "aux": (logits.argmax(-1), 3, "tag")}


class Mutating(Backend):
    """Runs the module, then applies `fn` to its output."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def _build(self, module, graph_spec, data, cache_dir):
        self.module = module

    def _infer(self, *args, **kwargs):
        return self.fn(self.module(*args, **kwargs))


def _nested_graph():
    torch.manual_seed(0)
    model = Nested().eval()
    recorder = GraphRecorder(model)
    with torch.no_grad():
        for batch in (2, 4):
            x = torch.randn(batch, 8)
            recorder.record((x,), {}, model(x), batch_size=batch)
    spec = recorder.graph_specs[0]
    return model, spec, recorder.samples(spec)


def _build(backend, model, spec, data, tmp_path):
    return backend.build(model, spec, data, torch.device("cpu"), tmp_path)


def test_good_backend_passes(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    validate_backend(_build(GoodBackend(), model, spec, data, tmp_path), spec, data)


def test_nan_is_caught_with_path_and_index(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    backend = _build(NaNBackend(), model, spec, data, tmp_path)
    with pytest.raises(ValidationError, match=r"NaNBackend\(\).*sample 0.*non-finite.*index \(0, 0\)"):
        validate_backend(backend, spec, data)


def test_wrong_values_report_errors(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    backend = _build(WrongValuesBackend(), model, spec, data, tmp_path)
    with pytest.raises(ValidationError) as info:
        validate_backend(backend, spec, data)
    message = str(info.value)
    assert "elements outside tolerance" in message and "max abs error 1" in message and "rtol=0.001" in message


def test_wrong_shape_names_the_axis(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    backend = _build(Mutating(lambda out: out[:, :2]), model, spec, data, tmp_path)
    with pytest.raises(ValidationError, match=r"static axis 1 must be 4"):
        validate_backend(backend, spec, data)
    backend = _build(Mutating(lambda out: out[:1]), model, spec, data, tmp_path)
    with pytest.raises(ValidationError, match=r"batch axis 0 \(batch0\) is 1, the original module gave 2"):
        validate_backend(backend, spec, data)


def test_within_tolerance_passes_outside_fails(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    validate_backend(_build(Mutating(lambda out: out * (1 + 1e-5)), model, spec, data, tmp_path), spec, data)
    with pytest.raises(ValidationError):
        validate_backend(_build(Mutating(lambda out: out * 1.01), model, spec, data, tmp_path), spec, data)
    # a custom tolerance function decides
    loose = _build(Mutating(lambda out: out * 1.01), model, spec, data, tmp_path)
    validate_backend(loose, spec, data, tolerance_fn=lambda dtype: Tolerance(0.05, 0.0))


def test_nested_outputs(tmp_path):
    model, spec, data = _nested_graph()
    validate_backend(_build(GoodBackend(), model, spec, data, tmp_path), spec, data)

    def wrong_int(out):
        out["aux"] = (out["aux"][0] + 1, 3, "tag")
        return out

    with pytest.raises(ValidationError, match=r"output\['aux'\]\[0\].*exact match"):
        validate_backend(_build(Mutating(wrong_int), model, spec, data, tmp_path), spec, data)

    with pytest.raises(ValidationError, match="structure"):
        validate_backend(_build(Mutating(lambda out: {"logits": out["logits"]}), model, spec, data, tmp_path),
                         spec, data)

    def wrong_const(out):
        out["aux"] = (out["aux"][0], 4, "tag")
        return out

    with pytest.raises(ValidationError, match=r"output\['aux'\]\[1\] differs: got 4, expected 3"):
        validate_backend(_build(Mutating(wrong_const), model, spec, data, tmp_path), spec, data)

    def wrong_dtype(out):
        out["logits"] = out["logits"].double()
        return out

    with pytest.raises(ValidationError, match=r"dtype torch\.float64, expected torch\.float32"):
        validate_backend(_build(Mutating(wrong_dtype), model, spec, data, tmp_path), spec, data)


def test_non_finite_reference_values():
    ref = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    validate_output(ref.clone(), ref, None, tol_fn)  # same NaN / inf places: fine
    with pytest.raises(ValidationError, match="non-finite"):
        validate_output(torch.tensor([float("nan"), float("nan"), float("inf"), -float("inf")]), ref, None, tol_fn)
    with pytest.raises(ValidationError, match="non-finite"):
        validate_output(torch.tensor([1.0, float("nan"), -float("inf"), -float("inf")]), ref, None, tol_fn)
    with pytest.raises(ValidationError, match="1/4 elements outside"):  # reference NaN, output finite
        validate_output(torch.tensor([1.0, 0.0, float("inf"), -float("inf")]), ref, None, tol_fn)


def test_python_scalars():
    validate_output((1, 2.0), (1, 2.0), None, tol_fn)
    with pytest.raises(ValidationError, match="not finite"):
        validate_output((1, math.inf), (1, 2.0), None, tol_fn)
    with pytest.raises(ValidationError, match="not finite"):
        validate_output(math.nan, None, None, tol_fn)
    validate_output(math.nan, math.nan, None, tol_fn)
    with pytest.raises(ValidationError, match="differs"):
        validate_output(2.5, 2.0, None, tol_fn)


class _Holder:
    """An output object the tree walker does not look into, with no __eq__."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class _Token:
    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Token) and other.text == self.text

    __hash__ = None  # type: ignore[assignment]


class _TensorEq(_Holder):
    def __eq__(self, other: object):  # returns a tensor, not a bool
        return self.t == other.t  # type: ignore[attr-defined]


def test_opaque_output_objects_are_compared_not_trusted_by_type():
    holder = _Holder(torch.ones(2))
    validate_output((torch.ones(2), holder), (torch.ones(2), holder), None, tol_fn)  # the same object: fine
    with pytest.raises(ValidationError, match=r"output\.t"):  # a new object holding tensors: compared by its state
        validate_output(_Holder(torch.zeros(2)), _Holder(torch.ones(2)), None, tol_fn)
    with pytest.raises(ValidationError, match="_Bare object that aitune cannot compare"):
        validate_output(_Bare(), _Bare(), None, tol_fn)  # no ==, nothing to compare it by
    validate_output(_Token("a"), _Token("a"), None, tol_fn)  # its own == decides
    with pytest.raises(ValidationError, match="not equal"):
        validate_output(_Token("a"), _Token("b"), None, tol_fn)
    with pytest.raises(ValidationError, match="cannot be compared with =="):
        validate_output(_TensorEq(torch.ones(2)), _TensorEq(torch.ones(2)), None, tol_fn)


class _Bare:
    def __init__(self) -> None:
        self.name = "x"


class _ReturnedCache:
    """A cache a forward returns (transformers' DynamicCache when a causal LM is called with `use_cache` on)."""

    def __init__(self, *layers: torch.Tensor, length: int | None = None) -> None:
        self.layers = [_Holder(t) for t in layers]
        self.length = length if length is not None else (layers[0].shape[-1] if layers else 0)


def test_a_returned_object_holding_tensors_is_compared_by_its_state():
    k = torch.randn(2, 4)
    got, want = _ReturnedCache(k, k * 2), _ReturnedCache(k.clone(), k * 2)
    validate_output({"logits": k, "cache": got}, {"logits": k, "cache": want}, None, tol_fn)
    with pytest.raises(ValidationError, match=r"output\['cache'\]\.layers\[1\]\.t"):
        validate_output({"cache": _ReturnedCache(k, k * 3)}, {"cache": _ReturnedCache(k, k * 2)}, None, tol_fn)
    with pytest.raises(ValidationError, match="holds another layout"):
        validate_output(_ReturnedCache(k), _ReturnedCache(k, k), None, tol_fn)
    with pytest.raises(ValidationError, match=r"\.length differs"):
        validate_output(_ReturnedCache(k, length=3), _ReturnedCache(k, length=4), None, tol_fn)


def test_without_reference_checks_spec_and_finiteness():
    spec = SampleMetadata.from_value(torch.zeros(2, 3), names_prefix="outputs")
    validate_output(torch.ones(2, 3), None, spec, tol_fn)
    with pytest.raises(ValidationError, match="static axis 1 must be 3"):
        validate_output(torch.ones(2, 4), None, spec, tol_fn)
    with pytest.raises(ValidationError, match="non-finite"):
        validate_output(torch.tensor([[1.0, 2.0, float("inf")]] * 2), None, spec, tol_fn)


def test_chunked_comparison_reports_the_right_index(monkeypatch):
    monkeypatch.setattr(validator, "_CHUNK", 7)
    ref = torch.zeros(5, 6)
    out = ref.clone()
    out[4, 2] = 1.0
    with pytest.raises(ValidationError, match=r"1/30 elements.*max abs error 1 at index \(4, 2\)"):
        validate_output(out, ref, None, tol_fn)
    nan = ref.clone()
    nan[3, 5] = float("nan")
    with pytest.raises(ValidationError, match=r"index \(3, 5\)"):
        validate_output(nan, ref, None, tol_fn)


def test_backend_exception_becomes_validation_error(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)

    def boom(out):
        raise RuntimeError("kernel crashed")

    with pytest.raises(ValidationError, match="kernel crashed"):
        validate_backend(_build(Mutating(boom), model, spec, data, tmp_path), spec, data)


# ------------------------------------------------------------------------------------------ aliasing and inputs
class BufferReuseBackend(Backend):
    """Returns one preallocated output tensor per input shape, written in place on every call (a CUDA-graph replay)."""

    def _build(self, module, graph_spec, data, cache_dir):
        self.module = module
        self.buffers = {}

    def _infer(self, x):
        out = self.module(x)
        buffer = self.buffers.setdefault(tuple(x.shape), torch.empty_like(out))
        return buffer.copy_(out)


class SharedBufferBackend(BufferReuseBackend):
    """One buffer for every batch size: each call returns a view of its first rows."""

    def _infer(self, x):
        out = self.module(x)
        buffer = self.buffers.setdefault("all", torch.empty(64, out.shape[1]))
        return buffer[: out.shape[0]].copy_(out)


class InputMutatingBackend(_ModuleBackend):
    """Right outputs, but zeroes its input tensor afterwards."""

    def _infer(self, x):
        out = self.module(x)
        x.zero_()
        return out


class ZeroInputModule(torch.nn.Module):
    """Computes, then zeroes its input in place (a module that legitimately mutates its inputs)."""

    def forward(self, x):
        out = x * 2
        x.zero_()
        return out


class CacheAppender(torch.nn.Module):
    """Appends its output to a caller-owned cache object, like a KV cache update."""

    def forward(self, x, cache):
        out = x + 1
        cache.keys.append(out)
        return out


class _Cache:
    def __init__(self):
        self.keys = []

    def __eq__(self, other):
        return isinstance(other, _Cache) and len(self.keys) == len(other.keys)

    __hash__ = None  # type: ignore[assignment]


class CacheReuseBackend(_ModuleBackend):
    """Returns fresh outputs but writes one reused buffer into the cache argument."""

    def _infer(self, x, cache):
        out = self.module(x, cache)
        if not hasattr(self, "buffer"):
            self.buffer = torch.empty_like(out)
        cache.keys[-1] = self.buffer.copy_(out)
        return out.clone()


@pytest.mark.parametrize("batch_sizes", [(2, 4), (3,), (2, 2)])
def test_backend_reusing_its_output_buffer_is_rejected(tmp_path, batch_sizes):
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=batch_sizes)
    validate_backend(_build(GoodBackend(), model, spec, data, tmp_path), spec, data)
    backend = _build(BufferReuseBackend(), model, spec, data, tmp_path)
    with pytest.raises(ValidationError, match=r"output buffer reused / overwritten by a later call: output returned "
                                              r"for sample 0 changed when sample"):
        validate_backend(backend, spec, data)


def test_backend_returning_views_of_one_buffer_is_rejected_at_the_next_sample(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4))
    with pytest.raises(ValidationError, match=r"sample 1\): output buffer reused.*changed when sample 1 ran"):
        validate_backend(_build(SharedBufferBackend(), model, spec, data, tmp_path), spec, data)


def test_backend_mutating_its_inputs_is_rejected_and_samples_stay_intact(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    recorded = [sample.args[0].clone() for sample in data]
    with pytest.raises(ValidationError, match=r"sample 0\): the backend mutates its inputs \(args\[0\] changed in "
                                              r"place \(16/16 elements\)\), but the original module leaves"):
        validate_backend(_build(InputMutatingBackend(), model, spec, data, tmp_path), spec, data)
    assert all(torch.equal(sample.args[0], before) for sample, before in zip(data, recorded))


def test_input_mutation_is_allowed_when_the_original_module_mutates_too(tmp_path):
    model = ZeroInputModule()
    recorder = GraphRecorder(model)
    for batch in (2, 4):
        x = torch.randn(batch, 3)
        recorder.record((x.clone(),), {}, model(x), batch_size=batch)
    spec = recorder.graph_specs[0]
    data = recorder.samples(spec)
    recorded = [sample.args[0].clone() for sample in data]
    assert recorded[0].abs().sum() > 0
    with pytest.raises(ValidationError, match="mutates its inputs"):
        validate_backend(_build(GoodBackend(), model, spec, data, tmp_path), spec, data)
    for sample in data:
        sample.mutates_inputs = True
    validate_backend(_build(GoodBackend(), model, spec, data, tmp_path), spec, data)
    assert all(torch.equal(sample.args[0], before) for sample, before in zip(data, recorded))


def test_tensors_written_into_argument_objects_are_checked_like_outputs(tmp_path):
    model = CacheAppender()
    recorder = GraphRecorder(model)
    for batch in (2, 2):
        x, cache = torch.randn(batch, 3), _Cache()
        recorder.record((x, _Cache()), {}, model(x, cache), batch_size=batch)
    spec = recorder.graph_specs[0]
    data = recorder.samples(spec)
    for sample in data:
        sample.mutates_inputs = True  # the original module appends to its cache argument
    validate_backend(_build(GoodBackend(), model, spec, data, tmp_path), spec, data)
    assert all(sample.args[1].keys == [] for sample in data)  # validation used copies of the cache
    with pytest.raises(ValidationError, match=r"output buffer reused.*args\[1\]\.keys\[0\] returned for sample 0"):
        validate_backend(_build(CacheReuseBackend(), model, spec, data, tmp_path), spec, data)


def test_value_mismatch_carries_its_closeness(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    backend = _build(WrongValuesBackend(), model, spec, data, tmp_path)
    with pytest.raises(ValidationError) as info:
        validate_backend(backend, spec, data)
    closeness = info.value.closeness
    assert closeness.outliers == 8 and closeness.allowed_outliers == 0 and not closeness.accepted
    assert type(info.value) is ValidationError
    assert info.value.closeness_summary.startswith("WrongValuesBackend() (graph 0, sample 0): output: rel L2 error")


# ------------------------------------------------------------------------------------------ stateful calls
class KVCache:
    """A fixed-layout cache like transformers' DynamicCache: one tensor per layer, grown by each call."""

    def __init__(self, layers=2):
        self.keys = [torch.zeros(1, 0, 4) for _ in range(layers)]
        self.steps = 0


class Decoder(torch.nn.Module):
    """Appends its projection to every layer of the cache and returns (out, cache), like a decoder step."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, cache):
        h = self.proj(x)
        for index, keys in enumerate(cache.keys):
            cache.keys[index] = torch.cat([keys, h * (index + 1)], dim=1)
        cache.steps += 1
        return h + cache.keys[0].mean(1, keepdim=True), cache


def _stateful_samples(model, steps=3):
    from aitune_core.recording.sample import owned_inputs

    recorder = GraphRecorder(model)
    cache = KVCache()
    for _ in range(steps):
        x = torch.randn(1, 1, 4)
        before = owned_inputs((x, cache), {})
        with torch.no_grad():
            out = model(x, cache)
        recorder.record(*before, out, after=((x, cache), {}))
    spec = recorder.graph_specs[-1]
    return spec, recorder.samples(spec)


class ForgetsTheCache(_ModuleBackend):
    """Right output values, but computed on a copy of the cache: the caller's cache is not updated."""

    def _infer(self, x, cache):
        import copy

        out, _ = self.module(x, copy.deepcopy(cache))
        return out, cache


class CacheOffByOne(_ModuleBackend):
    """Updates the cache, but one layer's new entry is wrong."""

    def _infer(self, x, cache):
        out = self.module(x, cache)
        cache.keys[1][:, -1:] += 1.0
        return out


class ReturnsACopyOfTheCache(_ModuleBackend):
    def _infer(self, x, cache):
        import copy

        out, returned = self.module(x, cache)
        return out, copy.deepcopy(returned)


class SkipsTheCounter(_ModuleBackend):
    def _infer(self, x, cache):
        was = cache.steps
        out = self.module(x, cache)
        cache.steps = was
        return out


class AddsAnAttribute(_ModuleBackend):
    def _infer(self, x, cache):
        out = self.module(x, cache)
        cache.extra = torch.nn.Identity()
        return out


def test_a_stateful_call_is_validated_on_the_state_it_leaves_and_on_the_object_it_returns(tmp_path):
    torch.manual_seed(0)
    model = Decoder().eval()
    spec, data = _stateful_samples(model)
    assert all(sample.mutates_inputs and sample.inputs_after is not None for sample in data)
    assert data[0].output[1] is data[0].inputs_after[0][1]  # the returned cache is the argument object, as recorded
    recorded = [[keys.clone() for keys in sample.args[1].keys] for sample in data]
    validate_backend(_build(GoodBackend(), model, spec, data, tmp_path), spec, data)
    for sample, before in zip(data, recorded):  # validation ran on copies: the samples are as recorded
        assert all(torch.equal(a, b) for a, b in zip(sample.args[1].keys, before))
    with pytest.raises(ValidationError, match=r"args\[1\]\.keys\[0\] after the call has shape \[1, \d, 4\], expected"):
        validate_backend(_build(ForgetsTheCache(), model, spec, data, tmp_path), spec, data)
    with pytest.raises(ValidationError, match=r"args\[1\]\.keys\[1\] after the call differs from the original"):
        validate_backend(_build(CacheOffByOne(), model, spec, data, tmp_path), spec, data)
    with pytest.raises(ValidationError, match=r"output\[1\]: the original module returned its argument object "
                                              r"\(KVCache\) here, the backend another KVCache"):
        validate_backend(_build(ReturnsACopyOfTheCache(), model, spec, data, tmp_path), spec, data)
    with pytest.raises(ValidationError, match=r"args\[1\]\.steps after the call differs: got \d, expected \d"):
        validate_backend(_build(SkipsTheCounter(), model, spec, data, tmp_path), spec, data)
    with pytest.raises(ValidationError, match="argument objects with another layout"):
        validate_backend(_build(AddsAnAttribute(), model, spec, data, tmp_path), spec, data)
