"""Shared settings for the impl/ tests: one torch thread (CI runs two pytest workers on two cores)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny float64 CPU model every engine test uses (weights from seed 0)."""
    from schedconf.impl.model import TINY, LlamaModel

    return LlamaModel(TINY)
