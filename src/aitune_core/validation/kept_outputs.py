"""Output-aliasing check: what a backend returned for one call must keep its values while later calls run.

A caller may keep an output for as long as it likes (a KV cache keeps every layer's keys and values across a whole
`generate()`, a diffusion loop keeps the previous step's latents). A backend that hands out the same buffer on
every call, written in place (as a CUDA-graph replay does with its static output buffers), silently changes those
kept values on its next call. `KeptOutputs` holds the tensors one call returned (the objects themselves, plus the
tensors the backend wrote into argument objects) together with a private clone of their values taken right when
they were returned; `check()` after each later call proves they still hold those values. Reading a kept tensor
may itself raise (torch's CUDA-graph trees refuse access to an output a later replay overwrote): that is the
same failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from aitune_core.errors import ValidationError
from aitune_core.validation.tensor_slots import count_changed, snapshot, tensor_slots

REUSE_MESSAGE = "output buffer reused / overwritten by a later call"


class KeptOutputs:
    """The tensors one call returned (and wrote into its arguments), with clones of their values at return time."""

    def __init__(self, output: Any, written: Iterable[tuple[str, torch.Tensor]] = (), label: str = "") -> None:
        self.label = label
        self._kept: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        seen: set[int] = set()
        for path, tensor in [*tensor_slots(output, "output").items(), *written]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            values = snapshot(tensor)
            if values is not None:
                self._kept.append((path, tensor, values))

    def __len__(self) -> int:
        return len(self._kept)

    def check(self, later: str, where: str) -> None:
        """Raise `ValidationError` when a kept tensor no longer holds its values after `later` (e.g. "sample 1") ran."""
        for path, tensor, values in self._kept:
            try:
                changed = count_changed(tensor, values)
            except Exception as exc:
                raise ValidationError(
                    f"{where}: {REUSE_MESSAGE}: {path} returned for {self.label} cannot be read after {later} ran "
                    f"({type(exc).__name__}: {exc}); the backend must return tensors it never writes again"
                ) from exc
            if changed:
                raise ValidationError(
                    f"{where}: {REUSE_MESSAGE}: {path} returned for {self.label} changed when {later} ran "
                    f"({changed}/{max(values.numel(), 1)} elements differ); a caller that keeps an output (a KV "
                    "cache, the previous step of a loop) would see it change, so the backend must return tensors it "
                    "never writes again (e.g. copy CUDA-graph outputs)"
                )
