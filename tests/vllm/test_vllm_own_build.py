"""A user's own vLLM build as a system under test: ``--sut vllm-v1@PATH``.

The "user's build" is a virtual environment schedconf did not create: a copy
of the pinned 0.33.0 environment in a temporary folder (hard links, so it
costs no disk), and a copy whose version says ``0.99.0.dev1`` (a nightly with
no profile of ours). What the build is comes from the build itself, by
feature (``python -m schedconf.conformance.engines.vllm_driver --describe``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schedconf.conformance.adapters import UnknownSut
from schedconf.conformance.engines.vllm_driver import REQUIRED_SCHEDULER_API, get_missing_scheduler_api
from schedconf.conformance.engines.vllm_env import REPO_ROOT, ensure_vllm_env, venv_dir

pytestmark = pytest.mark.vllm


def copy_env(target: Path, version: str | None = None) -> Path:
    """A copy of the pinned 0.33.0 environment at ``target`` (hard links); ``version`` rewrites its vLLM version."""
    ensure_vllm_env("0.33.0")
    shutil.copytree(venv_dir("0.33.0"), target, symlinks=True, copy_function=os.link)
    if version is not None:
        (path,) = target.glob("lib/python*/site-packages/vllm/_version.py")
        path.unlink()  # a hard link: replace it, never write through it
        path.write_text(f"__version__ = version = {version!r}\n__version_tuple__ = version_tuple = (0, 99, 0)\n")
    return target


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "schedconf.conformance", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=600,
    )


def test_a_campaign_against_a_build_by_path(tmp_path):
    env = copy_env(tmp_path / "my-vllm")
    proc = run_cli(
        ["run", "--sut", f"vllm-v1@{env}", "--examples", "12", "--out", str(tmp_path / "r"), "--run-id", "r", "-q"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "r" / "r" / "summary.json").read_text())
    assert summary["spec"]["profile"] == "vllm-0.33"  # from the build's own version
    assert summary["passed"] >= 10 and summary["failed"] == 0
    assert summary["spec"]["sut"] == f"vllm-v1@{env}"


def test_a_build_without_a_profile_needs_one_and_then_runs(tmp_path):
    env = copy_env(tmp_path / "nightly", version="0.99.0.dev1")
    proc = run_cli(["run", "--sut", f"vllm-v1@{env}", "--examples", "4", "--out", str(tmp_path / "r")], tmp_path)
    assert proc.returncode == 2
    assert "vLLM 0.99.0.dev1 has no release profile of its own; pass --profile" in proc.stderr
    proc = run_cli(
        [
            "run",
            "--sut",
            f"vllm-v1@{env}/bin/python",
            "--profile",
            "vllm-0.33",
            "--examples",
            "8",
            "--out",
            str(tmp_path / "r"),
            "-q",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # it is 0.33.0 underneath, so it follows vllm-0.33


def test_a_path_that_is_no_build_is_a_set_up_error(tmp_path):
    proc = run_cli(["run", "--sut", f"vllm-v1@{tmp_path}/nothing-here", "--examples", "1"], tmp_path)
    assert proc.returncode == 2 and "expected a virtual environment or a Python interpreter" in proc.stderr
    plain = tmp_path / "plain-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(plain)], check=True)
    proc = run_cli(["run", "--sut", f"vllm-v1@{plain}", "--examples", "1"], tmp_path)
    assert proc.returncode == 2 and "cannot import vLLM's scheduler" in proc.stderr


def test_an_api_that_moved_is_refused_naming_what_is_missing():
    """By feature: a scheduler class without one of the calls the driver makes is named, not guessed at."""

    class Moved:
        def __init__(self) -> None:
            self.kv_cache_manager = None

        def add_request(self): ...
        def schedule(self): ...
        def update_from_output(self): ...
        def reset_prefix_cache(self): ...

    assert get_missing_scheduler_api(Moved) == ["Scheduler.finish_requests"]
    assert "finish_requests" in REQUIRED_SCHEDULER_API


def test_make_sut_refuses_a_build_whose_api_moved(tmp_path, monkeypatch):
    from schedconf.conformance.adapters import vllm_v1

    env = copy_env(tmp_path / "moved")
    monkeypatch.setattr(vllm_v1, "_BUILDS", {})
    real_run = subprocess.run

    def describe_as_moved(argv, **kw):  # noqa: ANN001, ANN202 - the build's answer, with a method gone
        proc = real_run(argv, **kw)
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        answer["missing"] = ["Scheduler.finish_requests"]
        return subprocess.CompletedProcess(argv, 0, json.dumps(answer) + "\n", proc.stderr)

    monkeypatch.setattr(vllm_v1.subprocess, "run", describe_as_moved)
    with pytest.raises(
        UnknownSut, match="scheduler API moved beyond what the driver knows: no Scheduler.finish_requests"
    ):
        vllm_v1.make_vllm_sut(f"vllm-v1@{env}")
