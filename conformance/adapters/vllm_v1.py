"""The real vLLM v1 scheduler as a system under test: ``--sut vllm-v1@VERSION`` or ``vllm-v1@PATH``.

``vllm-v1@PATH`` is a user's own build: PATH is a virtual environment (or its
Python interpreter) in which vLLM is installed, an editable checkout, a fork
or a nightly included. The driver runs in that interpreter with this
checkout's code; what the build is (its version, whether the driver can drive
its scheduler) is read from it by feature before any trace
(:func:`get_vllm_build`), and its release profile follows from its version,
or from ``--profile`` when the version has none of its own.

The harness never imports vLLM. This adapter starts the release's own
interpreter (``.venvs/vllm-VERSION/bin/python``, built by ``schedconf env vllm
VERSION``) on ``conformance/engines/vllm_driver.py`` and speaks the JSON-lines protocol
with it through :class:`~schedconf.conformance.adapters.stdio.StdioSut`. One subprocess
serves a whole campaign: every trace sends a fresh ``init``.

The registry (``schedconf.conformance.adapters.ADAPTER_PREFIXES``) names
:func:`make_vllm_sut` for the ``vllm-v1@`` prefix and imports this module
only when such a SUT is asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedconf.conformance.adapters import UnknownSut
from schedconf.conformance.adapters.stdio import DEFAULT_TIMEOUT_S, StdioSut
from schedconf.conformance.engines.engine_env import get_driver_module, get_family
from schedconf.conformance.engines.vllm_env import (
    REPO_ROOT,
    driver_env,
    is_vllm_env_ready,
    not_ready_message,
    supported_versions,
    vllm_python,
)
from schedconf.conformance.sut import SchedulerUnderTest

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
        command = f"{shlex.quote(str(python))} -m schedconf.conformance.engines.vllm_driver"
        # importing vLLM takes a while: the first init of a new process gets IMPORT_TIMEOUT_S
        super().__init__(
            command,
            timeout_s=timeout_s,
            env=driver_env(version, root),
            name=f"{PREFIX}{version}",
            startup_timeout_s=IMPORT_TIMEOUT_S,
        )

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """Seconds spent inside vLLM's ``schedule()`` + ``update_from_output()`` since ``init``.

        The driver's optional ``stats`` method (not part of protocol version 1):
        ``{"scheduler_seconds", "schedule_seconds", "update_seconds", "steps"}``.
        """
        return self.call("stats", {"reset": reset})


def is_build_path(spec: str) -> bool:
    """Does the part after ``vllm-v1@`` name a path (a user's build) rather than a pinned release?"""
    return "/" in spec or spec.startswith((".", "~"))


@dataclass(frozen=True)
class VllmBuild:
    """A user's own vLLM, as its interpreter reports it (``python -m schedconf.conformance.engines.vllm_driver --describe``)."""

    python: Path
    version: str
    profile: str | None
    """``vllm-MAJOR.MINOR`` when that is one of our profiles; None for a version we have no profile of."""
    location: str


_BUILDS: dict[Path, VllmBuild] = {}


def resolve_build_python(spec: str) -> Path:
    """The interpreter of ``spec``: a virtual environment's ``bin/python``, or the interpreter itself."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "bin" / "python"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UnknownSut(
            f"--sut {PREFIX}{spec}: expected a virtual environment or a Python interpreter "
            f"in which vLLM is installed; {path} is not an executable file"
        )
    return path


def get_build_env(python: Path) -> dict[str, str]:
    """The driver's environment for a user's build: its caches in a folder of its own under ``.venvs/builds``."""
    digest = hashlib.sha256(str(python).encode()).hexdigest()[:12]
    return driver_env_for_home(REPO_ROOT / ".venvs" / "builds" / digest)


def get_vllm_build(spec: str) -> VllmBuild:
    """Ask a user's build what it is (once per process: importing vLLM takes ~10 s); UnknownSut if it cannot be driven."""
    python = resolve_build_python(spec)
    if python in _BUILDS:
        return _BUILDS[python]
    env = {**os.environ, **get_build_env(python)}
    try:
        proc = subprocess.run(
            [str(python), "-m", "schedconf.conformance.engines.vllm_driver", "--describe"],
            env=env,
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnknownSut(f"--sut {PREFIX}{spec}: cannot ask {python} what vLLM it has: {exc}") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise UnknownSut(f"--sut {PREFIX}{spec}: {python} cannot import vLLM's scheduler: {tail[0]}")
    described = json.loads(lines[-1])
    if described["missing"]:
        raise UnknownSut(
            f"--sut {PREFIX}{spec}: vLLM {described['version']} at {described['location']}: its "
            f"scheduler API moved beyond what the driver knows: no {', '.join(described['missing'])}"
        )
    from schedconf.spec.v1.profiles import PROFILES

    profile = described["profile"] if described["profile"] in PROFILES else None
    build = VllmBuild(python, described["version"], profile, described["location"])
    _BUILDS[python] = build
    return build


class VllmBuildSut(VllmV1Sut):
    """A user's own vLLM build's scheduler behind our driver (``vllm-v1@PATH``)."""

    def __init__(self, build: VllmBuild, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.version = build.version
        self.build = build
        env = get_build_env(build.python)
        if build.profile is None:
            # a version we have no profile of: the driver answers for the profile the run names (--profile)
            env["SCHEDCONF_VLLM_ANY_PROFILE"] = "1"
        StdioSut.__init__(
            self,
            f"{shlex.quote(str(build.python))} -m schedconf.conformance.engines.vllm_driver",
            timeout_s=timeout_s,
            env=env,
            name=f"{PREFIX}{build.location}",
            startup_timeout_s=IMPORT_TIMEOUT_S,
        )


def make_vllm_sut(name: str, root: Path | None = None) -> SchedulerUnderTest:
    """Build the SUT for ``vllm-v1@VERSION`` (VllmEnvNotReady with the build command if needed) or ``vllm-v1@PATH``."""
    version = name.removeprefix(PREFIX)
    if is_build_path(version):
        return VllmBuildSut(get_vllm_build(version))
    if not version:
        raise UnknownSut(
            f"--sut {name!r}: expected {PREFIX}VERSION, e.g. {PREFIX}0.33.0 (pinned: {', '.join(supported_versions())})"
        )
    v1_releases = [
        v for v in supported_versions() if get_driver_module("vllm", v) == "schedconf.conformance.engines.vllm_driver"
    ]
    if version in supported_versions() and version not in v1_releases:
        raise UnknownSut(
            f"--sut {name!r}: vLLM {version} ships the legacy v0 scheduler, not v1: "
            f"use vllm-v0@{version} (v1 releases: {', '.join(v1_releases)})"
        )
    if version not in supported_versions():
        raise UnknownSut(
            f"--sut {name!r}: no pinned environment for vLLM {version}; "
            f"pinned releases: {', '.join(supported_versions())} (conformance/engines/envs/)"
        )
    if not is_vllm_env_ready(version, root):
        raise VllmEnvNotReady(f"--sut {name!r}: {not_ready_message(version)}")
    return VllmV1Sut(version, root=root)


def driver_env_for_home(home: Path) -> dict[str, str]:
    """The vLLM driver's environment variables with its caches (tiny model, vLLM's cache) under ``home``."""
    return dict(get_family("vllm").env_vars(home))


__all__ = [
    "PREFIX",
    "VllmBuild",
    "VllmBuildSut",
    "VllmEnvNotReady",
    "VllmV1Sut",
    "get_vllm_build",
    "make_vllm_sut",
    "REPO_ROOT",
]

if __name__ == "__main__":  # pragma: no cover - a quick manual check
    print(make_vllm_sut(sys.argv[1] if len(sys.argv) > 1 else f"{PREFIX}0.33.0").name)
