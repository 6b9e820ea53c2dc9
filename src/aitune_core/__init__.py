"""Shared tuning core of aitune: specs, recording, backends, strategies, validation, checkpoints.

Nothing here knows whether it is driven by the JIT import hook or by the AOT API.
"""
