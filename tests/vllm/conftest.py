"""Shared by the vLLM tests: the session's driver processes are closed when the session ends."""

from collections.abc import Iterator

import pytest
from vllm_drivers import close_vllm_suts


@pytest.fixture(scope="session", autouse=True)
def _close_vllm_drivers() -> Iterator[None]:
    yield
    close_vllm_suts()
