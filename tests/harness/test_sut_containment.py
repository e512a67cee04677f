"""Python schedulers contained like subprocesses, ``unsupported`` only at init, and nothing left behind.

``module:`` schedulers run in a child process behind the protocol
(``conformance/adapters/module.py``): each fault of ``faulty_module.py`` is a
failure of its kind, for the very faults that used to end the harness (an
exit took the harness with it and exited 0 with no report; a hang in native
code ignored both ``--timeout`` and SIGTERM). ``inprocess:`` schedulers get
the same checks of their answers. A scheduler answering ``unsupported``
after ``init`` fails (it could give up wherever it would fail), except our
own engine adapters. The supervisor leaves no process behind: neither a
daemon the scheduler detaches, nor a hung scheduler whose harness was killed.
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

from schedconf.conformance.adapters import UnknownSut, make_sut
from schedconf.conformance.adapters.stdio import StdioSut
from schedconf.conformance.checking.replay import FAIL, PASS, UNKNOWN, replay
from schedconf.conformance.traces.examples import EXAMPLES
from schedconf.conformance.workloads.workload import run_workload
from tests.harness.test_fault_injection import REPO, faulty, survivors

MODULE = "tests.harness.faulty_module"


@pytest.fixture(scope="module")
def trace():
    return run_workload(EXAMPLES["mixed"]())


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # the module is found from the current folder, as a user's adapter is


# class -> (divergence kind, words the message must hold)
MODULE_CASES = {
    "Hang": ("sut_timeout", "no answer to schedule"),
    "NativeHang": ("sut_timeout", "no answer to schedule"),
    "ExitZero": ("sut_exited", "exited with exit code 0 before answering schedule"),
    "ExitThree": ("sut_exited", "exited with exit code 3 before answering schedule"),
    "OsExit": ("sut_exited", "exited with exit code 3 before answering schedule"),
    "Bomb": ("sut_exited", "exited with exit code 1 before answering schedule"),
    "Raises": ("sut_error", "internal error in schedule: the scheduler's own bug"),
    "Floats": ("protocol_error", "expected integer, found float"),
    "UnknownField": ("protocol_error", "result.my_debug_field: expected no such field"),
    "NotJson": ("protocol_error", "not JSON: result.finished_req_ids: expected a JSON value, found set()"),
    "LateUnsupported": ("protocol_error", "unsupported is an answer to init only"),
    "BadCode": ("protocol_error", "error.code: unknown error code 'not_a_code'"),
    "CodedRefusal": ("input_error", "step: no error expected, got unknown_request_id: no such request"),
}


@pytest.mark.parametrize("name", sorted(MODULE_CASES))
def test_each_module_fault_is_a_failure_of_its_kind_and_leaves_no_process(name, trace, pid_dir):
    kind, words = MODULE_CASES[name]
    sut = make_sut(f"module:{MODULE}:{name}")
    t0 = time.monotonic()
    try:
        result = replay(trace, sut, "strict", step_timeout=2.0)
    finally:
        sut.close()
    assert result.verdict == FAIL, result
    assert result.divergence.kind == kind, result.divergence
    assert words in result.divergence.message, result.divergence.message
    assert time.monotonic() - t0 < 20
    assert len(list(pid_dir.iterdir())) >= 1  # the child ran and was recorded
    assert survivors(pid_dir, within_s=5.0) == []


def test_a_base_exception_leaves_its_traceback_in_the_report(trace, pid_dir):
    sut = make_sut(f"module:{MODULE}:Bomb")
    try:
        result = replay(trace, sut, "strict", step_timeout=2.0)
    finally:
        sut.close()
    assert "Boom: a BaseException from the scheduler" in result.sut_stderr


def test_a_module_exit_reads_naturally_and_says_where_exit_was_called(trace, pid_dir):
    sut = make_sut(f"module:{MODULE}:ExitZero")
    try:
        result = replay(trace, sut, "strict", step_timeout=2.0)
    finally:
        sut.close()
    assert result.divergence.message == (
        f"step: module:{MODULE}:ExitZero: the process exited with exit code 0 before answering schedule"
    )
    assert "the scheduler raised SystemExit(0) in schedule" in result.sut_stderr
    assert "faulty_module.py" in result.sut_stderr and "sys.exit(0)" in result.sut_stderr


@pytest.mark.parametrize("name", ["Slow", "PrintsToStdout"])
def test_a_slow_or_chatty_module_passes(name, trace, pid_dir):
    sut = make_sut(f"module:{MODULE}:{name}")
    try:
        assert replay(trace, sut, "strict", step_timeout=2.0).verdict == PASS
    finally:
        sut.close()
    assert survivors(pid_dir, within_s=5.0) == []


def test_a_module_reply_is_checked_as_strictly_as_a_stdio_reply(trace):
    """In-process, 7.0 == 7 in Python: the old harness passed a scheduler answering floats."""
    sut = make_sut(f"module:{MODULE}:Floats")
    try:
        result = replay(trace, sut, "strict", step_timeout=5.0)
    finally:
        sut.close()
    assert result.verdict == FAIL and result.divergence.kind == "protocol_error"


def test_what_a_campaign_reads_before_any_trace_comes_from_the_child(tmp_path, monkeypatch):
    """forced_config and in_flight are read by a campaign before the first trace: the child's describe tells them."""
    (tmp_path / "forcing.py").write_text(
        "from schedconf.conformance.adapters.reference import ReferenceSut\n"
        "class NoPrefixCaching(ReferenceSut):\n"
        "    forced_config = {'enable_prefix_caching': False}\n"
        "    in_flight = False\n"
    )
    monkeypatch.chdir(tmp_path)
    sut = make_sut("module:forcing:NoPrefixCaching")
    try:
        assert sut.forced_config == {"enable_prefix_caching": False}
        assert sut.in_flight is False
    finally:
        sut.close()
    sut = make_sut(f"module:{MODULE}:Slow")
    try:
        assert sut.forced_config == {} and sut.in_flight is True  # the reference's
    finally:
        sut.close()


@pytest.mark.parametrize(
    "target,words",
    [
        ("no_such_module_xq7:Sut", "cannot import no_such_module_xq7:Sut"),
        (f"{MODULE}:NoSuchClass", "has no attribute 'NoSuchClass'"),
    ],
)
def test_a_module_that_cannot_be_imported_is_a_set_up_error(target, words):
    with pytest.raises(UnknownSut) as info:
        make_sut(f"module:{target}")
    assert words in str(info.value) and str(REPO) in str(info.value)


def test_a_module_that_os_exits_while_imported_is_a_set_up_error(tmp_path, monkeypatch):
    (tmp_path / "exits_on_import.py").write_text("import os\nos._exit(5)\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownSut) as info:
        make_sut("module:exits_on_import:Sut")
    assert str(info.value) == (
        "--sut 'module:exits_on_import:Sut': while importing the module and building the "
        "scheduler, the process exited with exit code 5 before answering describe"
    )


SET_UP_FILES = {
    "exits_on_import": (
        "import sys\nsys.exit(0)\n",
        "cannot import exits_on_import:Sut: the module exited while imported (SystemExit 0)",
    ),
    "raises_on_import": (
        "raise RuntimeError('broken at import')\n",
        "cannot import raises_on_import:Sut: importing raises_on_import raised RuntimeError: broken at import",
    ),
    "factory_raises": (
        "class Sut:\n    def __init__(self):\n        raise RuntimeError('no GPU here')\n",
        "factory_raises:Sut() failed: RuntimeError: no GPU here",
    ),
    "factory_exits": (
        "import sys\nclass Sut:\n    def __init__(self):\n        sys.exit(3)\n",
        "factory_exits:Sut() exited while building the scheduler (SystemExit 3)",
    ),
}


@pytest.mark.parametrize("prefix", ["module", "inprocess"])
@pytest.mark.parametrize("module_name", sorted(SET_UP_FILES))
def test_a_module_that_cannot_be_built_is_the_same_one_line_set_up_error_in_both_modes(
    prefix, module_name, tmp_path, monkeypatch
):
    """In-process, an exit while imported ended the harness with exit 0 and a failing factory was 'a bug in
    schedconf'; in the child, the message told how the harness asked rather than what failed."""
    text, words = SET_UP_FILES[module_name]
    (tmp_path / f"{module_name}.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(UnknownSut) as info:
        make_sut(f"{prefix}:{module_name}:Sut")
    assert str(info.value) == f"--sut '{prefix}:{module_name}:Sut': {words}"


def test_an_inprocess_module_that_exits_while_imported_is_exit_code_2(tmp_path):
    (tmp_path / "exits_on_import.py").write_text(SET_UP_FILES["exits_on_import"][0])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            "inprocess:exits_on_import:Sut",
            "--examples",
            "2",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: --sut 'inprocess:exits_on_import:Sut': " + SET_UP_FILES["exits_on_import"][1]
    ]


# ------------------------------------------------------------- in-process

INPROCESS_CASES = {
    "ExitZero": ("sut_exited", "called exit (0) in schedule"),
    "Bomb": ("sut_error", "schedule raised Boom"),
    "Raises": ("sut_error", "RuntimeError: the scheduler's own bug"),
    "Floats": ("protocol_error", "expected integer, found float"),
    "UnknownField": ("protocol_error", "my_debug_field: expected no such field"),
    "NotJson": ("protocol_error", "not JSON: result.finished_req_ids: expected a JSON value, found set()"),
    "LateUnsupported": ("protocol_error", "unsupported is an answer to init only"),
    "Hang": ("sut_timeout", "no answer within"),
    "BadCode": ("protocol_error", "error.code: unknown error code 'not_a_code'"),
    "CodedRefusal": ("input_error", "step: no error expected, got unknown_request_id: no such request"),
}


@pytest.mark.parametrize("name", sorted(INPROCESS_CASES))
def test_each_inprocess_fault_is_a_failure_of_its_kind(name, trace):
    kind, words = INPROCESS_CASES[name]
    sut = make_sut(f"inprocess:{MODULE}:{name}")
    result = replay(trace, sut, "strict", step_timeout=1.0)
    assert result.verdict == FAIL, result
    assert result.divergence.kind == kind, result.divergence
    assert words in result.divergence.message, result.divergence.message


@pytest.mark.parametrize(
    "name,message,words",
    [
        ("Bomb", "schedule raised Boom: a BaseException from the scheduler", 'raise Boom("a BaseException'),
        ("ExitZero", "the scheduler called exit (0) in schedule", "sys.exit(0)"),
    ],
)
def test_an_inprocess_exit_or_base_exception_reads_naturally_with_its_traceback(name, message, words, trace):
    """The message named the adapter's error class, and the traceback shown was the harness's own frames."""
    result = replay(trace, make_sut(f"inprocess:{MODULE}:{name}"), "strict", step_timeout=5.0)
    assert result.divergence.message == f"step: inprocess:{MODULE}:{name}: {message}"
    assert "faulty_module.py" in result.sut_stderr and words in result.sut_stderr
    assert "conformance/checking/replay.py" not in result.detail + result.sut_stderr


def test_an_inprocess_close_that_raises_is_ignored_as_a_process_shutdown_is():
    sut = make_sut(f"inprocess:{MODULE}:ClosesBadly")
    sut.close()
    sut = make_sut(f"module:{MODULE}:ClosesBadly")
    sut.close()


def test_a_trace_with_a_reset_is_unknown_for_a_module_without_reset_prefix_cache():
    """The harness's own unsupported (the optional method is missing) stays unknown in both modes."""
    from schedconf.conformance.workloads.workload import ResetSpec

    with_reset = run_workload(EXAMPLES["mixed"]().replace(resets=(ResetSpec(False, 2),)))
    assert any(e["kind"] == "reset_prefix_cache" for e in with_reset.events)
    for prefix in ("module", "inprocess"):
        sut = make_sut(f"{prefix}:{MODULE}:NoReset")
        try:
            result = replay(with_reset, sut, "strict", step_timeout=5.0)
        finally:
            sut.close()
        assert result.verdict == UNKNOWN and "reset_prefix_cache" in result.detail, (prefix, result)


def test_an_inprocess_scheduler_that_behaves_passes(trace):
    assert replay(trace, make_sut(f"inprocess:{MODULE}:Slow"), "strict").verdict == PASS


# ------------------------------------------------------------ through the CLI


def run_cli(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "schedconf.conformance", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        **kw,
    )


@pytest.mark.parametrize(
    "sut,kind",
    [
        (f"module:{MODULE}:ExitZero", "sut_exited"),
        (f"module:{MODULE}:OsExit", "sut_exited"),
        (f"module:{MODULE}:NativeHang", "sut_timeout"),
        (f"module:{MODULE}:Bomb", "sut_exited"),
        (f"inprocess:{MODULE}:Bomb", "sut_error"),
    ],
)
def test_a_campaign_against_a_faulty_module_fails_with_its_report(sut, kind, tmp_path, pid_dir):
    """The old harness exited 0 (or the scheduler's code) with no report, or could not pickle the error."""
    junit = tmp_path / "junit.xml"
    proc = run_cli(
        [
            "run",
            "--sut",
            sut,
            "--examples",
            "2",
            "--jobs",
            "2",
            "--timeout",
            "2",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "--run-id",
            "r",
            "--junit-xml",
            str(junit),
            "-q",
        ],
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "fail" and summary["failed"] == 2
    assert {f["signature"] for f in summary["failures"]} == {kind}
    assert kind in (tmp_path / "r" / "report.html").read_text()
    assert kind in junit.read_text()
    assert "Traceback" not in proc.stderr and "pickle" not in proc.stderr
    assert survivors(pid_dir, within_s=5.0) == []


def test_replay_of_a_module_that_exits_fails(tmp_path, trace, pid_dir):
    from schedconf.conformance.traces.trace import write_trace

    path = tmp_path / "t.jsonl"
    write_trace(path, trace)
    proc = run_cli(["replay", str(path), "--sut", f"module:{MODULE}:ExitZero"], timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "sut_exited" in proc.stdout


def test_sigterm_is_honoured_while_a_module_hangs_in_native_code(tmp_path, pid_dir):
    """The old harness ran the scheduler in its own thread: SIGTERM waited for the C loop (45 s and more)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            f"module:{MODULE}:NativeHang",
            "--examples",
            "2",
            "--timeout",
            "60",
            "--out",
            str(tmp_path),
            "--run-id",
            "r",
            "-q",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not survivors(pid_dir):
        time.sleep(0.1)
    time.sleep(1.5)  # in the native loop by now
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert time.monotonic() - t0 < 15
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["interrupted_by"] == "SIGTERM"
    assert survivors(pid_dir, within_s=5.0) == []


# --------------------------------------------------------- late unsupported


def test_a_stdio_scheduler_answering_unsupported_after_init_fails(trace, pid_dir):
    sut = StdioSut(faulty("late_unsupported", at=3), timeout_s=2.0)
    try:
        result = replay(trace, sut, "strict", step_timeout=2.0)
    finally:
        sut.close()
    assert result.verdict == FAIL and result.divergence.kind == "protocol_error"
    assert "answered unsupported (this step looks hard)" in result.divergence.message


def test_a_campaign_cannot_pass_by_giving_up(tmp_path, pid_dir):
    """The old harness: 'PASS: 1 passed, 1 unknown' for a scheduler that answered unsupported mid-trace."""
    proc = run_cli(
        [
            "run",
            "--sut",
            "stdio:" + faulty("late_unsupported", at=3),
            "--examples",
            "2",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "-q",
        ],
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_our_engine_adapters_keep_their_late_unsupported(trace, pid_dir):
    """Our drivers answer unsupported mid-trace for inputs their fake model runner cannot produce: unknown."""
    from schedconf.conformance.adapters.aphrodite import AphroditeSut
    from schedconf.conformance.adapters.lmdeploy import LmdeploySut
    from schedconf.conformance.adapters.nanovllm import NanoVllmSut
    from schedconf.conformance.adapters.sglang import SglangSut
    from schedconf.conformance.adapters.vllm_v0 import VllmV0Sut
    from schedconf.conformance.adapters.vllm_v1 import VllmV1Sut

    for adapter in (AphroditeSut, LmdeploySut, NanoVllmSut, SglangSut, VllmV0Sut, VllmV1Sut):
        assert adapter.honours_late_unsupported is True, adapter
    assert StdioSut.honours_late_unsupported is False

    class Trusted(StdioSut):
        honours_late_unsupported = True

    sut = Trusted(faulty("late_unsupported", at=3), timeout_s=2.0)
    try:
        result = replay(trace, sut, "strict", step_timeout=2.0)
    finally:
        sut.close()
    assert result.verdict == UNKNOWN and "this step looks hard" in result.detail


# ---------------------------------------------------------------- survivors


def test_a_daemon_the_scheduler_detaches_does_not_survive(trace, pid_dir):
    sut = StdioSut(faulty("daemon"), timeout_s=2.0)
    try:
        assert replay(trace, sut, "strict", step_timeout=2.0).verdict == PASS
        alive = survivors(pid_dir)
        assert len(alive) == 2  # the scheduler and its daemon, in a session of its own
    finally:
        sut.close()
    assert survivors(pid_dir, within_s=5.0) == []


def test_a_hung_scheduler_does_not_survive_a_killed_harness(tmp_path, pid_dir):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            "stdio:" + faulty("hang", at=4),
            "--examples",
            "2",
            "--timeout",
            "120",
            "--out",
            str(tmp_path),
            "-q",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not survivors(pid_dir):
        time.sleep(0.1)
    assert survivors(pid_dir), "the scheduler never started"
    time.sleep(1.0)
    proc.kill()  # SIGKILL: the harness runs no handler, no atexit
    proc.wait(timeout=10)
    assert survivors(pid_dir, within_s=5.0) == []


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_the_scheduler_starts_with_the_signal_actions_a_direct_start_gives():
    """The supervisor is a Python process, which ignores SIGPIPE and SIGXFSZ; its command inherited that."""
    from schedconf.conformance.adapters.stdio import SUPERVISOR

    show = ["sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"]
    direct = subprocess.run(show, capture_output=True, text=True, timeout=30).stdout
    supervised = subprocess.run(
        [sys.executable, "-I", "-S", SUPERVISOR, str(os.getpid()), "--", *show],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert "SigIgn" in direct and supervised == direct


# ------------------------------------------------------------------ set-up


@pytest.mark.parametrize(
    "sut,words",
    [
        ("stdio:nonexistent-binary-xq7 --serve", "cannot start 'nonexistent-binary-xq7': no such program on PATH"),
        ("stdio:./not/here", "cannot start './not/here': not an executable file"),
        ("stdio:'unbalanced", "does not parse as shell words"),
    ],
)
def test_a_scheduler_that_cannot_start_is_a_set_up_error(sut, words, tmp_path):
    """The old harness made a missing program a conformance FAIL (exit 1), bad quoting an internal error."""
    proc = run_cli(["run", "--sut", sut, "--examples", "1", "--out", str(tmp_path)], timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr and "internal error" not in proc.stderr


@pytest.mark.parametrize(
    "shebang,words",
    [
        ("#!/no/such/interpreter-xq7\n", "its #! interpreter '/no/such/interpreter-xq7' is not an executable file"),
        (
            "#!/usr/bin/env no-such-language-xq7\n",
            "runs 'no-such-language-xq7' through env, and there is no such program",
        ),
    ],
)
def test_a_script_whose_interpreter_is_missing_is_a_set_up_error(shebang, words, tmp_path):
    """It passes the PATH check and used to fail only when executed: exit 127, read as a conformance FAIL."""
    script = tmp_path / "sched.sh"
    script.write_text(shebang + "echo never\n")
    script.chmod(0o755)
    proc = run_cli(["run", "--sut", f"stdio:{script}", "--examples", "1", "--out", str(tmp_path)], timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr and "FAIL" not in proc.stdout


def test_a_reply_nested_too_deeply_or_with_a_duplicate_key_is_a_protocol_error(tmp_path, trace, pid_dir):
    for reply, words in (
        ('{"id":1,"result":' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"id":1,"id":1,"result":{}}', "key 'id' twice"),
    ):
        script = tmp_path / "bad.sh"
        script.write_text(f"#!/bin/sh\nread line\necho '{reply}'\nsleep 30\n")
        script.chmod(0o755)
        sut = StdioSut(str(script), timeout_s=5.0)
        try:
            result = replay(trace, sut, "strict", step_timeout=5.0)
        finally:
            sut.close()
        assert result.verdict == FAIL and result.divergence.kind == "protocol_error", result
        assert words in result.divergence.message


def test_a_reply_without_an_id_says_so(tmp_path, trace):
    script = tmp_path / "noid.sh"
    script.write_text("#!/bin/sh\nread line\necho '{\"result\":{}}'\nsleep 30\n")
    script.chmod(0o755)
    sut = StdioSut(str(script), timeout_s=5.0)
    try:
        result = replay(trace, sut, "strict", step_timeout=5.0)
    finally:
        sut.close()
    assert "the reply has no id (expected id 1)" in result.divergence.message


def test_the_bench_of_the_two_modes_runs():
    """bench/bench_module_sut.py (the figures behind keeping inprocess:) runs and prints a row per mode."""
    proc = subprocess.run(
        [sys.executable, "bench/bench_module_sut.py", "--examples", "4"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split()[0] for line in proc.stdout.splitlines()[2:]]
    assert rows == [
        "reference",
        f"inprocess:{'schedconf.conformance.adapters.reference:ReferenceSut'}",
        "module:schedconf.conformance.adapters.reference:ReferenceSut",
    ]
