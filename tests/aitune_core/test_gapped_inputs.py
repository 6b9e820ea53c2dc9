"""gapped_inputs: sliced arguments reach a compiled graph packed, so its guards hold and nothing compiles in the
call; tensors without gaps keep their layout."""

from __future__ import annotations

import torch

from aitune_core.backends.gapped_inputs import gapped, pack
from aitune_core.backends.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig


def test_slices_and_expanded_tensors_have_gaps_permuted_and_channels_last_ones_do_not():
    base = torch.randn(4, 32)
    assert gapped(base[:, :16]) and gapped(base[::2]) and gapped(torch.randn(1, 8).expand(4, 8))
    assert not gapped(base) and not gapped(base.t()) and gapped(base[:, :1])  # (one column: rows apart)
    assert not gapped(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last))
    assert not gapped(torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1))
    assert not gapped(base[:1, :16])  # (a single row: no gap between rows)


def test_pack_copies_only_gapped_tensors_and_keeps_the_call_when_there_is_none():
    base, mask = torch.randn(4, 32), torch.ones(4, 16)
    args, kwargs = (base,), {"mask": mask, "flag": True}
    assert pack(args, kwargs) == (args, kwargs) and pack(args, kwargs)[1] is kwargs
    packed_args, packed_kwargs = pack((base[:, :16], 3), {"ids": base[:, 8:24], "mask": mask})
    assert packed_args[0].is_contiguous() and torch.equal(packed_args[0], base[:, :16]) and packed_args[1] == 3
    assert packed_kwargs["ids"].is_contiguous() and torch.equal(packed_kwargs["ids"], base[:, 8:24])
    assert packed_kwargs["mask"] is mask


class _Keyword(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (self.lin(self.emb(input_ids)) * attention_mask.unsqueeze(-1)).sum(dim=1)


def test_sliced_calls_are_served_by_the_compiled_graph_without_a_miss(tmp_path):
    # before, every sliced call missed the graph's guards (its samples are packed clones), ran the original
    # forward, and the JIT re-tuned it three times in vain before compiling inside the calls
    from aitune_core.recording.graph_recorder import GraphRecorder

    model = _Keyword().eval()
    recorder = GraphRecorder(model)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (4, 40), generator=generator)
    with torch.no_grad():
        for length in (12, 30, 21):
            kwargs = {"input_ids": tokens[:, :length], "attention_mask": torch.ones(4, length)}
            recorder.record((), kwargs, model(**kwargs))
    spec = recorder.graph_specs[0]
    backend = TorchInductorBackend(TorchInductorBackendConfig(fullgraph=True)).build(
        model, spec, recorder.samples(spec), torch.device("cpu"), tmp_path)
    with torch.no_grad():
        for length in (14, 29, 12):
            kwargs = {"input_ids": tokens[:, :length], "attention_mask": torch.ones(4, length)}
            assert not kwargs["input_ids"].is_contiguous()
            torch.testing.assert_close(backend.serve(**kwargs), model(**kwargs), rtol=1e-4, atol=1e-5)
