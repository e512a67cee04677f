"""nano-vllm's own scheduler as a system under test: ``--sut nano-vllm@VERSION``.

The harness never imports nano-vllm. This adapter starts the release's own
interpreter (``.venvs/nano-vllm-VERSION/bin/python``, built by ``schedconf env
nano-vllm VERSION``) on ``conformance/engines/nanovllm_driver.py`` and speaks
the JSON-lines protocol with it through
:class:`~schedconf.conformance.adapters.stdio.StdioSut`. One subprocess serves a whole
campaign: every trace sends a fresh ``init``.

The registry (``schedconf.conformance.adapters.ADAPTER_PREFIXES``) names
:func:`make_nanovllm_sut` for the ``nano-vllm@`` prefix and imports this
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

PREFIX = "nano-vllm@"
FAMILY = "nano-vllm"
IMPORT_TIMEOUT_S = 60.0
"""The first ``init`` imports transformers (~1-2 s; more on a cold disk)."""


class NanoVllmEnvNotReady(UnknownSut):
    """The environment of the requested release is not built; the message gives the command."""


class NanoVllmSut(StdioSut):
    """A StdioSut running nano-vllm ``version``'s driver."""

    honours_late_unsupported = True
    """Our driver answers ``unsupported`` mid-trace only for inputs its fake model runner cannot produce."""

    # What nano-vllm cannot express at all (see conformance/engines/nanovllm_driver.py):
    # campaigns against it generate only configs it can run, instead of "unknown" verdicts.
    forced_config: dict[str, Any] = {
        "policy": "fcfs",
        "num_spec_tokens": 0,
        "num_lookahead_tokens": 0,
        "long_prefill_token_threshold": 0,
        "enable_chunked_prefill": False,
        "enable_prefix_caching": True,
    }

    def __init__(self, version: str, timeout_s: float = DEFAULT_TIMEOUT_S, root: Path | None = None) -> None:
        self.version = version
        python = env_python(FAMILY, version, root)
        command = f"{shlex.quote(str(python))} -m schedconf.conformance.engines.nanovllm_driver"
        super().__init__(
            command,
            timeout_s=timeout_s,
            env=driver_env(FAMILY, version, root),
            name=f"{PREFIX}{version}",
            startup_timeout_s=IMPORT_TIMEOUT_S,
        )


def make_nanovllm_sut(name: str, root: Path | None = None) -> SchedulerUnderTest:
    """Build the SUT for ``nano-vllm@VERSION``; raise NanoVllmEnvNotReady with the build command if needed."""
    version = name.removeprefix(PREFIX)
    pinned = ", ".join(supported_versions(FAMILY))
    if not version:
        raise UnknownSut(f"--sut {name!r}: expected {PREFIX}VERSION, e.g. {PREFIX}20260210 (pinned: {pinned})")
    if version not in supported_versions(FAMILY):
        raise UnknownSut(
            f"--sut {name!r}: no pinned environment for nano-vllm {version}; "
            f"pinned releases: {pinned} (conformance/engines/envs/)"
        )
    if not is_env_ready(FAMILY, version, root):
        raise NanoVllmEnvNotReady(f"--sut {name!r}: {not_ready_message(FAMILY, version)}")
    return NanoVllmSut(version, root=root)


__all__ = ["PREFIX", "NanoVllmEnvNotReady", "NanoVllmSut", "make_nanovllm_sut"]
