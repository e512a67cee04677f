"""The real vLLM v1 scheduler as a system under test: ``--sut vllm-v1@VERSION``.

The harness never imports vLLM. This adapter starts the release's own
interpreter (``.venvs/vllm-VERSION/bin/python``, built by ``schedconf env vllm
VERSION``) on ``conformance/vllm_driver.py`` and speaks the JSON-lines protocol
with it through :class:`~conformance.adapters.stdio.StdioSut`. One subprocess
serves a whole campaign: every trace sends a fresh ``init``.

The registry (``conformance.adapters.ADAPTER_PREFIXES``) names
:func:`make_vllm_sut` for the ``vllm-v1@`` prefix and imports this module
only when such a SUT is asked for.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from conformance.adapters import UnknownSut
from conformance.adapters.stdio import DEFAULT_TIMEOUT_S, StdioSut
from conformance.engine_env import get_driver_module
from conformance.sut import SchedulerUnderTest
from conformance.vllm_env import (
    REPO_ROOT,
    driver_env,
    is_vllm_env_ready,
    not_ready_message,
    supported_versions,
    vllm_python,
)

PREFIX = "vllm-v1@"
IMPORT_TIMEOUT_S = 180.0
"""The first ``init`` imports vLLM (~10 s on two cores, more on a cold disk)."""


class VllmEnvNotReady(UnknownSut):
    """The environment of the requested release is not built; the message gives the command."""


class VllmV1Sut(StdioSut):
    """A StdioSut running vLLM ``version``'s driver, with the ``stats`` extension."""

    honours_late_unsupported = True
    """Our driver answers ``unsupported`` mid-trace only for inputs its fake model runner cannot produce."""

    # vLLM derives lookahead from the spec-decode method, so a campaign against
    # it generates traces without our free lookahead knob (see vllm_driver).
    forced_config: dict[str, Any] = {"num_lookahead_tokens": 0}
    in_flight = True
    """The driver runs steps in flight (``max_concurrent_batches > 1``, the
    ``-async`` profiles on vLLM's AsyncScheduler; its ``init`` also says so in
    ``capabilities.in_flight``); ``update_from_output(..., step=)`` (StdioSut)
    sends the step the output answers."""

    def __init__(self, version: str, timeout_s: float = DEFAULT_TIMEOUT_S, root: Path | None = None) -> None:
        self.version = version
        python = vllm_python(version, root)
        command = f"{shlex.quote(str(python))} -m conformance.vllm_driver"
        # importing vLLM takes a while: the first init of a new process gets IMPORT_TIMEOUT_S
        super().__init__(command, timeout_s=timeout_s, env=driver_env(version, root), name=f"{PREFIX}{version}",
                         startup_timeout_s=IMPORT_TIMEOUT_S)

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """Seconds spent inside vLLM's ``schedule()`` + ``update_from_output()`` since ``init``.

        The driver's optional ``stats`` method (not part of protocol version 1):
        ``{"scheduler_seconds", "schedule_seconds", "update_seconds", "steps"}``.
        """
        return self.call("stats", {"reset": reset})


def make_vllm_sut(name: str, root: Path | None = None) -> SchedulerUnderTest:
    """Build the SUT for ``vllm-v1@VERSION``; raise VllmEnvNotReady with the build command if needed."""
    version = name.removeprefix(PREFIX)
    if not version:
        raise UnknownSut(f"--sut {name!r}: expected {PREFIX}VERSION, e.g. {PREFIX}0.33.0 "
                         f"(pinned: {', '.join(supported_versions())})")
    v1_releases = [v for v in supported_versions() if get_driver_module("vllm", v) == "conformance.vllm_driver"]
    if version in supported_versions() and version not in v1_releases:
        raise UnknownSut(f"--sut {name!r}: vLLM {version} ships the legacy v0 scheduler, not v1: "
                         f"use vllm-v0@{version} (v1 releases: {', '.join(v1_releases)})")
    if version not in supported_versions():
        raise UnknownSut(f"--sut {name!r}: no pinned environment for vLLM {version}; "
                         f"pinned releases: {', '.join(supported_versions())} (conformance/envs/)")
    if not is_vllm_env_ready(version, root):
        raise VllmEnvNotReady(f"--sut {name!r}: {not_ready_message(version)}")
    return VllmV1Sut(version, root=root)


__all__ = ["PREFIX", "VllmEnvNotReady", "VllmV1Sut", "make_vllm_sut", "REPO_ROOT"]

if __name__ == "__main__":  # pragma: no cover - a quick manual check
    print(make_vllm_sut(sys.argv[1] if len(sys.argv) > 1 else f"{PREFIX}0.33.0").name)
