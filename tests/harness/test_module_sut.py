"""``--sut module:my_adapter:MySut`` from the adapter's own folder (the README's example).

``schedconf`` and ``pytest``, started as console scripts, do not put the
current folder on ``sys.path`` (``python -m`` would, and would hide the bug).
The subprocesses below start both the way their console scripts do: the
interpreter's path without the current folder, then ``schedconf.conformance.cli:main`` or
pytest's main. ``PYTHONPATH`` names only this checkout, so the adapter can be
found only because ``make_sut`` searches the current folder. The pytest run
loads the plugin with ``-p`` (entry points off), so it does not depend on how
schedconf was installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

ADAPTER = '''\
from schedconf.conformance.adapters.reference import ReferenceSut


class MySut(ReferenceSut):
    """The reference model, standing in for a user's scheduler."""

    name = "mine"
'''

WITHOUT_CWD = "import os, sys; sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]; "
SCHEDCONF_SCRIPT = WITHOUT_CWD + "from schedconf.conformance.cli import main; sys.exit(main())"
PYTEST_SCRIPT = WITHOUT_CWD + "import pytest; sys.exit(pytest.main())"


def make_adapter_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "my_adapter.py").write_text(ADAPTER)
    (folder / "pytest.ini").write_text("[pytest]\n")  # keeps pytest from reading a config above tmp_path
    return folder


def run_console_script(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, "-c", script, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_cli_finds_a_module_sut_in_the_current_folder(tmp_path):
    folder = make_adapter_folder(tmp_path)
    out = tmp_path / "reports"
    proc = run_console_script(
        SCHEDCONF_SCRIPT, ["run", "--sut", "module:my_adapter:MySut", "--examples", "3", "--out", str(out)], folder
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "sut=module:my_adapter:MySut" in output and "3 passed" in output, output


def test_pytest_plugin_finds_a_module_sut_in_the_current_folder(tmp_path):
    folder = make_adapter_folder(tmp_path)
    proc = run_console_script(
        PYTEST_SCRIPT,
        [
            "-p",
            "no:cacheprovider",
            "-p",
            "schedconf.conformance.pytest_plugin",
            "--schedconf-sut=module:my_adapter:MySut",
            "--schedconf-examples=2",
            "--schedconf-no-corpus",
        ],
        folder,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the campaign items the plugin added ran (the folder has no test files of its own)
    passed = re.search(r"\b(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 1, proc.stdout
    assert " failed" not in proc.stdout and " error" not in proc.stdout, proc.stdout


def test_unknown_module_sut_names_the_folder_it_searched(tmp_path, monkeypatch):
    from schedconf.conformance.adapters import UnknownSut, make_sut

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # make_sut may put tmp_path first; undone after the test
    with pytest.raises(UnknownSut) as info:
        make_sut("module:no_such_adapter_xq7:MySut")
    message = str(info.value)
    assert "cannot import no_such_adapter_xq7:MySut" in message
    assert os.getcwd() in message
