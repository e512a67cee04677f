"""Aphrodite Engine's own v1 scheduler as a system under test: ``--sut aphrodite@VERSION``.

The harness never imports Aphrodite. This adapter starts the release's own
interpreter (``.venvs/aphrodite-VERSION/bin/python``, built by ``schedconf env
aphrodite VERSION``) on ``conformance/engines/aphrodite_driver.py`` and speaks
the JSON-lines protocol with it through
:class:`~schedconf.conformance.adapters.stdio.StdioSut`. One subprocess serves a whole
campaign: every trace sends a fresh ``init``.

Aphrodite 0.24.1's scheduler tracks vLLM 0.32: the driver answers profile
``vllm-0.32`` only (any other is ``unsupported``), so run it with
``--profile vllm-0.32``.

The registry (``schedconf.conformance.adapters.ADAPTER_PREFIXES``) names
:func:`make_aphrodite_sut` for the ``aphrodite@`` prefix and imports this
module only when such a SUT is asked for.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from schedconf.conformance.adapters import UnknownSut
from schedconf.conformance.adapters.stdio import DEFAULT_TIMEOUT_S, StdioSut
from schedconf.conformance.engines.engine_env import (
    driver_env,
    env_python,
    is_env_ready,
    not_ready_message,
    supported_versions,
)
from schedconf.conformance.sut import SchedulerUnderTest

PREFIX = "aphrodite@"
FAMILY = "aphrodite"
IMPORT_TIMEOUT_S = 180.0
"""The first ``init`` imports Aphrodite and torch (~10-20 s on two cores, more on a cold disk)."""


class AphroditeEnvNotReady(UnknownSut):
    """The environment of the requested release is not built; the message gives the command."""


class AphroditeSut(StdioSut):
    """A StdioSut running Aphrodite ``version``'s driver, with the vLLM driver's ``stats`` extension."""

    honours_late_unsupported = True
    """Our driver answers ``unsupported`` mid-trace only for inputs its fake model runner cannot produce."""

    # As for vLLM, lookahead is derived from the spec-decode method (EAGLE/MTP
    # only): a campaign generates traces without the model's free lookahead knob.
    forced_config: dict[str, Any] = {"num_lookahead_tokens": 0}

    def __init__(self, version: str, timeout_s: float = DEFAULT_TIMEOUT_S, root: Path | None = None) -> None:
        self.version = version
        python = env_python(FAMILY, version, root)
        command = f"{shlex.quote(str(python))} -m schedconf.conformance.engines.aphrodite_driver"
        super().__init__(
            command,
            timeout_s=timeout_s,
            env=driver_env(FAMILY, version, root),
            name=f"{PREFIX}{version}",
            startup_timeout_s=IMPORT_TIMEOUT_S,
        )

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """Seconds spent inside Aphrodite's ``schedule()`` + ``update_from_output()`` since ``init``."""
        return self.call("stats", {"reset": reset})


def make_aphrodite_sut(name: str, root: Path | None = None) -> SchedulerUnderTest:
    """Build the SUT for ``aphrodite@VERSION``; raise AphroditeEnvNotReady with the build command if needed."""
    version = name.removeprefix(PREFIX)
    pinned = ", ".join(supported_versions(FAMILY))
    if not version:
        raise UnknownSut(f"--sut {name!r}: expected {PREFIX}VERSION, e.g. {PREFIX}0.24.1 (pinned: {pinned})")
    if version not in supported_versions(FAMILY):
        raise UnknownSut(
            f"--sut {name!r}: no pinned environment for Aphrodite {version}; "
            f"pinned releases: {pinned} (conformance/engines/envs/)"
        )
    if not is_env_ready(FAMILY, version, root):
        raise AphroditeEnvNotReady(f"--sut {name!r}: {not_ready_message(FAMILY, version)}")
    return AphroditeSut(version, root=root)


__all__ = ["PREFIX", "AphroditeEnvNotReady", "AphroditeSut", "make_aphrodite_sut"]
