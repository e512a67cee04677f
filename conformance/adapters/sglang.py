"""SGLang's own scheduling classes as a system under test: ``--sut sglang@VERSION``.

The harness never imports SGLang. This adapter starts the release's own
interpreter (``.venvs/sglang-VERSION/bin/python``, built by ``schedconf env
sglang VERSION``) on ``conformance/engines/sglang_driver.py`` and speaks the
JSON-lines protocol with it through :class:`~schedconf.conformance.adapters.stdio.StdioSut`.
One subprocess serves a whole campaign: every trace sends a fresh ``init``.

The registry (``schedconf.conformance.adapters.ADAPTER_PREFIXES``) names
:func:`make_sglang_sut` for the ``sglang@`` prefix and imports this module
only when such a SUT is asked for.
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

PREFIX = "sglang@"
FAMILY = "sglang"
IMPORT_TIMEOUT_S = 180.0
"""The first ``init`` imports torch, transformers and sglang.srt (~12 s warm; much more on a cold disk)."""


class SglangEnvNotReady(UnknownSut):
    """The environment of the requested release is not built; the message gives the command."""


class SglangSut(StdioSut):
    """A StdioSut running SGLang ``version``'s driver."""

    honours_late_unsupported = True
    """Our driver answers ``unsupported`` mid-trace only for inputs its fake model runner cannot produce."""

    # What the driver cannot express (see conformance/engines/sglang_driver.py): campaigns
    # against it generate only configs it can run, instead of "unknown" verdicts.
    forced_config: dict[str, Any] = {
        # page_size > 1 runs (SGLang's torch page allocator), but chunked prefill needs a budget the page
        # size divides (SGLang's server refuses others): generated block sizes would make a third unknown.
        "block_size": 1,
        "num_spec_tokens": 0,
        "num_lookahead_tokens": 0,
        "long_prefill_token_threshold": 0,
    }

    pool_headroom_blocks = 2
    """SGLang's intake clips ``max_new_tokens`` to the pool less the input and two more slots
    (``allocator.max_new_tokens_for_memory``): two more blocks in each generated pool let it keep the
    requests the generator sized the pool for."""

    def __init__(self, version: str, timeout_s: float = DEFAULT_TIMEOUT_S, root: Path | None = None) -> None:
        self.version = version
        python = env_python(FAMILY, version, root)
        command = f"{shlex.quote(str(python))} -m schedconf.conformance.engines.sglang_driver"
        super().__init__(
            command,
            timeout_s=timeout_s,
            env=driver_env(FAMILY, version, root),
            name=f"{PREFIX}{version}",
            startup_timeout_s=IMPORT_TIMEOUT_S,
        )


def make_sglang_sut(name: str, root: Path | None = None) -> SchedulerUnderTest:
    """Build the SUT for ``sglang@VERSION``; raise SglangEnvNotReady with the build command if needed."""
    version = name.removeprefix(PREFIX)
    pinned = ", ".join(supported_versions(FAMILY))
    if not version:
        raise UnknownSut(f"--sut {name!r}: expected {PREFIX}VERSION, e.g. {PREFIX}0.5.23 (pinned: {pinned})")
    if version not in supported_versions(FAMILY):
        raise UnknownSut(
            f"--sut {name!r}: no pinned environment for SGLang {version}; "
            f"pinned releases: {pinned} (conformance/engines/envs/)"
        )
    if not is_env_ready(FAMILY, version, root):
        raise SglangEnvNotReady(f"--sut {name!r}: {not_ready_message(FAMILY, version)}")
    return SglangSut(version, root=root)


__all__ = ["PREFIX", "SglangEnvNotReady", "SglangSut", "make_sglang_sut"]
