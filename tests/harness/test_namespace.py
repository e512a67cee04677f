"""schedconf installs one import name, ``schedconf``: a user's own ``spec`` or ``conformance`` package
(common names) neither breaks it nor is broken by it.

The project is installed (a normal, non-editable install) into a fresh virtual environment; the
environment reaches this one's dependencies through a path entry, but not this checkout. Beside
it, dummy top-level ``spec`` and ``conformance`` packages are on ``PYTHONPATH``. Then
``schedconf demo`` runs, and a pytest session that loads the plugin runs a user's test that
imports the user's own ``spec`` and ``conformance``.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest
from standalone_files import copy_checkout

ROOT = Path(__file__).resolve().parents[2]

USER_TEST = """
import conformance
import spec


def test_the_users_packages_are_the_users():
    assert spec.OWNER == "user" and conformance.OWNER == "user"
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh environment with schedconf installed from this checkout, and the dummy packages' environment."""
    base = tmp_path_factory.mktemp("ns")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # This environment's packages (hypothesis, z3, jinja2, pytest, pip) as a plain path entry: its
    # .pth files, among them the editable install of this checkout, are not processed from there.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = copy_checkout(base / "source")  # a copy: building writes into the source folder
    done = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=base,
        env={**os.environ, "TMPDIR": str(base)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    dummies = base / "user"
    for name in ("spec", "conformance"):
        (dummies / name).mkdir(parents=True)
        (dummies / name / "__init__.py").write_text('OWNER = "user"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(dummies)
    return python, env


def test_schedconf_is_the_only_name_installed(installed):
    python, env = installed
    probe = (
        "import importlib.util as u, schedconf.spec.v1.scheduler as s, conformance, spec; "
        "from schedconf.conformance.engines.engine_env import IMPORT_ROOT; "
        "print(s.__file__); print(spec.OWNER, conformance.OWNER); "
        "print((IMPORT_ROOT / 'schedconf' / 'conformance' / 'engines').is_dir())"
    )
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr
    location, owners, drivers_importable = done.stdout.split("\n")[:3]
    assert not location.startswith(str(ROOT)), "the installed copy, not this checkout"
    assert owners == "user user"
    # what an engine's environment gets on PYTHONPATH holds the schedconf package (its drivers run as -m schedconf...)
    assert drivers_importable == "True"


def test_demo_runs_beside_the_users_packages(installed, tmp_path):
    python, env = installed
    done = subprocess.run(
        [str(python), "-m", "schedconf", "demo", "-q", "--examples", "5", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: 5 passed" in done.stdout


def test_a_pytest_session_with_the_plugin_keeps_the_users_packages(installed, tmp_path):
    python, env = installed
    (tmp_path / "test_user.py").write_text(USER_TEST)
    done = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-v",
            "-p",
            "no:cacheprovider",
            "--schedconf-sut=reference",
            "--schedconf-examples=3",
            f"--schedconf-out={tmp_path / 'out'}",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_the_users_packages_are_the_users PASSED" in done.stdout
    assert "schedconf-campaign" in done.stdout and "PASSED" in done.stdout  # the plugin's items ran
