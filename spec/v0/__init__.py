"""The executable model of vLLM 0.10.2's legacy (v0) scheduler; see README.md."""
