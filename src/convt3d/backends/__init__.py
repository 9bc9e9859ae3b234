"""Backends: each takes validated tensors and a Plan and returns the output."""
