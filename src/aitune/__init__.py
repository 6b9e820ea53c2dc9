"""aitune: PyTorch inference auto-tuner (public facade; see `aitune.torch`)."""

__version__ = "0.1.0"
