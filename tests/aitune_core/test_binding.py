import inspect
import json

import pytest
import torch

from aitune_core.specs.binding import Binder, bind_arguments


def fwd(x, mask=None, *, scale=1.0):
    return x


def test_positional_and_keyword_bind_the_same():
    x, m = torch.ones(1), torch.zeros(1)
    b = Binder.from_callable(fwd)
    a = b.bind((x, m), {})
    k = b.bind((), {"mask": m, "x": x})
    mixed = b.bind((x,), {"mask": m})
    assert list(a) == list(k) == list(mixed) == ["x", "mask"]
    assert all(a[n] is k[n] is mixed[n] for n in a)


def test_defaults_are_not_applied_and_order_is_signature_order():
    b = Binder.from_callable(fwd)
    assert list(b.bind((1,), {})) == ["x"]
    assert list(b.bind((), {"scale": 2.0, "x": 1})) == ["x", "scale"]


def test_var_positional_and_var_keyword():
    def f(a, *rest, flag=False, **extra):
        pass

    b = Binder.from_callable(f)
    bound = b.bind((1, 2, 3), {"zeta": 4, "alpha": 5, "flag": True})
    assert list(bound) == ["a", "rest", "flag", "alpha", "zeta"]
    assert bound["rest"] == (2, 3)
    assert b.bind((1,), {"alpha": 5, "zeta": 4}) == b.bind((1,), {"zeta": 4, "alpha": 5})
    args, kwargs = b.unbind(bound)
    assert args == (1, 2, 3) and kwargs == {"flag": True, "alpha": 5, "zeta": 4}


def test_generic_binder_names_positional_arguments():
    b = Binder.generic()
    bound = b.bind((1, 2), {"k": 3})
    assert list(bound) == ["args", "k"]
    assert bound["args"] == (1, 2)


def test_positional_only():
    def f(a, /, b):
        pass

    binder = Binder.from_callable(f)
    assert binder.bind((1,), {"b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(TypeError):
        binder.bind((), {"a": 1, "b": 2})
    assert binder.unbind({"a": 1, "b": 2}) == ((1, 2), {})


def test_unbind_with_gap_uses_keywords():
    def f(a, b=None, c=None):
        pass

    binder = Binder.from_callable(f)
    bound = binder.bind((1,), {"c": 3})
    args, kwargs = binder.unbind(bound)
    assert args == (1,) and kwargs == {"c": 3}


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [((1, 2, 3), {}, "positional"), ((1,), {"x": 2}, "multiple values"), ((1,), {"nope": 2}, "unexpected")],
)
def test_bad_calls_raise_type_error(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        Binder.from_callable(fwd).bind(args, kwargs)


def test_modules_use_forward_signature():
    binder = Binder.from_callable(torch.nn.Linear(2, 2))
    assert binder.positional == ("input",) and binder.var_positional is None

    class M(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, **kwargs):
            return input_ids

    bound = bind_arguments(M(), (torch.ones(1),), {"attention_mask": torch.ones(1), "use_cache": False})
    assert list(bound) == ["input_ids", "attention_mask", "use_cache"]


def test_callable_without_signature_gets_generic_binder():
    class NoSignature:
        @property
        def __signature__(self):
            raise ValueError("no signature found for builtin")

        def __call__(self, *args):
            return args

    with pytest.raises(ValueError):
        inspect.signature(NoSignature())
    assert Binder.from_callable(NoSignature()) == Binder.generic()


def test_json_round_trip():
    def f(a, /, b, *c, d, **e):
        pass

    binder = Binder.from_callable(f)
    again = Binder.from_dict(json.loads(json.dumps(binder.to_dict())))
    assert again == binder
    assert again.bind((1, 2, 3), {"d": 4, "z": 5}) == binder.bind((1, 2, 3), {"d": 4, "z": 5})
