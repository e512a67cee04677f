"""Every input of the harness is bounded (docs/reference/bounds.md): each bound, and each set-up mistake, refused in one line.

Each test feeds the harness one input past one bound, or one set-up mistake,
and checks the exit code (2: bad input), the words of the one-line error and
that no traceback shows; where the input is a stream or a device, the test is
bounded by a timeout, since the old harness read such a file until the
machine ran out of memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace as dc_replace
from pathlib import Path

import pytest

from schedconf.conformance import bounds
from schedconf.conformance.cli import main
from schedconf.conformance.runs.campaign import exit_code

REPO = Path(__file__).resolve().parents[2]
HEADER = {
    "kind": "header",
    "format": "schedconf-trace",
    "version": 1,
    "profile": "vllm-0.33",
    "seed": 0,
    "origin": "test",
}
CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 17,
    "max_num_batched_tokens": 32,
    "max_num_seqs": 4,
    "max_model_len": 32,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "long_prefill_token_threshold": 0,
    "num_spec_tokens": 0,
    "num_lookahead_tokens": 0,
    "scheduler_reserve_full_isl": None,
}
ADD = {
    "kind": "add_request",
    "request_id": "r0",
    "prompt_token_ids": [1, 2, 3],
    "max_tokens": 2,
    "priority": 0,
    "arrival_time": 0,
    "eos_token_id": None,
    "ignore_eos": False,
    "stop_token_ids": [],
    "min_tokens": 0,
}


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def write_lines(path: Path, *objects: dict) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))
    return path


def run_cli(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "schedconf.conformance", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        **kw,
    )


# ------------------------------------------------------------------ files


def test_a_device_is_refused_without_being_read():
    """/dev/zero never ends: the old reader filled the memory; now it is refused before one byte is read."""
    proc = run_cli(["replay", "/dev/zero", "--sut", "reference"], REPO, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "/dev/zero: (file): expected a regular trace file, found a character device" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, capsys):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    code, err = run_main(["replay", str(fifo)], capsys)  # an ordinary open would block here for ever
    assert code == 2 and f"{fifo}: (file): expected a regular trace file, found a FIFO (named pipe)" in err


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path, capsys):
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:  # sparse: costs no disk, and would cost 256 MiB of memory if read
        f.truncate(bounds.MAX_FILE_BYTES + 1)
    code, err = run_main(["replay", str(big)], capsys)
    assert code == 2
    assert f"expected a trace file of at most {bounds.MAX_FILE_BYTES} bytes" in err
    assert f"found {bounds.MAX_FILE_BYTES + 1} bytes" in err


def test_read_bounded_bytes_stops_at_the_bound_on_a_growing_file(tmp_path, monkeypatch):
    """A file that grows while read is refused at the bound (st_size said it was small)."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with pytest.raises(bounds.InputFileError, match="at most 10 bytes"):
        bounds.read_bounded_bytes(path, max_bytes=10)
    assert bounds.read_bounded_bytes(path, max_bytes=100) == b"x" * 100


def test_a_line_over_the_line_bound_is_refused(tmp_path, capsys):
    path = tmp_path / "long.jsonl"
    long_add = dict(ADD, request_id="r" * (bounds.MAX_LINE_BYTES + 1))
    write_lines(path, dict(HEADER, config=CONFIG), long_add)
    code, err = run_main(["replay", str(path)], capsys)
    assert code == 2 and f"{path}:2: (line): expected a line of at most {bounds.MAX_LINE_BYTES} bytes" in err


def test_a_summary_that_is_a_fifo_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "summary.json")
    code, err = run_main(["report", str(run)], capsys)
    assert code == 2 and "expected a regular run summary, found a FIFO" in err


def test_an_empty_scenario_file_is_refused(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("# only a comment\n\n")
    code, err = run_main(["scenario", str(empty)], capsys)
    assert code == 2 and "expected at least one command block" in err


def test_a_scenario_that_is_a_folder_is_refused(tmp_path, capsys):
    code, err = run_main(["scenario", str(tmp_path)], capsys)
    assert code == 2 and "expected a regular scenario file, found a folder" in err


# ----------------------------------------------------------- trace content


def test_a_header_only_trace_is_refused_but_a_refused_config_trace_is_not(tmp_path, capsys):
    lone = write_lines(tmp_path / "lone.jsonl", dict(HEADER, config=CONFIG))
    code, err = run_main(["replay", str(lone)], capsys)
    assert code == 2 and "expected at least one event after the header" in err
    # 0 usable blocks... one unit past the pool limit: the reference refuses it, so the trace passes
    refused = write_lines(
        tmp_path / "refused.jsonl",
        dict(HEADER, config=dict(CONFIG, num_gpu_blocks=1, max_model_len=4), expect_error="invalid_num_gpu_blocks"),
    )
    code, out = run_main(["replay", str(refused)], capsys)
    assert code == 0, out


def test_an_unknown_profile_is_refused_with_the_known_ones(tmp_path, capsys):
    path = write_lines(tmp_path / "new.jsonl", dict(HEADER, profile="vllm-0.40", config=CONFIG), ADD)
    code, err = run_main(["replay", str(path)], capsys)
    assert code == 2, err
    assert f'{path}:1: profile: expected one of "vllm-0.33", ' in err and '"vllm-0.10"' in err
    assert 'found "vllm-0.40"' in err and "internal error" not in err


def test_deeply_nested_json_is_a_trace_error(tmp_path, capsys):
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(dict(HEADER, config=CONFIG)) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    code, err = run_main(["replay", str(path)], capsys)
    assert code == 2 and f"{path}:2: (line): expected JSON nested" in err and "internal error" not in err


def test_a_duplicate_key_is_refused(tmp_path, capsys):
    path = tmp_path / "dup.jsonl"
    path.write_text(json.dumps(dict(HEADER, config=CONFIG)) + "\n" + json.dumps(ADD)[:-1] + ', "max_tokens": 5}\n')
    code, err = run_main(["replay", str(path)], capsys)
    assert code == 2 and f"{path}:2: max_tokens: expected each key once per object, found it twice" in err


# ------------------------------------------------------------- config sizes


@pytest.mark.parametrize("field_name,scheduler", [("num_gpu_blocks", "v1"), ("num_cpu_blocks", "v0")])
def test_a_pool_past_the_bound_is_refused_in_a_header(field_name, scheduler, tmp_path, capsys):
    from schedconf.conformance.traces.trace import TraceError, validate_header_config

    # the bound is checked before the config's own rules, so the rest of the config does not matter here
    header = dict(HEADER, config={**CONFIG, field_name: bounds.MAX_POOL_BLOCKS + 1})
    if scheduler == "v0":
        header.update(profile="vllm-0.10", scheduler="v0")
    with pytest.raises(TraceError) as info:
        validate_header_config(header, "t.jsonl", 1)
    assert f"t.jsonl:1: config.{field_name}: expected at most {bounds.MAX_POOL_BLOCKS} blocks" in str(info.value)
    assert f"found {bounds.MAX_POOL_BLOCKS + 1}" in str(info.value)


def test_a_billion_blocks_in_a_trace_is_refused_before_anything_is_built(tmp_path):
    """The old harness built every block of the pool (about 150 MB/s for 10^9 blocks); now: exit 2 at once."""
    path = write_lines(tmp_path / "huge.jsonl", dict(HEADER, config=dict(CONFIG, num_gpu_blocks=10**9)), ADD)
    proc = run_cli(["replay", str(path), "--sut", "reference"], tmp_path, timeout=60)
    assert proc.returncode == 2
    assert f"config.num_gpu_blocks: expected at most {bounds.MAX_POOL_BLOCKS} blocks" in proc.stderr


def test_a_pool_past_the_bound_is_refused_in_set(capsys, tmp_path):
    code, err = run_main(
        [
            "run",
            "--sut",
            "reference",
            "--examples",
            "1",
            "--out",
            str(tmp_path),
            "--set",
            f"num_gpu_blocks={bounds.MAX_POOL_BLOCKS + 1}",
        ],
        capsys,
    )
    assert code == 2 and f"expected at most {bounds.MAX_POOL_BLOCKS} blocks" in err


def test_the_shrinker_never_proposes_a_pool_past_the_bound():
    """Smaller block sizes at the same capacity multiply the block count: such candidates are not tried."""
    from schedconf.conformance.checking.shrink import _candidates
    from schedconf.conformance.traces.examples import EXAMPLES

    workload = EXAMPLES["mixed"]()
    big = workload.replace(
        config=dc_replace(workload.config, block_size=1024, num_gpu_blocks=bounds.MAX_POOL_BLOCKS - 10)
    )
    sizes = [c.config.num_gpu_blocks for c in _candidates(big)]
    assert sizes and max(sizes) <= bounds.MAX_POOL_BLOCKS


def test_a_scenario_config_past_the_bound_is_refused(tmp_path, capsys):
    path = tmp_path / "big.txt"
    path.write_text(
        f"config block_size=4 num_gpu_blocks={bounds.MAX_POOL_BLOCKS + 1} max_num_batched_tokens=8 "
        "max_num_seqs=2 max_model_len=16\n----\nok\n"
    )
    code, err = run_main(["scenario", str(path)], capsys)
    assert code == 2 and f"expected at most {bounds.MAX_POOL_BLOCKS} blocks" in err


def test_a_scenario_token_range_past_the_bound_is_refused(tmp_path, capsys):
    from schedconf.conformance.workloads.datadriven import ScenarioFormatError, parse_tokens

    with pytest.raises(ScenarioFormatError, match=f"at most {bounds.MAX_SCENARIO_TOKENS} tokens"):
        parse_tokens("0..1000000000")


# ----------------------------------------------------------- dumps and jobs


def test_the_reference_state_dump_is_truncated(tmp_path):
    """With 200,000 blocks the free queue alone is a line of over a megabyte; the report cuts it and says so."""
    from schedconf.conformance.adapters.reference import ReferenceSut
    from schedconf.conformance.checking.replay import FAIL, render_divergence, replay
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.workloads.workload import run_workload

    workload = EXAMPLES["mixed"]()
    trace = run_workload(workload.replace(config=dc_replace(workload.config, num_gpu_blocks=200_000)))

    class OffByOne(ReferenceSut):
        def schedule(self):
            out = super().schedule()
            return {**out, "total_num_scheduled_tokens": out["total_num_scheduled_tokens"] + 1}

    result = replay(trace, OffByOne(), "strict")
    assert result.verdict == FAIL
    text = render_divergence(trace, result)
    assert "more characters)" in text
    longest = max(len(line) for line in text.splitlines())
    assert longest <= bounds.MAX_DUMP_LINE_CHARS + 60, longest
    assert len(text) < 20_000


def test_render_truncated_lines_says_what_it_left_out():
    lines = bounds.render_truncated_lines("a" * 10 + "\nb\nc\nd", max_lines=2, max_chars=4)
    assert lines == ["aaaa ... (6 more characters)", "b", "... (2 more lines)"]


def test_workers_are_capped_at_the_number_of_traces(tmp_path):
    proc = run_cli(
        [
            "run",
            "--sut",
            "reference",
            "--examples",
            "3",
            "--jobs",
            "1000",
            "--out",
            str(tmp_path),
            "--shrink-budget",
            "0",
        ],
        tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 worker(s) for 3 trace(s) (--jobs 1000)" in proc.stderr
    cpus = os.cpu_count() or 1
    if cpus < 3:
        assert f"workers on {cpus} CPU(s)" in proc.stderr


def test_compute_jobs():
    assert bounds.compute_jobs(1000, 300, 2) == (300, bounds.compute_jobs(1000, 300, 2)[1])
    jobs, warning = bounds.compute_jobs(1000, 300, 2)
    assert jobs == 300 and "300 workers on 2 CPU(s)" in warning
    assert bounds.compute_jobs(2, 300, 2) == (2, None)
    assert bounds.compute_jobs(4, 1, 8) == (1, None)


@pytest.mark.parametrize(
    "run_id,words",
    [("a\nb", "printable characters only"), ("x" * 300, "at most 200"), ("a/b", "without a path separator")],
)
def test_a_bad_run_id_is_refused(run_id, words, tmp_path, capsys):
    code, err = run_main(
        ["run", "--sut", "reference", "--examples", "1", "--out", str(tmp_path), "--run-id", run_id], capsys
    )
    assert code == 2 and words in err


# -------------------------------------------------------------- wording


def test_a_divergence_at_init_says_at_init(tmp_path):
    from schedconf.conformance.checking.replay import render_where

    assert render_where(None, 1) == "at init"
    assert render_where(None, 3) == "before the first step"
    assert render_where(0, 5) == "at step 0"


def test_shrinking_a_passing_trace_says_so_once(tmp_path):
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.traces.trace import write_trace
    from schedconf.conformance.workloads.workload import run_workload

    path = tmp_path / "pass.jsonl"
    write_trace(path, run_workload(EXAMPLES["mixed"]()))
    proc = run_cli(["shrink", str(path), "--sut", "reference"], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("nothing to shrink") == 1 and "the trace's verdict is pass" in proc.stdout


def test_mutants_list_is_instant_and_names_every_mutant(capsys):
    from schedconf.conformance.checking.mutants import MUTANTS

    code, out = run_main(["mutants", "--list"], capsys)
    assert code == 0
    for name, mutant in MUTANTS.items():
        assert any(line.startswith(name + " ") and mutant.profile in line for line in out.splitlines()), name


def test_run_takes_q(tmp_path, capsys):
    code, _ = run_main(["run", "-q", "--sut", "reference", "--examples", "1", "--out", str(tmp_path)], capsys)
    assert code == 0


# ---------------------------------------------------------- interruptions


def test_interrupted_wins_over_failed_in_the_exit_code():
    summary = {"failed": 3, "interrupted": True, "interrupted_by": "SIGTERM", "status": "fail"}
    assert exit_code(summary) == 143
    assert exit_code(dict(summary, interrupted_by="SIGINT")) == 130
    assert exit_code(dict(summary, interrupted=False)) == 1


def wait_for(proc: subprocess.Popen, words: str, timeout_s: float = 120) -> str:
    """Read the process's stderr until ``words`` shows (what it read so far)."""
    seen = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if words in line:
            return seen
    raise AssertionError(f"never saw {words!r}:\n{seen}")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_campaign_interrupted_while_it_shrinks_exits_as_interrupted(sig, code, tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            "mutant:fcfs_victim_head",
            "--examples",
            "40",
            "--shrink-budget",
            "300",
            "--out",
            str(tmp_path),
            "--run-id",
            "r",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(proc, "shrinking failure #")
        time.sleep(1.0)  # within the first shrink (it takes several seconds)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["interrupted"] and summary["failed"] >= 1
    assert summary["interrupted_by"] == ("SIGTERM" if sig == signal.SIGTERM else "SIGINT")
    partial = [f for f in summary["failures"] if f.get("partial_file")]
    assert partial, summary["failures"]
    header = json.loads((tmp_path / "r" / partial[0]["partial_file"]).read_text().splitlines()[0])
    assert header["origin"] == "shrink-partial" and "not minimal" in header["description"]


def test_ctrl_c_on_shrink_keeps_the_best_trace_so_far(tmp_path):
    first = run_cli(
        [
            "run",
            "--sut",
            "mutant:fcfs_victim_head",
            "--examples",
            "40",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "--run-id",
            "r",
            "-q",
        ],
        tmp_path,
        timeout=300,
    )
    assert first.returncode == 1, first.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    chosen = max(summary["failures"], key=lambda f: f["events"])
    failing = tmp_path / "r" / chosen["trace_file"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "schedconf.conformance", "shrink", str(failing), "--sut", "mutant:fcfs_victim_head"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(proc, "shrink: ")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    partial = failing.with_suffix("").with_suffix(".min.partial.jsonl")
    assert f"not minimal: shrink it again to finish): {partial}" in err
    from schedconf.conformance.traces.trace import read_trace

    kept = read_trace(partial)
    assert kept.header["origin"] == "shrink-partial"
    assert 1 <= len(kept.events) < chosen["events"]  # "shrink: N events" means a smaller trace was accepted


def test_a_safety_run_stops_at_the_step_bound_with_unknown(monkeypatch):
    """A request of max_tokens 10^9 under a pool that holds it: the safety run would decode for ever."""
    from schedconf.conformance.adapters.reference import ReferenceSut
    from schedconf.conformance.checking.replay import UNKNOWN, replay
    from schedconf.conformance.traces.trace import parse_trace_text

    monkeypatch.setattr(bounds, "MAX_SAFETY_STEPS", 50)
    config = dict(
        CONFIG,
        block_size=1_000_000,
        num_gpu_blocks=1001,
        max_model_len=10**9,
        max_num_batched_tokens=10**9,
        enable_prefix_caching=False,
    )
    lines = (dict(HEADER, config=config), dict(ADD, max_tokens=10**9), dict(ADD, request_id="r1"))
    trace = parse_trace_text("\n".join(json.dumps(o) for o in lines), "t.jsonl")
    t0 = time.monotonic()
    result = replay(trace, ReferenceSut(), "safety")
    assert result.verdict == UNKNOWN, result
    assert "reached schedconf's bound of 50 steps" in result.detail and result.steps_run == 50
    assert time.monotonic() - t0 < 30


def test_a_divergence_report_shows_at_most_20_fields():
    from schedconf.conformance.checking.compare import Divergence, FieldDiff
    from schedconf.conformance.checking.replay import FAIL, ReplayResult, render_divergence
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.workloads.workload import run_workload

    trace = run_workload(EXAMPLES["mixed"]())
    diffs = tuple(FieldDiff(f"f{i}", i, i + 1) for i in range(25))
    result = ReplayResult(
        verdict=FAIL,
        divergence=Divergence(event_index=1, line=3, step=1, kind="scheduler_output", diffs=diffs, message="m"),
    )
    text = render_divergence(trace, result)
    assert "f19 " in text and "f20 " not in text and "... 5 more differing fields" in text


def test_the_stderr_kept_of_a_scheduler_is_its_last_200_lines(tmp_path):
    from schedconf.conformance.adapters.stdio import STDERR_LINES_KEPT, StdioSut
    from schedconf.conformance.checking.replay import FAIL, replay

    script = tmp_path / "noisy.sh"
    script.write_text('#!/bin/sh\nfor i in $(seq 500); do echo "line $i" >&2; done\nexec sleep 30\n')
    script.chmod(0o755)
    sut = StdioSut(str(script), timeout_s=2.0)
    try:
        from schedconf.conformance.traces.examples import EXAMPLES
        from schedconf.conformance.workloads.workload import run_workload

        result = replay(run_workload(EXAMPLES["mixed"]()), sut, "strict", step_timeout=2.0)
        tail = sut.stderr_tail(10_000).splitlines()
    finally:
        sut.close()
    assert result.verdict == FAIL
    assert len(tail) == STDERR_LINES_KEPT == 200 and tail[-1] == "line 500" and tail[0] == "line 301"
