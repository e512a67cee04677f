"""The run report's first screen: rendered summary, failures grouped by kind, every run state, escaping."""

import copy
import json
import re
import shutil

import pytest

from conformance.campaign import CampaignSpec, run_campaign
from conformance.report import (compute_failure_groups, compute_relevant_config, render_html, render_summary_md,
                                write_reports)

EVIL = "<img src=x onerror=alert(1)>"
SUT = "mutant:fcfs_victim_head"


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    """A real failing campaign: the FCFS victim-order mutant, shrunk."""
    out = tmp_path_factory.mktemp("runs")
    summary = run_campaign(CampaignSpec(sut=SUT, examples=30, seed=1, out_dir=str(out), run_id="mut", quiet=True,
                                        shrink_budget_s=15))
    assert summary["status"] == "fail" and summary["failed"] >= 2
    return out / "mut", summary


def _base_summary(**changes):
    """A summary as a campaign writes it, with no failures."""
    summary = {
        "run_id": "synthetic", "run_dir": "reports/synthetic", "status": "pass", "examples_requested": 10,
        "examples_run": 10, "passed": 10, "failed": 0, "unknown": 0, "discarded": 0, "interrupted": False,
        "failures": [], "unknowns": [], "features": {"preemption": 4}, "feature_shares": {"preemption": 0.4},
        "command": "schedconf run --sut reference", "duration_s": 1.5, "traces_per_s": 10.0, "steps_run": 99,
        "spec": {"sut": "reference", "profile": "vllm-0.33", "comparison": "strict", "seed": 0,
                 "generator": "random", "jobs": 1, "config_overrides": {}},
    }
    summary.update(changes)
    return summary


def _assert_no_markdown_in_pre(page):
    for block in re.findall(r"<pre[^>]*>(.*?)</pre>", page, re.S):
        assert "## " not in block and "|---|" not in block and "**" not in block, block[:300]


def _assert_static(page):
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "<link" not in page


def test_failing_run_groups_failures_by_kind_with_count_trace_config_and_replay_command(failing_run):
    run_dir, summary = failing_run
    page = (run_dir / "report.html").read_text()
    _assert_static(page)
    _assert_no_markdown_in_pre(page)
    assert re.search(r"<h1>schedconf run", page) and "<table>" in page
    assert "<h2>Failures by kind of divergence</h2>" in page
    groups = compute_failure_groups(summary, run_dir)
    assert sum(g["count"] for g in groups) == summary["failed"]
    for g in groups:
        members = [f for f in summary["failures"] if f["signature"] == g["signature"]]
        assert g["count"] == len(members)
        assert f"<code>{g['signature']}</code>: {g['count']} trace" in page
        # The smallest trace: the shortest minimal one when some were shrunk.
        shrunk = [f["shrunk_events"] for f in members if f["shrunk_file"]]
        assert g["events"] == (min(shrunk) if shrunk else min(f["events"] for f in members))
        assert (run_dir / g["trace_file"]).is_file() and f'href="{g["trace_file"]}"' in page
        assert (run_dir / g["report_file"]).is_file() and f'href="{g["report_file"]}"' in page
        command = f"schedconf replay {run_dir / g['trace_file']} --sut {SUT} --comparison strict"
        assert g["replay"] == command and command in page
        names = [row["name"] for row in g["config"]]
        assert names[:2] == ["profile", "policy"]
    top = groups[0]
    assert top["signature"] == "scheduler_output:preempted_req_ids" and top["shrunk"]
    assert {"num_gpu_blocks", "block_size", "max_num_batched_tokens"} <= {r["name"] for r in top["config"]}
    assert "<svg" in page


def test_the_replay_command_reproduces_the_failure(failing_run, capsys):
    from conformance.cli import main

    run_dir, summary = failing_run
    group = compute_failure_groups(summary, run_dir)[0]
    argv = group["replay"].split()
    assert argv[:2] == ["schedconf", "replay"]
    assert main(argv[1:]) == 1
    assert "first divergence" in capsys.readouterr().out


def test_summary_md_groups_failures_the_same_way(failing_run):
    run_dir, summary = failing_run
    md = (run_dir / "summary.md").read_text()
    groups = compute_failure_groups(summary, run_dir)
    assert "## Failures by kind of divergence" in md
    for i, g in enumerate(groups, 1):
        assert f"### {i}. `{g['signature']}`: {g['count']} trace" in md
        assert f"`{g['replay']}`" in md
    # One table row per kind, not one per failure.
    rows = [ln for ln in md.splitlines() if re.match(r"\| \d+ \| `", ln)]
    assert len(rows) == len(groups) < summary["failed"]


def test_config_rule_keeps_what_matters_to_the_divergence():
    header = {"profile": "vllm-0.32", "config": {
        "block_size": 4, "num_gpu_blocks": 9, "max_num_batched_tokens": 32, "max_num_seqs": 3, "max_model_len": 20,
        "enable_chunked_prefill": True, "long_prefill_token_threshold": 0, "enable_prefix_caching": False,
        "policy": "priority", "num_spec_tokens": 0, "num_lookahead_tokens": 0, "scheduler_reserve_full_isl": None}}
    preemption = {r["name"]: r for r in compute_relevant_config("scheduler_output:preempted_req_ids", header)}
    assert preemption["profile"]["value"] == "vllm-0.32" and preemption["policy"]["value"] == "priority"
    assert {"num_gpu_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs"} <= set(preemption)
    assert "max_model_len" not in preemption and "enable_chunked_prefill" not in preemption
    assert "not the default" in preemption["enable_prefix_caching"]["why"]  # a switch off its default
    stop = {r["name"] for r in compute_relevant_config("request_outputs:outputs.finish_reason", header)}
    assert "max_model_len" in stop and "num_gpu_blocks" not in stop
    crash = {r["name"] for r in compute_relevant_config("sut_error", header)}
    assert set(header["config"]) <= crash


def test_smallest_original_trace_when_nothing_was_shrunk(tmp_path):
    failures = [{"index": i, "trace_file": f"failures/trace-{i:05d}.jsonl", "events": events,
                 "report_file": f"failures/trace-{i:05d}.txt", "signature": "scheduler_output:num_scheduled_tokens",
                 "step": 3, "message": "step 3: schedule() differs", "shrunk_file": None, "shrunk_events": None}
                for i, events in ((4, 80), (9, 12), (11, 40))]
    summary = _base_summary(status="fail", failed=3, passed=7, failures=failures)
    [group] = compute_failure_groups(summary, tmp_path)
    assert group["count"] == 3 and group["trace_file"] == "failures/trace-00009.jsonl" and group["events"] == 12
    assert group["message"] == "schedule() differs" and group["step"] == 3


def test_request_ids_and_messages_from_traces_are_escaped(failing_run, tmp_path):
    run_dir, summary = failing_run
    evil_dir = tmp_path / "evil"
    shutil.copytree(run_dir, evil_dir)
    summary = copy.deepcopy(summary)
    entry = next(f for f in summary["failures"] if f["shrunk_file"])
    summary["failures"] = [entry]
    trace_path = evil_dir / entry["shrunk_file"]
    rid = next(e["request_id"] for e in map(json.loads, trace_path.read_text().splitlines()[1:])
               if e["kind"] == "add_request")
    trace_path.write_text(trace_path.read_text().replace(json.dumps(rid), json.dumps(EVIL)))
    text_report = evil_dir / entry["shrunk_file"].replace(".jsonl", ".txt")
    text_report.write_text(re.sub(rf"\b{re.escape(rid)}\b", EVIL, text_report.read_text()))
    assert EVIL in trace_path.read_text() and EVIL in text_report.read_text()
    entry["message"] = f"step 9: {EVIL} differs"
    entry["signature"] = f"scheduler_output:{EVIL}"
    summary["unknowns"] = [{"index": 3, "reason": EVIL}]
    summary["harness_error"] = f"RuntimeError: {EVIL}"
    page = render_html(summary, evil_dir)
    assert EVIL not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<img" not in page
    assert "<svg" in page and "cannot read" not in page  # the timeline of the trace with the evil id was drawn
    _assert_static(page)


def test_zero_failures_is_a_clear_pass(tmp_path):
    page = render_html(_base_summary(), tmp_path)
    assert re.search(r'class="banner pass"[^>]*>\s*<b>PASS</b>', page)
    assert "No failures." in page and "Failures by kind" not in page
    _assert_no_markdown_in_pre(page)
    assert render_summary_md(_base_summary(), tmp_path).startswith("# schedconf run synthetic\n\n**PASS**")


def test_unknown_verdicts_list_their_reasons(tmp_path):
    summary = _base_summary(status="unknown", passed=0, unknown=10,
                            unknowns=[{"index": 0, "reason": "unsupported config: num_lookahead_tokens=3"},
                                      {"index": 1, "reason": "unsupported config: policy=priority"}])
    page = render_html(summary, tmp_path)
    assert "<b>UNKNOWN</b>" in page and "<h2>Unknown verdicts</h2>" in page
    assert "<li>trace 0: unsupported config: num_lookahead_tokens=3</li>" in page
    assert "the first 2 listed" in page
    assert "- trace 1: unsupported config: policy=priority" in render_summary_md(summary, tmp_path)


def test_harness_error_is_shown_prominently(tmp_path):
    summary = _base_summary(status="harness_error", examples_run=4, passed=4,
                            harness_error="BrokenProcessPool: a child process terminated abruptly",
                            harness_traceback="Traceback (most recent call last):\n  ...")
    page = render_html(summary, tmp_path)
    assert "<b>HARNESS ERROR</b>" in page
    alert = re.search(r'<div class="error" role="alert">(.*?)</div>', page, re.S).group(1)
    assert "BrokenProcessPool: a child process terminated abruptly" in alert and "Traceback" in alert
    assert page.index("role=\"alert\"") < page.index("<h2>Run</h2>")
    md = render_summary_md(summary, tmp_path)
    assert "## Harness error" in md and "BrokenProcessPool" in md


def test_interrupted_and_still_running_runs_say_so(tmp_path):
    page = render_html(_base_summary(status="interrupted", interrupted=True, examples_run=5, passed=5), tmp_path)
    assert "<b>INTERRUPTED</b>" in page and "partial results" in page
    failing = _base_summary(status="fail", interrupted=True, failed=1, failures=[{
        "index": 2, "trace_file": "failures/trace-00002.jsonl", "report_file": "failures/trace-00002.txt", "events": 7,
        "signature": "sut_error", "section": "sut_error", "step": 1, "message": "boom", "shrunk_file": None,
        "shrunk_events": None}])
    page = render_html(failing, tmp_path)
    assert "<b>FAIL</b>" in page and "interrupted" in page and "config unknown" in page
    # What a run writes when it starts: no counts of time, no shares, status "running".
    running = {"run_id": "r", "run_dir": str(tmp_path), "status": "running", "examples_requested": 100,
               "examples_run": 0, "passed": 0, "failed": 0, "unknown": 0, "discarded": 0, "interrupted": False,
               "failures": [], "unknowns": [], "features": {}, "command": "schedconf run",
               "spec": {"sut": "reference", "profile": "vllm-0.33", "comparison": "strict", "seed": 0}}
    write_reports(tmp_path, running)
    page = (tmp_path / "report.html").read_text()
    assert "<b>RUNNING OR KILLED</b>" in page and "still running" in page and "killed" in page
    assert "No failures." not in page
    assert "**RUNNING OR KILLED**" in (tmp_path / "summary.md").read_text()
    for phase in ("starting", "replaying", "shrinking"):  # the phases a run's summary.json goes through
        write_reports(tmp_path, dict(running, status=phase))
        assert "<b>RUNNING OR KILLED</b>" in (tmp_path / "report.html").read_text(), phase
