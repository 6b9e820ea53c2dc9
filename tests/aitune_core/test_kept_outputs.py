import pytest
import torch

from aitune_core.errors import ValidationError
from aitune_core.validation.kept_outputs import REUSE_MESSAGE, KeptOutputs


class _Poisoned(torch.Tensor):
    """A tensor that refuses to be read once `overwritten`, as torch's CUDA-graph trees do after a later replay."""

    overwritten = False

    def __ne__(self, other):
        if _Poisoned.overwritten:
            raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run")
        return super().__ne__(other)


class _Incomparable(torch.Tensor):
    def __ne__(self, other):
        raise NotImplementedError("no element-wise comparison")


def test_fresh_outputs_pass_and_overwritten_ones_fail():
    out = {"logits": torch.ones(3), "aux": (torch.zeros(2), 4)}
    kept = KeptOutputs(out, label="sample 0")
    assert len(kept) == 2
    kept.check("sample 1", "backend")
    out["logits"][1] = 5.0
    with pytest.raises(ValidationError, match=rf"{REUSE_MESSAGE}: output\['logits'\] returned for sample 0 changed "
                                              r"when sample 1 ran \(1/3 elements differ\)"):
        kept.check("sample 1", "backend")


def test_written_tensors_and_aliases():
    buffer = torch.ones(4)
    written = torch.zeros(2)
    kept = KeptOutputs((buffer, buffer[:2]), [("kwargs['cache'].keys[0]", written)], label="sample 0")
    assert len(kept) == 3  # the same object once; a view is its own entry
    written.fill_(1.0)
    with pytest.raises(ValidationError, match=r"kwargs\['cache'\]\.keys\[0\] returned for sample 0 changed"):
        kept.check("sample 2", "backend")


def test_an_unreadable_kept_output_fails(monkeypatch):
    kept = KeptOutputs(torch.ones(2).as_subclass(_Poisoned), label="sample 0")
    kept.check("sample 1", "backend")
    monkeypatch.setattr(_Poisoned, "overwritten", True)
    with pytest.raises(ValidationError, match=rf"{REUSE_MESSAGE}: output returned for sample 0 cannot be read"):
        kept.check("sample 1", "backend")


def test_tensors_that_cannot_be_compared_are_not_watched_and_sparse_ones_are():
    assert len(KeptOutputs(torch.ones(2).as_subclass(_Incomparable))) == 0
    sparse = torch.eye(3).to_sparse()
    kept = KeptOutputs(sparse, label="sample 0")
    assert len(kept) == 1
    kept.check("sample 1", "backend")
    sparse.values().mul_(2)
    with pytest.raises(ValidationError, match=REUSE_MESSAGE):
        kept.check("sample 1", "backend")
