"""One driver process per vLLM release for the whole test session (building its environment if needed).

The tests of this folder share them; ``conftest.py`` closes them at the end.
"""

from __future__ import annotations

from schedconf.conformance.adapters.vllm_v1 import VllmV1Sut, make_vllm_sut
from schedconf.conformance.engines.vllm_env import ensure_vllm_env

_SUTS: dict[str, VllmV1Sut] = {}


def vllm_sut(version: str) -> VllmV1Sut:
    """The session's driver process for ``version``, building its environment if needed."""
    if version not in _SUTS:
        ensure_vllm_env(version)
        sut = make_vllm_sut(f"vllm-v1@{version}")
        assert isinstance(sut, VllmV1Sut)
        _SUTS[version] = sut
    return _SUTS[version]


def close_vllm_suts() -> None:
    """Close every driver process started by :func:`vllm_sut`."""
    for sut in _SUTS.values():
        sut.close()
    _SUTS.clear()
