"""Build the per-release virtual environments that run the real vLLM schedulers.

vLLM pins its own torch and dozens of packages, and two releases cannot share
one environment, so each release lives in its own venv and runs as a
subprocess (``conformance/engines/vllm_driver.py``); the harness never imports vLLM.

``schedconf env vllm VERSION`` (or ``python -m schedconf.conformance.engines.vllm_env VERSION``)
builds ``<repo>/.venvs/vllm-VERSION/`` (git-ignored) from the pinned list
``conformance/engines/envs/vllm-VERSION.txt``:

1. ``python -m venv`` with the interpreter running this code (Python 3.11 on
   x86_64 is what the lists were pinned for), then ``pip install -U pip``;
2. ``pip install --no-deps -r conformance/engines/envs/vllm-VERSION.txt``: only the
   import chain of ``vllm.v1.core.sched.scheduler.Scheduler``, over torch
   2.13.0 CPU (``torch==2.13.0+cpu`` must be findable: a local find-links
   folder, or ``SCHEDCONF_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu``);
3. a self-check: the driver builds one real scheduler (``python -m
   schedconf.conformance.engines.vllm_driver --self-check``), which also warms the model
   inspection cache in ``.venvs/vllm-VERSION/vllm-cache`` (``VLLM_CACHE_ROOT``;
   each install has its own, so two installs never overwrite each other's);
4. a marker file ``.schedconf-ready`` holding the sha256 of the pinned list.

Rules:

* Idempotent: an environment whose marker matches the pinned list is ready and
  is not touched (``--force`` rebuilds it). A half-built one (no marker, or the
  list changed) is deleted and built again.
* Concurrent builders (pytest-xdist workers) serialise on a lock file
  ``.venvs/vllm-VERSION.lock``; the second one finds the first one's result.
* Every step prints a progress line to stderr; a failing step raises
  :class:`VllmEnvError` naming the step, the command and the tail of its output.

Environment variables: ``SCHEDCONF_VLLM_FIND_LINKS`` (``os.pathsep``-separated
folders passed to pip as ``--find-links``, e.g. where a downloaded vLLM wheel
lies), ``SCHEDCONF_TORCH_INDEX_URL`` (an extra index for the CPU torch wheel).

Command line (what follows ``schedconf env vllm``)::

    VERSION [--force] [--check] [--root DIR]

``--check`` only reports whether the environment is ready (exit 0) or not
(exit 1). Exit status 2 is a build failure.

The builder itself is :mod:`schedconf.conformance.engines.engine_env` (one builder for every
engine family); this module keeps the vLLM names as thin wrappers over it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from schedconf.conformance.engines import engine_env
from schedconf.conformance.engines.engine_env import (
    ENVS_DIR,
    READY_MARKER,
    REPO_ROOT,
    SELF_CHECK_TIMEOUT_S,
    EngineEnvError,
)

FAMILY = "vllm"
DRIVER_MODULE = engine_env.FAMILIES[FAMILY].driver_module

VllmEnvError = EngineEnvError
"""A vLLM environment that cannot be built or used (the builder's EngineEnvError)."""


# ------------------------------------------------------------------ locations


def supported_versions() -> list[str]:
    """The releases that have a pinned list in ``conformance/engines/envs/``, oldest first."""
    return engine_env.supported_versions(FAMILY)


def requirements_file(version: str) -> Path:
    """The pinned ``--no-deps`` list of ``version``; raises VllmEnvError if there is none."""
    return engine_env.requirements_file(FAMILY, version)


def venv_dir(version: str, root: Path | None = None) -> Path:
    """``<root>/.venvs/vllm-VERSION`` (root defaults to the repository root)."""
    return engine_env.venv_dir(FAMILY, version, root)


def vllm_python(version: str, root: Path | None = None) -> Path:
    """The interpreter of ``version``'s environment (it may not exist yet)."""
    return engine_env.env_python(FAMILY, version, root)


def driver_env(version: str, root: Path | None = None) -> dict[str, str]:
    """Environment variables the driver process needs (added to the caller's).

    ``PYTHONPATH`` is this checkout's root (the driver imports
    ``schedconf.conformance.protocol_server``), ``VLLM_CACHE_ROOT`` and the tiny model
    folder live inside the venv, the hub is offline, the CPU platform and the
    V1 model-runner layout of ``SchedulerOutput`` are forced.
    """
    return engine_env.driver_env(FAMILY, version, root)


def is_vllm_env_ready(version: str, root: Path | None = None) -> bool:
    """True if the environment was built from the current pinned list and passed its self-check."""
    return engine_env.is_env_ready(FAMILY, version, root)


def not_ready_message(version: str) -> str:
    """What to tell a user whose environment for ``version`` is missing."""
    return (
        f"the vLLM {version} environment is not built ({venv_dir(version)} is missing or incomplete); "
        f"build it with:  schedconf env vllm {version}   (or: python -m schedconf.conformance.engines.vllm_env {version})"
    )


# ---------------------------------------------------------------------- build


def check_vllm_env(version: str, root: Path | None = None) -> str:
    """Run the driver's self-check in the environment; return its report line."""
    return engine_env.check_env(FAMILY, version, root)


def build_vllm_env(version: str, root: Path | None = None, force: bool = False, python: str | None = None) -> Path:
    """Build (or find) the environment of vLLM ``version``; return its interpreter."""
    return engine_env.build_env(FAMILY, version, root, force=force, python=python)


def ensure_vllm_env(version: str, root: Path | None = None) -> Path:
    """The interpreter of ``version``'s environment, building it first if needed."""
    return engine_env.ensure_env(FAMILY, version, root)


# ----------------------------------------------------------------------- CLI


def add_env_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``schedconf env vllm`` to ``parser``."""
    engine_env.add_env_arguments(parser, FAMILY)


def run_env_vllm(args: argparse.Namespace) -> int:
    """Carry out parsed ``schedconf env vllm`` arguments; return the exit status."""
    return engine_env.run_env(args, FAMILY)


def main_env(argv: Sequence[str] | None = None) -> int:
    """``schedconf env vllm VERSION [--force] [--check] [--root DIR]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="schedconf env vllm", description="Build the virtual environment that runs a vLLM release's scheduler."
    )
    add_env_vllm_arguments(parser)
    return run_env_vllm(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))


__all__ = [
    "DRIVER_MODULE",
    "ENVS_DIR",
    "READY_MARKER",
    "REPO_ROOT",
    "SELF_CHECK_TIMEOUT_S",
    "VllmEnvError",
    "add_env_vllm_arguments",
    "build_vllm_env",
    "check_vllm_env",
    "driver_env",
    "ensure_vllm_env",
    "is_vllm_env_ready",
    "main_env",
    "not_ready_message",
    "requirements_file",
    "run_env_vllm",
    "supported_versions",
    "venv_dir",
    "vllm_python",
]


if __name__ == "__main__":
    sys.exit(main_env())
