"""Fault injection: a stdio scheduler that misbehaves in every way we know of.

``faulty_sut.py`` is the reference model behind the protocol, made to hang,
answer late, write stray lines, crash, exit, answer garbage, answer with the
wrong id or for the wrong request, answer 40 MB, send floats where integers
are due, or invent an error code. For each mode we check the verdict (a
failure of the right kind, with a message that says what happened), that the
SUT is usable again on the next trace (no stale answer is read as the reply
to a later request), and that no process it started survives.

Campaign bounds, stated here and checked below: with ``--timeout T`` a hung
scheduler costs at most T seconds per trace (plus a process start), and
shrinking stops within ``--shrink-budget`` plus one call's timeout. A
2-trace campaign with ``--timeout 2 --shrink-budget 5`` against a scheduler
that hangs therefore ends within 2 x 2 + 5 + 2 seconds of SUT time; we allow
30 s in all for process starts and the report on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedconf.conformance.adapters.stdio import StdioSut
from schedconf.conformance.checking.replay import FAIL, PASS, replay
from schedconf.conformance.traces.examples import EXAMPLES
from schedconf.conformance.workloads.workload import run_workload
from tests.harness.faulty_sut import get_start_time

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FAULTY = HERE / "faulty_sut.py"


def is_alive(pid: int, start_time: str = "") -> bool:
    """True while ``pid`` runs (a zombie counts as dead; so does another process given the same pid)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    if start_time and get_start_time(pid) != start_time:
        return False
    return "\nState:\tZ" not in status


def survivors(pid_dir: Path, within_s: float = 0.0) -> list[int]:
    """Recorded processes still alive ``within_s`` seconds from now.

    A SIGKILL is delivered at once but the process only dies when the kernel
    next runs it; on a loaded 2-core machine that can be a while, so the
    checks below give the kill 5 s (a survivor sleeps for 300 s).
    """
    deadline = time.monotonic() + within_s
    while True:
        alive = [int(p.name) for p in pid_dir.iterdir() if is_alive(int(p.name), p.read_text())]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


@pytest.fixture(scope="module")
def trace():
    t = run_workload(EXAMPLES["mixed"]())
    assert len(t.events) > 12  # the faults below strike at message 5
    return t


def faulty(mode: str, at: int = 5, delay: float = 3.0, batch: bool = True) -> str:
    return f"{sys.executable} {FAULTY} --mode {mode} --at {at} --delay {delay}" + ("" if batch else " --no-batch")


# mode -> (divergence kind, words the message must hold)
CASES = {
    "hang": ("sut_timeout", "no answer to"),
    "grandchild": ("sut_timeout", "no answer to"),
    "slow": ("sut_timeout", "no answer to"),
    "crash": ("sut_exited", "SIGABRT"),
    "exit": ("sut_exited", "exit code 3"),
    "garbage": ("protocol_error", "not JSON"),
    "stray": ("protocol_error", "not JSON"),
    "wrong_id": ("protocol_error", "wrong id"),
    "wrong_request": ("protocol_error", "wrong id"),
    "huge": ("protocol_error", "longer than"),
    "float": ("protocol_error", "expected integer, found float"),
    "bad_code": ("protocol_error", "unknown error code 'not_a_code'"),
}


BATCH_WORDS = {"wrong_request": "expected the reply with index 3, found 2"}
"""Where a batch's message differs: a reply that answers another call of the batch names its index (the
calls of a batch share the batch's id)."""


@pytest.mark.parametrize("mode", sorted(CASES))
def test_each_fault_is_a_failure_of_its_kind_and_leaves_no_process(mode, trace, pid_dir):
    """Each fault, one request at a time and in a batch (the whole trace in one request): the same
    verdict at the same event either way."""
    kind, words = CASES[mode]
    where = {}
    for batch in (False, True):
        sut = StdioSut(faulty(mode, batch=batch), timeout_s=2.0)
        t0 = time.monotonic()
        try:
            result = replay(trace, sut, "strict", step_timeout=2.0)
            assert sut.supports_batch is batch
        finally:
            sut.close()
        elapsed = time.monotonic() - t0
        assert result.verdict == FAIL, result
        assert result.divergence.kind == kind, result.divergence
        expected_words = BATCH_WORDS.get(mode, words) if batch else words
        assert expected_words in result.divergence.message, result.divergence.message
        assert elapsed < 15, f"{mode}: {elapsed:.1f} s"
        assert survivors(pid_dir, within_s=5.0) == []
        where[batch] = (result.divergence.event_index, result.divergence.step, result.events_run)
    # the fault strikes at message 5 (init, then the trace's fourth call), whichever way it travels
    index = get_struck_event(trace, 4, STRUCK_METHOD.get(mode))
    assert where[True] == where[False] == (index, where[False][1], index), where


STRUCK_METHOD = {"float": "step", "bad_code": "add_request"}
"""The modes that strike only a call of one kind (the first such call from the ``--at``-th on)."""


def get_struck_event(trace, call: int, kind: str | None) -> int:
    """The index of the event whose call is the ``call``-th of the replay (1 = the first event's), or of the
    first call of ``kind`` from there. A strict replay makes one call per event, and a second one
    (observe) after a step that records the free queue."""
    made = 0
    for index, event in enumerate(trace.events):
        calls = [event["kind"]] + (["observe"] if event["kind"] == "step" and "observe" in event else [])
        for call_kind in calls:
            made += 1
            if made >= call and (kind is None or call_kind == kind):
                return index
    raise AssertionError("the trace is too short")


def test_an_exit_is_reported_with_its_code_and_stderr(trace, pid_dir):
    sut = StdioSut(faulty("exit"), timeout_s=2.0)
    try:
        result = replay(trace, sut, "strict", step_timeout=2.0)
    finally:
        sut.close()
    assert "code None" not in result.divergence.message
    assert "giving up" in result.sut_stderr


@pytest.mark.parametrize("mode", ["hang_once", "stray", "garbage", "wrong_request"])
def test_after_a_fault_the_next_trace_gets_a_fresh_process(mode, trace, pid_dir, tmp_path):
    """A late or stray answer must never be read as the reply to a later request."""
    sut = StdioSut(faulty(mode, at=5, delay=3.0) + f" --once-file {tmp_path / 'once'}", timeout_s=2.0)
    try:
        first = replay(trace, sut, "strict", step_timeout=2.0)
        time.sleep(1.5 if mode == "hang_once" else 0)  # the late answer is written now
        second = replay(trace, sut, "strict", step_timeout=2.0)
        third = replay(trace, sut, "strict", step_timeout=2.0)
    finally:
        sut.close()
    assert first.verdict == FAIL
    assert second.verdict == PASS, second.divergence
    assert third.verdict == PASS, third.divergence
    assert survivors(pid_dir, within_s=5.0) == []


def test_slow_within_the_timeout_passes(trace, pid_dir):
    sut = StdioSut(faulty("slow", at=1, delay=0.01), timeout_s=2.0)
    try:
        assert replay(trace, sut, "strict", step_timeout=2.0).verdict == PASS
    finally:
        sut.close()
    assert survivors(pid_dir, within_s=5.0) == []


def run_cli(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "schedconf.conformance", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        **kw,
    )


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_hanging_scheduler_cannot_hang_a_campaign(jobs, tmp_path, pid_dir):
    t0 = time.monotonic()
    proc = run_cli(
        [
            "run",
            "--sut",
            "stdio:" + faulty("hang"),
            "--examples",
            "2",
            "--timeout",
            "2",
            "--jobs",
            str(jobs),
            "--shrink-budget",
            "5",
            "--out",
            str(tmp_path / "r"),
            "--run-id",
            "hang",
        ],
        cwd=tmp_path,
        timeout=120,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert elapsed < 30, f"{elapsed:.1f} s"
    assert "shrinking failure" in proc.stderr  # the progress goes on while shrinking
    summary = json.loads((tmp_path / "r" / "hang" / "summary.json").read_text())
    assert summary["status"] == "fail" and summary["failed"] == 2
    assert {f["signature"] for f in summary["failures"]} == {"sut_timeout"}
    assert "Traceback" not in proc.stderr
    assert survivors(pid_dir, within_s=5.0) == []


def test_an_exiting_scheduler_is_restarted_per_trace_quickly(tmp_path, pid_dir):
    t0 = time.monotonic()
    proc = run_cli(
        [
            "run",
            "--sut",
            "stdio:" + faulty("exit", at=3),
            "--examples",
            "3",
            "--timeout",
            "2",
            "--shrink-budget",
            "3",
            "--out",
            str(tmp_path / "r"),
            "--run-id",
            "exit",
        ],
        cwd=tmp_path,
        timeout=120,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert elapsed < 30, f"{elapsed:.1f} s"
    summary = json.loads((tmp_path / "r" / "exit" / "summary.json").read_text())
    assert summary["failed"] == 3 and {f["signature"] for f in summary["failures"]} == {"sut_exited"}
    assert survivors(pid_dir, within_s=5.0) == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_sigterm_leaves_an_interrupted_summary_and_no_process(jobs, tmp_path, pid_dir):
    run_dir = tmp_path / "r" / "term"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            "stdio:" + faulty("slow", at=1, delay=0.02),
            "--examples",
            "200",
            "--jobs",
            str(jobs),
            "--out",
            str(tmp_path / "r"),
            "--run-id",
            "term",
            "--quiet",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the campaign is replaying
        if (run_dir / "summary.json").exists() and len(list(pid_dir.iterdir())) >= 1:
            break
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGTERM"
    assert (run_dir / "report.html").exists()
    assert "Traceback" not in err
    assert survivors(pid_dir, within_s=5.0) == []
