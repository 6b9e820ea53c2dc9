import math

import pytest
import torch
from core_fakes import GoodBackend, NaNBackend, TinyMLP, WrongValuesBackend, record

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
    with pytest.raises(ValidationError, match="_Holder object that aitune cannot compare"):
        validate_output(_Holder(torch.zeros(2)), _Holder(torch.ones(2)), None, tol_fn)  # could hide a wrong tensor
    validate_output(_Token("a"), _Token("a"), None, tol_fn)  # its own == decides
    with pytest.raises(ValidationError, match="not equal"):
        validate_output(_Token("a"), _Token("b"), None, tol_fn)
    with pytest.raises(ValidationError, match="cannot be compared with =="):
        validate_output(_TensorEq(torch.ones(2)), _TensorEq(torch.ones(2)), None, tol_fn)


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
