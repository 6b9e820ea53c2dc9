"""DynamicMarks: dynamo's marks put on a call's tensors come off afterwards, leaving the program's own marks; an
Inductor backend's marked call keeps the caller's own containers."""

from __future__ import annotations

import torch

from aitune_core.backends.dynamic_marks import DynamicMarks
from aitune_core.backends.torch_inductor import TorchInductorBackend


def test_marks_come_off_and_a_plain_tensor_has_no_mark_attributes_left():
    tensor = torch.zeros(4, 6)
    marks = DynamicMarks()
    marks.keep(tensor)
    torch._dynamo.mark_dynamic(tensor, 1, min=2, max=8)
    assert 1 in tensor._dynamo_dynamic_indices
    marks.take_off()
    assert vars(tensor) == {}


def test_the_programs_own_marks_are_put_back_as_they_were():
    tensor = torch.zeros(4, 6)
    torch._dynamo.mark_dynamic(tensor, 0)
    marks = DynamicMarks()
    marks.keep(tensor)
    marks.keep(tensor)  # (a tensor passed twice is kept once, before its first mark)
    torch._dynamo.mark_dynamic(tensor, 1, min=2, max=8)  # adds to the program's set in place
    torch._dynamo.maybe_mark_dynamic(tensor, 1)
    marks.take_off()
    assert tensor._dynamo_dynamic_indices == {0}
    assert not hasattr(tensor, "_dynamo_weak_dynamic_indices")


class _FillingModel(torch.nn.Module):
    """Fills the dict it is given and returns it, as sentence-transformers' modules do with their features."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)

    def forward(self, features: dict) -> dict:
        features["sentence"] = self.emb(features["input_ids"]).mean(1)
        return features


def test_the_first_call_in_another_grad_mode_fills_the_callers_own_dict_and_leaves_no_marks(tmp_path):
    # the first call in a mode the warm-up did not cover marks its dynamic axes; on detached aliases that rebuilt
    # the call's containers, so the forward filled a copy and the caller's BatchEncoding stayed unfilled
    # (sentence-transformers' encode(), which runs under inference_mode: every candidate failed validation)
    from aitune_core.recording.graph_recorder import GraphRecorder

    model = _FillingModel().eval()
    recorder = GraphRecorder(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for length in (12, 30, 21):
            ids = torch.randint(0, 50, (4, length), generator=generator)
            recorder.record(({"input_ids": ids},), {}, model({"input_ids": ids}))
    spec = recorder.graph_specs[0]
    backend = TorchInductorBackend().build(model, spec, recorder.samples(spec), torch.device("cpu"), tmp_path)
    ids = torch.randint(0, 50, (4, 17), generator=generator)
    torch._dynamo.maybe_mark_dynamic(ids, 0)  # the program's own mark stays
    own = {name: set(value) if isinstance(value, set) else value for name, value in vars(ids).items()}
    with torch.inference_mode():
        features = {"input_ids": ids}
        out = backend.infer(features)
        want = model({"input_ids": ids})["sentence"]
    assert out is features and sorted(features) == ["input_ids", "sentence"]
    torch.testing.assert_close(features["sentence"], want, rtol=1e-4, atol=1e-5)
    assert vars(ids) == own and own["_dynamo_weak_dynamic_indices"] == {0}, vars(ids)
