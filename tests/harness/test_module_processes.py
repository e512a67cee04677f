"""A ``module:`` scheduler's process is held as a stdio scheduler's is, and the stateful machine drives it.

The process-level faults of the stdio suite (``test_fault_injection.py``:
a crash by signal, a grandchild left running while the scheduler hangs, a
daemon detached with ``setsid``, the harness itself SIGKILLed) done by a
Python scheduler in the ``module:`` host: each is reported as for stdio, and
no process it started survives. ``make_diff_machine("module:...")`` runs
through the child process and agrees with the reference; a scheduler that
answers floats fails there with the protocol's message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.adapters.stdio import SutProtocolError
from schedconf.conformance.checking.replay import FAIL, PASS, replay
from schedconf.conformance.runs.diff_machine import make_diff_machine
from schedconf.conformance.traces.examples import EXAMPLES
from schedconf.conformance.workloads.workload import run_workload
from tests.harness.faulty_sut import record_pid, start_daemon
from tests.harness.test_fault_injection import REPO, survivors

MODULE = "tests.harness.test_module_processes"


class Aborts(ReferenceSut):
    """Dies of SIGABRT in its first ``schedule()``."""

    def start(self, config, profile):  # noqa: ANN001, ANN201
        record_pid(os.getpid())
        super().start(config, profile)

    def schedule(self):  # noqa: ANN201
        os.abort()


class GrandchildThenHangs(ReferenceSut):
    """Starts a ``sleep 300`` at ``start``, then hangs in its first ``schedule()``."""

    def start(self, config, profile):  # noqa: ANN001, ANN201
        record_pid(os.getpid())
        record_pid(subprocess.Popen(["sleep", "300"]).pid)
        super().start(config, profile)

    def schedule(self):  # noqa: ANN201
        while True:
            time.sleep(60)


class DetachesDaemon(ReferenceSut):
    """Detaches a ``sleep 300`` daemon (double fork, ``setsid``) at its first ``start``, then behaves."""

    def start(self, config, profile):  # noqa: ANN001, ANN201
        if not getattr(self, "daemon_started", False):
            record_pid(os.getpid())
            start_daemon()
            self.daemon_started = True
        super().start(config, profile)


@pytest.fixture(scope="module")
def trace():
    return run_workload(EXAMPLES["mixed"]())


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize(
    "name,kind,words",
    [
        ("Aborts", "sut_exited", "the process was killed by SIGABRT before answering schedule"),
        ("GrandchildThenHangs", "sut_timeout", "no answer to schedule within 2 s (process killed)"),
    ],
)
def test_a_module_that_crashes_or_hangs_with_a_grandchild_leaves_no_process(name, kind, words, trace, pid_dir):
    sut = make_sut(f"module:{MODULE}:{name}")
    try:
        result = replay(trace, sut, "strict", step_timeout=2.0)
    finally:
        sut.close()
    assert result.verdict == FAIL, result
    assert result.divergence.kind == kind, result.divergence
    assert words in result.divergence.message, result.divergence.message
    assert len(list(pid_dir.iterdir())) == (1 if name == "Aborts" else 2)
    assert survivors(pid_dir, within_s=5.0) == []


def test_a_daemon_a_module_detaches_does_not_outlive_it(trace, pid_dir):
    sut = make_sut(f"module:{MODULE}:DetachesDaemon")
    try:
        assert replay(trace, sut, "strict", step_timeout=5.0).verdict == PASS
        assert len(survivors(pid_dir)) == 2  # the host and its daemon, in a session of its own
    finally:
        sut.close()
    assert survivors(pid_dir, within_s=5.0) == []


def test_a_module_hung_in_native_code_does_not_survive_a_killed_harness(tmp_path, pid_dir):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            "module:tests.harness.faulty_module:NativeHang",
            "--examples",
            "2",
            "--timeout",
            "120",
            "--out",
            str(tmp_path),
            "-q",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    # three hosts: the CLI's check and the campaign's probe (both closed), then the trace's, which hangs
    while time.monotonic() < deadline and (len(list(pid_dir.iterdir())) < 3 or not survivors(pid_dir)):
        time.sleep(0.1)
    assert survivors(pid_dir), "the scheduler never started"
    time.sleep(1.5)  # in the native loop by now
    proc.kill()  # SIGKILL: the harness runs no handler, no atexit
    proc.wait(timeout=10)
    assert survivors(pid_dir, within_s=5.0) == []


MACHINE_SETTINGS = settings(
    max_examples=3,
    stateful_step_count=8,
    phases=[Phase.generate],
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def test_the_stateful_machine_drives_a_module_scheduler_in_its_child_process():
    run_state_machine_as_test(
        make_diff_machine("module:schedconf.conformance.adapters.reference:ReferenceSut"), settings=MACHINE_SETTINGS
    )


def test_the_stateful_machine_fails_a_module_scheduler_that_answers_floats():
    with pytest.raises(SutProtocolError, match="expected integer, found float"):
        run_state_machine_as_test(
            make_diff_machine("module:tests.harness.faulty_module:Floats"),
            settings=settings(MACHINE_SETTINGS, max_examples=30, stateful_step_count=12),
        )
