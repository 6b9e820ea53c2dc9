"""Checkpoint format shared by AOT save/load and (later) JIT persistence.

- `manifest.py`: the folder, `manifest.json`, file index with sha256, atomic `CheckpointWriter`,
  verifying `CheckpointReader` (and the trust note on `torch.load(weights_only=False)`).
- `backend_state.py`: a backend's `to_dict()` split into manifest JSON, copied Path artifacts and a torch file.
- `module_state.py`: one tuned module's entry: identity (class, parameter shapes), weights, graph specs,
  one backend per graph; the "same model" check.
"""
