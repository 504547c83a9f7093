"""Hydra config tree of grpo-vram-sweep (a package so Hydra finds it from the console script)."""
