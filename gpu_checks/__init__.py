"""Checks and benchmarks that need a GPU (they run on CPU at smoke size); may import torch and impl."""
