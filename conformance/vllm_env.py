"""Build the per-release virtual environments that run the real vLLM schedulers.

vLLM pins its own torch and dozens of packages, and two releases cannot share
one environment, so each release lives in its own venv and runs as a
subprocess (``conformance/vllm_driver.py``); the harness never imports vLLM.

``schedconf env vllm VERSION`` (or ``python -m conformance.vllm_env VERSION``)
builds ``<repo>/.venvs/vllm-VERSION/`` (git-ignored) from the pinned list
``conformance/envs/vllm-VERSION.txt``:

1. ``python -m venv`` with the interpreter running this code (Python 3.11 on
   x86_64 is what the lists were pinned for), then ``pip install -U pip``;
2. ``pip install --no-deps -r conformance/envs/vllm-VERSION.txt``: only the
   import chain of ``vllm.v1.core.sched.scheduler.Scheduler``, over torch
   2.13.0 CPU (``torch==2.13.0+cpu`` must be findable: a local find-links
   folder, or ``SCHEDCONF_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu``);
3. a self-check: the driver builds one real scheduler (``python -m
   conformance.vllm_driver --self-check``), which also warms the model
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
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The repository root (the folder holding ``conformance/``)."""

ENVS_DIR = Path(__file__).resolve().parent / "envs"
"""Where the pinned ``vllm-VERSION.txt`` lists live."""

READY_MARKER = ".schedconf-ready"
DRIVER_MODULE = "conformance.vllm_driver"
SELF_CHECK_TIMEOUT_S = 600.0


class VllmEnvError(Exception):
    """A vLLM environment that cannot be built or used; the message says what to do."""


# ------------------------------------------------------------------ locations

def supported_versions() -> list[str]:
    """The releases that have a pinned list in ``conformance/envs/``, oldest first."""
    versions = [p.stem.removeprefix("vllm-") for p in ENVS_DIR.glob("vllm-*.txt")]
    return sorted(versions, key=lambda v: tuple(int(x) if x.isdigit() else 0 for x in v.split(".")))


def requirements_file(version: str) -> Path:
    """The pinned ``--no-deps`` list of ``version``; raises VllmEnvError if there is none."""
    path = ENVS_DIR / f"vllm-{version}.txt"
    if not path.is_file():
        known = ", ".join(supported_versions()) or "none"
        raise VllmEnvError(f"no pinned environment for vLLM {version!r} (conformance/envs/vllm-{version}.txt); "
                           f"known releases: {known}")
    return path


def venv_dir(version: str, root: Path | None = None) -> Path:
    """``<root>/.venvs/vllm-VERSION`` (root defaults to the repository root)."""
    return (root or REPO_ROOT) / ".venvs" / f"vllm-{version}"


def vllm_python(version: str, root: Path | None = None) -> Path:
    """The interpreter of ``version``'s environment (it may not exist yet)."""
    return venv_dir(version, root) / "bin" / "python"


def driver_env(version: str, root: Path | None = None) -> dict[str, str]:
    """Environment variables the driver process needs (added to the caller's).

    ``PYTHONPATH`` is this checkout's root (the driver imports
    ``conformance.protocol_server``), ``VLLM_CACHE_ROOT`` and the tiny model
    folder live inside the venv, the hub is offline, the CPU platform and the
    V1 model-runner layout of ``SchedulerOutput`` are forced.
    """
    home = venv_dir(version, root)
    return {
        "PYTHONPATH": str(REPO_ROOT),  # the code of this checkout, wherever the venvs live
        "VLLM_CACHE_ROOT": str(home / "vllm-cache"),
        "SCHEDCONF_VLLM_MODEL_DIR": str(home / "tiny-model"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_USE_V2_MODEL_RUNNER": "0",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_LOGGING_LEVEL": "ERROR",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
    }


def _requirements_digest(version: str) -> str:
    return hashlib.sha256(requirements_file(version).read_bytes()).hexdigest()


def is_vllm_env_ready(version: str, root: Path | None = None) -> bool:
    """True if the environment was built from the current pinned list and passed its self-check.

    Cheap (reads one file): the full import check ran when the marker was written.
    """
    home = venv_dir(version, root)
    marker = home / READY_MARKER
    try:
        return vllm_python(version, root).exists() and marker.read_text().strip() == _requirements_digest(version)
    except (OSError, VllmEnvError):
        return False


def not_ready_message(version: str) -> str:
    """What to tell a user whose environment for ``version`` is missing."""
    return (f"the vLLM {version} environment is not built ({venv_dir(version)} is missing or incomplete); "
            f"build it with:  schedconf env vllm {version}   (or: python -m conformance.vllm_env {version})")


# ---------------------------------------------------------------------- build

def _log(message: str) -> None:
    print(f"[schedconf env vllm] {message}", file=sys.stderr, flush=True)


def _run(step: str, argv: Sequence[str], env: dict[str, str] | None = None, timeout: float | None = None) -> str:
    """Run one build command; raise VllmEnvError with its output tail if it fails."""
    started = time.monotonic()
    try:
        proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise VllmEnvError(f"{step}: timed out after {timeout:.0f} s: {' '.join(argv)}") from exc
    except OSError as exc:
        raise VllmEnvError(f"{step}: cannot run {argv[0]}: {exc}") from exc
    tail = "\n".join(proc.stdout.strip().splitlines()[-25:])
    if proc.returncode != 0:
        raise VllmEnvError(f"{step} failed (exit {proc.returncode}): {' '.join(argv)}\n--- output (last lines) ---\n{tail}")
    _log(f"{step}: done in {time.monotonic() - started:.1f} s")
    return proc.stdout


def _pip_source_args() -> list[str]:
    args: list[str] = []
    for folder in filter(None, os.environ.get("SCHEDCONF_VLLM_FIND_LINKS", "").split(os.pathsep)):
        args += ["--find-links", folder]
    index = os.environ.get("SCHEDCONF_TORCH_INDEX_URL")
    if index:
        args += ["--extra-index-url", index]
    return args


def check_vllm_env(version: str, root: Path | None = None) -> str:
    """Run the driver's self-check in the environment; return its report line.

    The self-check imports vLLM, verifies its version is ``version`` and builds
    one scheduler with a tiny config (which also fills the inspection cache).
    """
    python = vllm_python(version, root)
    if not python.exists():
        raise VllmEnvError(not_ready_message(version))
    env = {**os.environ, **driver_env(version, root)}
    out = _run("self-check (import vLLM, build one scheduler)",
               [str(python), "-m", DRIVER_MODULE, "--self-check", "--expect-version", version],
               env=env, timeout=SELF_CHECK_TIMEOUT_S)
    lines = [ln for ln in out.splitlines() if ln.startswith("self-check ok")]
    if not lines:
        raise VllmEnvError(f"self-check of vLLM {version} printed no 'self-check ok' line:\n{out[-2000:]}")
    return lines[-1]


def _lock(path: Path):  # noqa: ANN202 - a file object held open for the lock's lifetime
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "w")  # noqa: SIM115 - closed by the caller
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def build_vllm_env(version: str, root: Path | None = None, force: bool = False,
                   python: str | None = None) -> Path:
    """Build (or find) the environment of vLLM ``version``; return its interpreter.

    See the module docstring for the steps and rules. ``python`` is the base
    interpreter for the venv (default: the one running this code).
    """
    requirements = requirements_file(version)
    home = venv_dir(version, root)
    lock = _lock(home.parent / f"vllm-{version}.lock")
    try:
        if not force and is_vllm_env_ready(version, root):
            _log(f"vLLM {version}: ready at {home} (nothing to do)")
            return vllm_python(version, root)
        started = time.monotonic()
        if home.exists():
            _log(f"vLLM {version}: removing the incomplete or outdated environment {home}")
            shutil.rmtree(home)
        base = python or sys.executable
        _log(f"vLLM {version}: building {home} from {requirements.relative_to(REPO_ROOT)} with {base}")
        _run("create venv", [base, "-m", "venv", str(home)])
        py = str(vllm_python(version, root))
        pip_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        _run("upgrade pip", [py, "-m", "pip", "install", "-q", "-U", "pip"], env=pip_env)
        _log(f"vLLM {version}: installing {sum(1 for ln in requirements.read_text().splitlines() if ln and not ln.startswith('#'))}"
             " pinned packages with --no-deps (downloads ~1 GB on a cold pip cache)")
        _run("pip install --no-deps", [py, "-m", "pip", "install", "-q", "--no-deps", "-r", str(requirements),
                                       *_pip_source_args()], env=pip_env)
        report = check_vllm_env(version, root)
        (home / READY_MARKER).write_text(_requirements_digest(version) + "\n")
        _log(f"vLLM {version}: {report}")
        _log(f"vLLM {version}: ready at {home} after {time.monotonic() - started:.0f} s")
        return vllm_python(version, root)
    except BaseException:
        # Never leave a half-built environment behind: the marker is written
        # last, so a failed build has none and is removed whole.
        if home.exists() and not (home / READY_MARKER).exists():
            shutil.rmtree(home, ignore_errors=True)
        raise
    finally:
        lock.close()


def ensure_vllm_env(version: str, root: Path | None = None) -> Path:
    """The interpreter of ``version``'s environment, building it first if needed."""
    if is_vllm_env_ready(version, root):
        return vllm_python(version, root)
    return build_vllm_env(version, root)


# ----------------------------------------------------------------------- CLI

def add_env_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``schedconf env vllm`` to ``parser``."""
    parser.add_argument("version", help=f"vLLM release; pinned: {', '.join(supported_versions())}")
    parser.add_argument("--force", action="store_true", help="rebuild even if the environment is ready")
    parser.add_argument("--check", action="store_true", help="only report whether it is ready (exit 0/1)")
    parser.add_argument("--root", type=Path, default=None, help="project root holding .venvs/ (default: this repo)")


def run_env_vllm(args: argparse.Namespace) -> int:
    """Carry out parsed ``schedconf env vllm`` arguments; return the exit status."""
    try:
        if args.check:
            ready = is_vllm_env_ready(args.version, args.root)
            print(f"vLLM {args.version}: {'ready' if ready else 'not built'} ({venv_dir(args.version, args.root)})")
            return 0 if ready else 1
        python = build_vllm_env(args.version, args.root, force=args.force)
    except VllmEnvError as exc:
        print(f"schedconf env vllm: error: {exc}", file=sys.stderr)
        return 2
    print(python)
    return 0


def main_env(argv: Sequence[str] | None = None) -> int:
    """``schedconf env vllm VERSION [--force] [--check] [--root DIR]``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="schedconf env vllm",
                                     description="Build the virtual environment that runs a vLLM release's scheduler.")
    add_env_vllm_arguments(parser)
    return run_env_vllm(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main_env())
