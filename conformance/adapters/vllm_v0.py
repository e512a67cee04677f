"""vLLM's legacy v0 scheduler as a system under test: ``--sut vllm-v0@0.10.2``.

The harness never imports vLLM. This adapter starts the release's own
interpreter (``.venvs/vllm-0.10.2/bin/python``, built by ``schedconf env vllm
0.10.2``) on ``conformance/engines/vllm_v0_driver.py`` and speaks the JSON-lines
protocol with it through :class:`~schedconf.conformance.adapters.stdio.StdioSut`. One
subprocess serves a whole campaign: every trace sends a fresh ``init`` (profile
``vllm-0.10``, a v0 config).

Only releases whose environment runs the v0 driver qualify
(``schedconf.conformance.engines.engine_env.FAMILIES["vllm"].release_drivers``): 0.10.2, the
last release that ships ``vllm/core/scheduler.py``.

The registry (``schedconf.conformance.adapters.ADAPTER_PREFIXES``) names
:func:`make_vllm_v0_sut` for the ``vllm-v0@`` prefix and imports this module
only when such a SUT is asked for.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from schedconf.conformance.adapters import UnknownSut
from schedconf.conformance.adapters.stdio import DEFAULT_TIMEOUT_S, StdioSut
from schedconf.conformance.engines.engine_env import (
    driver_env,
    env_python,
    get_driver_module,
    is_env_ready,
    not_ready_message,
)
from schedconf.conformance.sut import SchedulerUnderTest

PREFIX = "vllm-v0@"
FAMILY = "vllm"
DRIVER_MODULE = "schedconf.conformance.engines.vllm_v0_driver"
IMPORT_TIMEOUT_S = 180.0
"""The first ``init`` imports vLLM (~10 s on two cores, more on a cold disk)."""


class VllmV0EnvNotReady(UnknownSut):
    """The environment of the requested release is not built; the message gives the command."""


def v0_versions() -> list[str]:
    """The vLLM releases whose environment runs the v0 driver."""
    from schedconf.conformance.engines.engine_env import supported_versions

    return [v for v in supported_versions(FAMILY) if get_driver_module(FAMILY, v) == DRIVER_MODULE]


class VllmV0Sut(StdioSut):
    """A StdioSut running vLLM ``version``'s v0 driver."""

    honours_late_unsupported = True
    """Our driver answers ``unsupported`` mid-trace only for inputs its fake model runner cannot produce."""

    def __init__(self, version: str, timeout_s: float = DEFAULT_TIMEOUT_S, root: Path | None = None) -> None:
        self.version = version
        python = env_python(FAMILY, version, root)
        command = f"{shlex.quote(str(python))} -m {DRIVER_MODULE}"
        super().__init__(
            command,
            timeout_s=timeout_s,
            env=driver_env(FAMILY, version, root),
            name=f"{PREFIX}{version}",
            startup_timeout_s=IMPORT_TIMEOUT_S,
        )


def make_vllm_v0_sut(name: str, root: Path | None = None) -> SchedulerUnderTest:
    """Build the SUT for ``vllm-v0@VERSION``; raise VllmV0EnvNotReady with the build command if needed."""
    version = name.removeprefix(PREFIX)
    pinned = ", ".join(v0_versions()) or "none"
    if not version:
        raise UnknownSut(f"--sut {name!r}: expected {PREFIX}VERSION, e.g. {PREFIX}0.10.2 (v0 releases: {pinned})")
    if version not in v0_versions():
        raise UnknownSut(
            f"--sut {name!r}: vLLM {version} has no v0 scheduler environment; v0 releases: {pinned} "
            f"(the legacy scheduler was removed in 0.11.0)"
        )
    if not is_env_ready(FAMILY, version, root):
        raise VllmV0EnvNotReady(f"--sut {name!r}: {not_ready_message(FAMILY, version)}")
    return VllmV0Sut(version, root=root)


__all__ = ["PREFIX", "VllmV0EnvNotReady", "VllmV0Sut", "make_vllm_v0_sut", "v0_versions"]
