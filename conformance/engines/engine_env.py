"""Build the per-release virtual environments of the real engines behind the protocol.

One builder serves every engine family; what differs between families is an
:class:`EngineFamily` (``FAMILIES``): the name used on the command line and in
file names, the driver module that runs inside the environment, and the
environment variables that driver needs. ``schedconf env FAMILY VERSION``
builds ``<repo>/.venvs/FAMILY-VERSION/`` (git-ignored) from the pinned list
``conformance/engines/envs/FAMILY-VERSION.txt``:

1. ``python -m venv`` with the interpreter running this code, then
   ``pip install -U pip``;
2. ``pip install --no-deps -r conformance/engines/envs/FAMILY-VERSION.txt`` (only the
   import chain of the engine's scheduler; extra sources from
   ``SCHEDCONF_VLLM_FIND_LINKS`` and ``SCHEDCONF_TORCH_INDEX_URL``);
3. a self-check: ``python -m DRIVER --self-check --expect-version VERSION``
   must print a line starting with ``self-check ok`` (DRIVER: the family's
   driver module, or the release's own where ``release_drivers`` names one:
   vLLM 0.10.2's legacy v0 scheduler has its own);
4. a marker file ``.schedconf-ready`` holding the sha256 of the pinned list.

Rules: idempotent (a ready environment whose marker matches the list is not
touched; ``--force`` rebuilds; a half-built one is deleted and built again),
concurrent builders serialise on ``.venvs/FAMILY-VERSION.lock``, every step
prints a progress line to stderr and a failing step raises
:class:`EngineEnvError` naming the step, the command and its output tail.

``conformance/engines/vllm_env.py`` keeps the vLLM names (``build_vllm_env`` ...) as
thin wrappers over this module.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import schedconf

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository root (the folder holding ``conformance/``)."""

IMPORT_ROOT = Path(schedconf.__file__).resolve().parent.parent
"""The folder that holds the ``schedconf`` package: the checkout's root, or the site-packages of an installed
schedconf. An engine's environment gets it on ``PYTHONPATH`` to run our driver (``-m schedconf...``)."""

ENVS_DIR = Path(__file__).resolve().parent / "envs"
"""Where the pinned ``FAMILY-VERSION.txt`` lists live."""

READY_MARKER = ".schedconf-ready"
SELF_CHECK_TIMEOUT_S = 600.0


class EngineEnvError(Exception):
    """An engine environment that cannot be built or used; the message says what to do."""


def _vllm_env_vars(home: Path) -> dict[str, str]:
    """What ``schedconf.conformance.engines.vllm_driver`` needs: see ``schedconf.conformance.engines.vllm_env.driver_env``."""
    return {
        "PYTHONPATH": str(IMPORT_ROOT),  # the code of this checkout, wherever the venvs live
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


def _nanovllm_env_vars(home: Path) -> dict[str, str]:
    """What ``schedconf.conformance.engines.nanovllm_driver`` needs (transformers is imported, never asked to download)."""
    return {
        "PYTHONPATH": str(IMPORT_ROOT),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",  # no "PyTorch was not found" banner on every start
        "HF_HOME": str(home / "hf-home"),
        "DO_NOT_TRACK": "1",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
    }


def _lmdeploy_env_vars(home: Path) -> dict[str, str]:
    """What ``schedconf.conformance.engines.lmdeploy_driver`` needs (offline, quiet, deterministic)."""
    return {
        "PYTHONPATH": str(IMPORT_ROOT),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HOME": str(home / "hf-home"),
        "DO_NOT_TRACK": "1",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
    }


def _sglang_env_vars(home: Path) -> dict[str, str]:
    """What ``schedconf.conformance.engines.sglang_driver`` needs (a config.json-only model folder, offline, quiet)."""
    return {
        "PYTHONPATH": str(IMPORT_ROOT),
        "SCHEDCONF_SGLANG_MODEL_DIR": str(home / "tiny-model-config"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HOME": str(home / "hf-home"),
        "SGLANG_LOGGING_LEVEL": "error",
        "DO_NOT_TRACK": "1",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
    }


def _aphrodite_env_vars(home: Path) -> dict[str, str]:
    """What ``schedconf.conformance.engines.aphrodite_driver`` needs (Aphrodite's CPU platform, V1 runner layout, offline)."""
    return {
        "PYTHONPATH": str(IMPORT_ROOT),
        "APHRODITE_CACHE_ROOT": str(home / "aphrodite-cache"),
        "SCHEDCONF_VLLM_MODEL_DIR": str(home / "tiny-model"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(home / "hf-home"),
        "APHRODITE_USE_V2_MODEL_RUNNER": "0",
        "APHRODITE_TARGET_DEVICE": "cpu",
        "APHRODITE_LOGGING_LEVEL": "ERROR",
        "APHRODITE_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
    }


@dataclass(frozen=True)
class EngineFamily:
    """What the builder needs to know about one engine family."""

    name: str
    """Command-line word and file prefix: ``vllm`` -> ``envs/vllm-0.33.0.txt``, ``.venvs/vllm-0.33.0``."""
    label: str
    """How messages name the engine: ``vLLM``."""
    driver_module: str
    """``python -m`` module run inside the environment; must implement ``--self-check --expect-version V``."""
    env_vars: Callable[[Path], dict[str, str]]
    """The driver's environment variables, given the venv folder."""
    release_drivers: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Release -> its driver module, for releases ``driver_module`` does not serve (:func:`get_driver_module`)."""
    self_check_step: str = "self-check (import the engine, build one scheduler)"
    install_note: str = ""
    """Appended to the install progress line (how much it downloads)."""
    envs_dir: Path = field(default=ENVS_DIR)
    """Where its pinned lists live (tests point this at a temporary folder)."""


FAMILIES: dict[str, EngineFamily] = {
    "vllm": EngineFamily(
        name="vllm",
        label="vLLM",
        driver_module="schedconf.conformance.engines.vllm_driver",
        env_vars=_vllm_env_vars,
        # 0.10.2 is the last release with the legacy v0 scheduler (vllm/core/scheduler.py), its own driver
        release_drivers={"0.10.2": "schedconf.conformance.engines.vllm_v0_driver"},
        self_check_step="self-check (import vLLM, build one scheduler)",
        install_note=" (downloads ~1 GB on a cold pip cache)",
    ),
    "nano-vllm": EngineFamily(
        name="nano-vllm",
        label="nano-vllm",
        driver_module="schedconf.conformance.engines.nanovllm_driver",
        env_vars=_nanovllm_env_vars,
        self_check_step="self-check (import nano-vllm's scheduler, run two steps)",
        install_note=" (~35 MB of wheels, no torch)",
    ),
    "aphrodite": EngineFamily(
        name="aphrodite",
        label="Aphrodite",
        driver_module="schedconf.conformance.engines.aphrodite_driver",
        env_vars=_aphrodite_env_vars,
        self_check_step="self-check (import Aphrodite's scheduler, run two steps)",
        install_note=" (the 336 MB aphrodite-engine wheel on a cold pip cache)",
    ),
    "lmdeploy": EngineFamily(
        name="lmdeploy",
        label="LMDeploy",
        driver_module="schedconf.conformance.engines.lmdeploy_driver",
        env_vars=_lmdeploy_env_vars,
        self_check_step="self-check (import LMDeploy's PyTorch-engine scheduler, run two steps)",
        install_note=" (the 107 MB lmdeploy wheel and the 190 MB CPU torch on a cold pip cache)",
    ),
    "sglang": EngineFamily(
        name="sglang",
        label="SGLang",
        driver_module="schedconf.conformance.engines.sglang_driver",
        env_vars=_sglang_env_vars,
        self_check_step="self-check (import SGLang's scheduling classes, run two steps)",
        install_note=" (the 39 MB sglang wheel, triton ~1 GB, CPU torch; 2.5 GB on disk)",
    ),
}
"""Engine family name -> its description; ``schedconf env NAME VERSION`` for each."""


def get_driver_module(family: EngineFamily | str, version: str) -> str:
    """The driver module that serves ``family`` ``version`` (its release driver, else the family's)."""
    fam = get_family(family)
    return fam.release_drivers.get(version, fam.driver_module)


def get_family(family: EngineFamily | str) -> EngineFamily:
    """The family object of ``family`` (a name from ``FAMILIES`` or the object itself)."""
    if isinstance(family, EngineFamily):
        return family
    try:
        return FAMILIES[family]
    except KeyError:
        raise EngineEnvError(f"unknown engine family {family!r}; known: {', '.join(sorted(FAMILIES))}") from None


# ------------------------------------------------------------------ locations


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) if x.isdigit() else 0 for x in version.split("."))


def supported_versions(family: EngineFamily | str) -> list[str]:
    """The releases of ``family`` that have a pinned list, oldest first."""
    fam = get_family(family)
    prefix = f"{fam.name}-"
    versions = [p.stem[len(prefix) :] for p in fam.envs_dir.glob(f"{fam.name}-*.txt") if p.stem.startswith(prefix)]
    return sorted(versions, key=_version_key)


def requirements_file(family: EngineFamily | str, version: str) -> Path:
    """The pinned ``--no-deps`` list of ``version``; raises EngineEnvError if there is none."""
    fam = get_family(family)
    path = fam.envs_dir / f"{fam.name}-{version}.txt"
    if not path.is_file():
        known = ", ".join(supported_versions(fam)) or "none"
        raise EngineEnvError(
            f"no pinned environment for {fam.label} {version!r} (conformance/engines/envs/{path.name}); "
            f"known releases: {known}"
        )
    return path


def venv_dir(family: EngineFamily | str, version: str, root: Path | None = None) -> Path:
    """``<root>/.venvs/FAMILY-VERSION`` (root defaults to the repository root)."""
    return (root or REPO_ROOT) / ".venvs" / f"{get_family(family).name}-{version}"


def env_python(family: EngineFamily | str, version: str, root: Path | None = None) -> Path:
    """The interpreter of ``version``'s environment (it may not exist yet)."""
    return venv_dir(family, version, root) / "bin" / "python"


def driver_env(family: EngineFamily | str, version: str, root: Path | None = None) -> dict[str, str]:
    """Environment variables the family's driver process needs (added to the caller's)."""
    return dict(get_family(family).env_vars(venv_dir(family, version, root)))


def _requirements_digest(family: EngineFamily | str, version: str) -> str:
    return hashlib.sha256(requirements_file(family, version).read_bytes()).hexdigest()


def is_env_ready(family: EngineFamily | str, version: str, root: Path | None = None) -> bool:
    """True if the environment was built from the current pinned list and passed its self-check (reads one file)."""
    marker = venv_dir(family, version, root) / READY_MARKER
    try:
        return env_python(family, version, root).exists() and marker.read_text().strip() == _requirements_digest(
            family, version
        )
    except (OSError, EngineEnvError):
        return False


def not_ready_message(family: EngineFamily | str, version: str) -> str:
    """What to tell a user whose environment for ``version`` is missing."""
    fam = get_family(family)
    return (
        f"the {fam.label} {version} environment is not built ({venv_dir(fam, version)} is missing or incomplete); "
        f"build it with:  schedconf env {fam.name} {version}"
    )


# ---------------------------------------------------------------------- build


def _log(family: EngineFamily, message: str) -> None:
    print(f"[schedconf env {family.name}] {message}", file=sys.stderr, flush=True)


def _run(
    step: str,
    argv: Sequence[str],
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    family: EngineFamily | None = None,
) -> str:
    """Run one build command; raise EngineEnvError with its output tail if it fails."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EngineEnvError(f"{step}: timed out after {timeout:.0f} s: {' '.join(argv)}") from exc
    except OSError as exc:
        raise EngineEnvError(f"{step}: cannot run {argv[0]}: {exc}") from exc
    tail = "\n".join(proc.stdout.strip().splitlines()[-25:])
    if proc.returncode != 0:
        raise EngineEnvError(
            f"{step} failed (exit {proc.returncode}): {' '.join(argv)}\n--- output (last lines) ---\n{tail}"
        )
    _log(family or FAMILIES["vllm"], f"{step}: done in {time.monotonic() - started:.1f} s")
    return proc.stdout


def _pip_source_args() -> list[str]:
    args: list[str] = []
    for folder in filter(None, os.environ.get("SCHEDCONF_VLLM_FIND_LINKS", "").split(os.pathsep)):
        args += ["--find-links", folder]
    index = os.environ.get("SCHEDCONF_TORCH_INDEX_URL")
    if index:
        args += ["--extra-index-url", index]
    return args


def check_env(family: EngineFamily | str, version: str, root: Path | None = None) -> str:
    """Run the driver's self-check in the environment; return its ``self-check ok`` line."""
    fam = get_family(family)
    python = env_python(fam, version, root)
    if not python.exists():
        raise EngineEnvError(not_ready_message(fam, version))
    env = {**os.environ, **driver_env(fam, version, root)}
    out = _run(
        fam.self_check_step,
        [str(python), "-m", get_driver_module(fam, version), "--self-check", "--expect-version", version],
        env=env,
        timeout=SELF_CHECK_TIMEOUT_S,
        family=fam,
    )
    lines = [ln for ln in out.splitlines() if ln.startswith("self-check ok")]
    if not lines:
        raise EngineEnvError(f"self-check of {fam.label} {version} printed no 'self-check ok' line:\n{out[-2000:]}")
    return lines[-1]


def _lock(path: Path):  # noqa: ANN202 - a file object held open for the lock's lifetime
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "w")  # noqa: SIM115 - closed by the caller
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def build_env(
    family: EngineFamily | str, version: str, root: Path | None = None, force: bool = False, python: str | None = None
) -> Path:
    """Build (or find) the environment of ``family`` ``version``; return its interpreter.

    See the module docstring for the steps and rules. ``python`` is the base
    interpreter for the venv (default: the one running this code).
    """
    fam = get_family(family)
    requirements = requirements_file(fam, version)
    home = venv_dir(fam, version, root)
    lock = _lock(home.parent / f"{fam.name}-{version}.lock")
    try:
        if not force and is_env_ready(fam, version, root):
            _log(fam, f"{fam.label} {version}: ready at {home} (nothing to do)")
            return env_python(fam, version, root)
        started = time.monotonic()
        if home.exists():
            _log(fam, f"{fam.label} {version}: removing the incomplete or outdated environment {home}")
            shutil.rmtree(home)
        base = python or sys.executable
        try:
            shown = requirements.relative_to(REPO_ROOT)
        except ValueError:
            shown = requirements
        _log(fam, f"{fam.label} {version}: building {home} from {shown} with {base}")
        _run("create venv", [base, "-m", "venv", str(home)], family=fam)
        py = str(env_python(fam, version, root))
        pip_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        _run("upgrade pip", [py, "-m", "pip", "install", "-q", "-U", "pip"], env=pip_env, family=fam)
        count = sum(1 for ln in requirements.read_text().splitlines() if ln.strip() and not ln.startswith("#"))
        _log(fam, f"{fam.label} {version}: installing {count} pinned packages with --no-deps{fam.install_note}")
        _run(
            "pip install --no-deps",
            [py, "-m", "pip", "install", "-q", "--no-deps", "-r", str(requirements), *_pip_source_args()],
            env=pip_env,
            family=fam,
        )
        report = check_env(fam, version, root)
        (home / READY_MARKER).write_text(_requirements_digest(fam, version) + "\n")
        _log(fam, f"{fam.label} {version}: {report}")
        _log(fam, f"{fam.label} {version}: ready at {home} after {time.monotonic() - started:.0f} s")
        return env_python(fam, version, root)
    except BaseException:
        # Never leave a half-built environment behind: the marker is written
        # last, so a failed build has none and is removed whole.
        if home.exists() and not (home / READY_MARKER).exists():
            shutil.rmtree(home, ignore_errors=True)
        raise
    finally:
        lock.close()


def ensure_env(family: EngineFamily | str, version: str, root: Path | None = None) -> Path:
    """The interpreter of ``version``'s environment, building it first if needed."""
    if is_env_ready(family, version, root):
        return env_python(family, version, root)
    return build_env(family, version, root)


# ----------------------------------------------------------------------- CLI


def add_env_arguments(parser: argparse.ArgumentParser, family: EngineFamily | str) -> None:
    """Add the arguments of ``schedconf env FAMILY`` to ``parser`` (and remember the family)."""
    fam = get_family(family)
    parser.add_argument("version", help=f"{fam.label} release; pinned: {', '.join(supported_versions(fam))}")
    parser.add_argument("--force", action="store_true", help="rebuild even if the environment is ready")
    parser.add_argument("--check", action="store_true", help="only report whether it is ready (exit 0/1)")
    parser.add_argument("--root", type=Path, default=None, help="project root holding .venvs/ (default: this repo)")
    parser.set_defaults(engine_family=fam.name)


def run_env(args: argparse.Namespace, family: EngineFamily | str | None = None) -> int:
    """Carry out parsed ``schedconf env FAMILY`` arguments; return the exit status (0 ok, 1 not ready, 2 failed)."""
    fam = get_family(family or getattr(args, "engine_family", "vllm"))
    try:
        if args.check:
            ready = is_env_ready(fam, args.version, args.root)
            print(
                f"{fam.label} {args.version}: {'ready' if ready else 'not built'} "
                f"({venv_dir(fam, args.version, args.root)})"
            )
            return 0 if ready else 1
        python = build_env(fam, args.version, args.root, force=args.force)
    except EngineEnvError as exc:
        print(f"schedconf env {fam.name}: error: {exc}", file=sys.stderr)
        return 2
    print(python)
    return 0


def main_env(argv: Sequence[str] | None = None) -> int:
    """``python -m schedconf.conformance.engines.engine_env FAMILY VERSION [--force] [--check] [--root DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.conformance.engines.engine_env",
        description="Build the virtual environment that runs an engine release's scheduler.",
    )
    sub = parser.add_subparsers(dest="family", required=True, metavar="FAMILY")
    for name in FAMILIES:
        add_env_arguments(sub.add_parser(name, help=f"build .venvs/{name}-VERSION"), name)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_env(args)


if __name__ == "__main__":
    sys.exit(main_env())
