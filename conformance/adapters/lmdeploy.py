"""LMDeploy's own PyTorch-engine scheduler as a system under test: ``--sut lmdeploy@VERSION``.

The harness never imports LMDeploy. This adapter starts the release's own
interpreter (``.venvs/lmdeploy-VERSION/bin/python``, built by ``schedconf env
lmdeploy VERSION``) on ``conformance/engines/lmdeploy_driver.py`` and speaks
the JSON-lines protocol with it through
:class:`~schedconf.conformance.adapters.stdio.StdioSut`. One subprocess serves a whole
campaign: every trace sends a fresh ``init``.

The registry (``schedconf.conformance.adapters.ADAPTER_PREFIXES``) names
:func:`make_lmdeploy_sut` for the ``lmdeploy@`` prefix and imports this
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

PREFIX = "lmdeploy@"
FAMILY = "lmdeploy"
IMPORT_TIMEOUT_S = 120.0
"""The first ``init`` imports torch, transformers and LMDeploy's engine modules (~6 s warm; more on a cold disk)."""


class LmdeployEnvNotReady(UnknownSut):
    """The environment of the requested release is not built; the message gives the command."""


class LmdeploySut(StdioSut):
    """A StdioSut running LMDeploy ``version``'s driver."""

    honours_late_unsupported = True
    """Our driver answers ``unsupported`` mid-trace only for inputs its fake model runner cannot produce."""

    # What LMDeploy cannot express at all (see conformance/engines/lmdeploy_driver.py):
    # campaigns against it generate only configs it can run, instead of "unknown" verdicts.
    # (max_num_batched_tokens < max_num_seqs is also unsupported; generated configs rarely have it.)
    pool_headroom_blocks = 1
    """LMDeploy's session length is its pool minus one block (``Engine._get_max_session_len``): one block
    more in each generated pool gives it the sequences the generator sized the pool for."""

    forced_config: dict[str, Any] = {
        "policy": "fcfs",
        "num_spec_tokens": 0,
        "num_lookahead_tokens": 0,
        "long_prefill_token_threshold": 0,
    }

    def __init__(self, version: str, timeout_s: float = DEFAULT_TIMEOUT_S, root: Path | None = None) -> None:
        self.version = version
        python = env_python(FAMILY, version, root)
        command = f"{shlex.quote(str(python))} -m schedconf.conformance.engines.lmdeploy_driver"
        super().__init__(
            command,
            timeout_s=timeout_s,
            env=driver_env(FAMILY, version, root),
            name=f"{PREFIX}{version}",
            startup_timeout_s=IMPORT_TIMEOUT_S,
        )


def make_lmdeploy_sut(name: str, root: Path | None = None) -> SchedulerUnderTest:
    """Build the SUT for ``lmdeploy@VERSION``; raise LmdeployEnvNotReady with the build command if needed."""
    version = name.removeprefix(PREFIX)
    pinned = ", ".join(supported_versions(FAMILY))
    if not version:
        raise UnknownSut(f"--sut {name!r}: expected {PREFIX}VERSION, e.g. {PREFIX}0.18.0 (pinned: {pinned})")
    if version not in supported_versions(FAMILY):
        raise UnknownSut(
            f"--sut {name!r}: no pinned environment for LMDeploy {version}; "
            f"pinned releases: {pinned} (conformance/engines/envs/)"
        )
    if not is_env_ready(FAMILY, version, root):
        raise LmdeployEnvNotReady(f"--sut {name!r}: {not_ready_message(FAMILY, version)}")
    return LmdeploySut(version, root=root)


__all__ = ["PREFIX", "LmdeployEnvNotReady", "LmdeploySut", "make_lmdeploy_sut"]
