"""Plain workload scripts that the suite runs in subprocesses (they never import aitune)."""
