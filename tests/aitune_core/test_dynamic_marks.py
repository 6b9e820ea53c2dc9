"""DynamicMarks: dynamo's marks put on a call's tensors come off afterwards, leaving the program's own marks."""

from __future__ import annotations

import torch

from aitune_core.backends.dynamic_marks import DynamicMarks


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
