"""The run report's first screen: rendered summary, failures grouped by kind, every run state, escaping."""

import copy
import json
import re
import shutil
import xml.etree.ElementTree as ET

import pytest
from markupsafe import escape

from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign
from schedconf.conformance.runs.report import (
    compute_failure_groups,
    compute_relevant_config,
    render_html,
    render_summary_md,
    write_reports,
)

EVIL = "<img src=x onerror=alert(1)>"
SUT = "mutant:fcfs_victim_head"


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    """A real failing campaign: the FCFS victim-order mutant, shrunk."""
    out = tmp_path_factory.mktemp("runs")
    summary = run_campaign(
        CampaignSpec(sut=SUT, examples=30, seed=1, out_dir=str(out), run_id="mut", quiet=True, shrink_budget_s=15)
    )
    assert summary["status"] == "fail" and summary["failed"] >= 2
    return out / "mut", summary


def _base_summary(**changes):
    """A summary as a campaign writes it, with no failures."""
    summary = {
        "run_id": "synthetic",
        "run_dir": "reports/synthetic",
        "status": "pass",
        "examples_requested": 10,
        "examples_run": 10,
        "passed": 10,
        "failed": 0,
        "unknown": 0,
        "discarded": 0,
        "interrupted": False,
        "failures": [],
        "unknowns": [],
        "features": {"preemption": 4},
        "feature_shares": {"preemption": 0.4},
        "command": "schedconf run --sut reference",
        "duration_s": 1.5,
        "traces_per_s": 10.0,
        "steps_run": 99,
        "spec": {
            "sut": "reference",
            "profile": "vllm-0.33",
            "comparison": "strict",
            "seed": 0,
            "generator": "random",
            "jobs": 1,
            "config_overrides": {},
        },
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
    from schedconf.conformance.cli import main

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
    header = {
        "profile": "vllm-0.32",
        "config": {
            "block_size": 4,
            "num_gpu_blocks": 9,
            "max_num_batched_tokens": 32,
            "max_num_seqs": 3,
            "max_model_len": 20,
            "enable_chunked_prefill": True,
            "long_prefill_token_threshold": 0,
            "enable_prefix_caching": False,
            "policy": "priority",
            "num_spec_tokens": 0,
            "num_lookahead_tokens": 0,
            "scheduler_reserve_full_isl": None,
        },
    }
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
    failures = [
        {
            "index": i,
            "trace_file": f"failures/trace-{i:05d}.jsonl",
            "events": events,
            "report_file": f"failures/trace-{i:05d}.txt",
            "signature": "scheduler_output:num_scheduled_tokens",
            "step": 3,
            "message": "step 3: schedule() differs",
            "shrunk_file": None,
            "shrunk_events": None,
        }
        for i, events in ((4, 80), (9, 12), (11, 40))
    ]
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
    rid = next(
        e["request_id"] for e in map(json.loads, trace_path.read_text().splitlines()[1:]) if e["kind"] == "add_request"
    )
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
    summary = _base_summary(
        status="unknown",
        passed=0,
        unknown=10,
        unknowns=[
            {"index": 0, "reason": "unsupported config: num_lookahead_tokens=3"},
            {"index": 1, "reason": "unsupported config: policy=priority"},
        ],
    )
    page = render_html(summary, tmp_path)
    assert "<b>UNKNOWN</b>" in page and "<h2>Unknown verdicts</h2>" in page
    assert "<li>trace 0: unsupported config: num_lookahead_tokens=3</li>" in page
    assert "the first 2 listed" in page
    assert "- trace 1: unsupported config: policy=priority" in render_summary_md(summary, tmp_path)


def test_harness_error_is_shown_prominently(tmp_path):
    summary = _base_summary(
        status="harness_error",
        examples_run=4,
        passed=4,
        harness_error="BrokenProcessPool: a child process terminated abruptly",
        harness_traceback="Traceback (most recent call last):\n  ...",
    )
    page = render_html(summary, tmp_path)
    assert "<b>HARNESS ERROR</b>" in page
    alert = re.search(r'<div class="error" role="alert">(.*?)</div>', page, re.S).group(1)
    assert "BrokenProcessPool: a child process terminated abruptly" in alert and "Traceback" in alert
    assert page.index('role="alert"') < page.index("<h2>Run</h2>")
    md = render_summary_md(summary, tmp_path)
    assert "## Harness error" in md and "BrokenProcessPool" in md


def test_interrupted_and_still_running_runs_say_so(tmp_path):
    page = render_html(_base_summary(status="interrupted", interrupted=True, examples_run=5, passed=5), tmp_path)
    assert "<b>INTERRUPTED</b>" in page and "partial results" in page
    failing = _base_summary(
        status="fail",
        interrupted=True,
        failed=1,
        failures=[
            {
                "index": 2,
                "trace_file": "failures/trace-00002.jsonl",
                "report_file": "failures/trace-00002.txt",
                "events": 7,
                "signature": "sut_error",
                "section": "sut_error",
                "step": 1,
                "message": "boom",
                "shrunk_file": None,
                "shrunk_events": None,
            }
        ],
    )
    page = render_html(failing, tmp_path)
    assert "<b>FAIL</b>" in page and "interrupted" in page and "config unknown" in page
    # What a run writes when it starts: no counts of time, no shares, status "running".
    running = {
        "run_id": "r",
        "run_dir": str(tmp_path),
        "status": "running",
        "examples_requested": 100,
        "examples_run": 0,
        "passed": 0,
        "failed": 0,
        "unknown": 0,
        "discarded": 0,
        "interrupted": False,
        "failures": [],
        "unknowns": [],
        "features": {},
        "command": "schedconf run",
        "spec": {"sut": "reference", "profile": "vllm-0.33", "comparison": "strict", "seed": 0},
    }
    write_reports(tmp_path, running)
    page = (tmp_path / "report.html").read_text()
    assert "<b>RUNNING OR KILLED</b>" in page and "still running" in page and "killed" in page
    assert "No failures." not in page
    assert "**RUNNING OR KILLED**" in (tmp_path / "summary.md").read_text()
    for phase in ("starting", "replaying", "shrinking"):  # the phases a run's summary.json goes through
        write_reports(tmp_path, dict(running, status=phase))
        assert "<b>RUNNING OR KILLED</b>" in (tmp_path / "report.html").read_text(), phase


# ------------------------------------------------------------ what differed first


def _text_report_rows(path):
    """The first-divergence step and the field table of a text report (replay.render_divergence's layout)."""
    lines = path.read_text().splitlines()
    step = int(re.search(r"first divergence at step (\d+):", lines[0]).group(1))
    rows = {}
    for ln in lines[3:]:
        parts = [p.strip() for p in ln.split(" | ")]
        if parts[0] == "field":
            continue
        if len(parts) != 3:
            break
        rows[parts[0]] = (parts[1], parts[2])
    return step, rows


def test_each_failure_records_its_first_differing_fields(failing_run):
    """For the original and the minimal trace: the step, the trace line, and up to 3 differing fields,
    the kind's own field first, each as the text report (a separate renderer) shows it, cut to 60 characters."""
    run_dir, summary = failing_run
    shrunk = [f for f in summary["failures"] if f["shrunk_file"]]
    assert shrunk
    for f in summary["failures"]:
        for prefix, report in (
            ("", f["report_file"]),
            ("shrunk_", f["shrunk_file"] and f["shrunk_file"].replace(".jsonl", ".txt")),
        ):
            if not report:
                continue
            step, rows = _text_report_rows(run_dir / report)
            diffs = f[f"{prefix}diffs"]
            assert f[f"{prefix}step"] == step and isinstance(f[f"{prefix}line"], int)
            assert f[f"{prefix}num_diffs"] == len(rows) and 1 <= len(diffs) == min(3, len(rows))
            assert diffs[0]["field"] == f["signature"].partition(":")[2] == "preempted_req_ids"
            for d in diffs:
                assert d["field"] in rows and len(d["expected"]) <= 60 and len(d["actual"]) <= 60
                expected, actual = rows[d["field"]]
                if len(expected) <= 60 and len(actual) <= 60:
                    assert (d["expected"], d["actual"]) == (expected, actual)
                else:  # cut alike where they first differ
                    assert d["expected"] != d["actual"] and d["expected"].endswith("...")


def test_first_screen_shows_what_differed_where_in_the_table_of_kinds(failing_run):
    run_dir, summary = failing_run
    best = min((f for f in summary["failures"] if f["shrunk_file"]), key=lambda f: (f["shrunk_events"], f["index"]))
    d = best["shrunk_diffs"][0]
    where = f"step {best['shrunk_step']} of a {best['shrunk_events']}-event trace"
    page = (run_dir / "report.html").read_text()
    kinds = page[page.index('<table class="kinds">') :]
    kinds = kinds[: kinds.index("</table>")]
    esc = {k: str(escape(v)) for k, v in d.items()}
    assert (
        f'<code>{esc["field"]}</code>: expected <code class="expected">{esc["expected"]}</code>, '
        f'got <code class="actual">{esc["actual"]}</code>'
    ) in kinds
    assert where.replace("-event", "\u2011event") in kinds and best["shrunk_file"] in kinds
    # The first screen holds the verdict, the counts and this table, nothing that scrolls sideways.
    assert "<pre" not in page[: page.index('<section class="group"')]
    md = (run_dir / "summary.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| 1 | "))
    assert f"`{d['field']}`: expected `{d['expected']}`, got `{d['actual']}`" in row and f"| {where} |" in row


def test_the_printed_summary_has_one_line_per_kind_with_what_differed(failing_run, capsys):
    from schedconf.conformance.cli import _print_summary

    run_dir, summary = failing_run
    _print_summary(summary)
    out = capsys.readouterr().out
    best = min((f for f in summary["failures"] if f["shrunk_file"]), key=lambda f: (f["shrunk_events"], f["index"]))
    d = best["shrunk_diffs"][0]
    lines = [ln for ln in out.splitlines() if ln.startswith("  1. ")]
    assert len(lines) == 1 and len([ln for ln in out.splitlines() if re.match(r"\s+\d+\. ", ln)]) == 1
    line = lines[0]
    assert line.startswith(
        f"  1. {best['signature']} ({len(summary['failures'])} traces), "
        f"step {best['shrunk_step']} of a {best['shrunk_events']}-event trace: "
        f"{d['field']}: expected {d['expected']}, got {d['actual']}"
    )
    assert line.endswith(str(run_dir / best["shrunk_file"]))


def test_junit_failure_message_carries_what_differed(failing_run):
    from schedconf.conformance.runs.campaign import TraceOutcome
    from schedconf.conformance.runs.junit import render_junit

    run_dir, summary = failing_run
    outcomes = [
        TraceOutcome(index=f["index"], verdict="fail", steps=1, events=f["events"], report="r")
        for f in summary["failures"]
    ]
    messages = {
        case.get("name"): case.find("failure").get("message")
        for case in ET.fromstring(render_junit(summary, outcomes)).iter("testcase")
    }
    for f in summary["failures"]:
        d = (f["shrunk_diffs"] if f["shrunk_file"] else f["diffs"])[0]
        step = f["shrunk_step"] if f["shrunk_file"] else f["step"]
        assert messages[f"trace-{f['index']:05d}"] == (
            f"{run_dir}/{f['shrunk_file'] or f['trace_file']}: step {step}: {f['signature']}: "
            f"{d['field']}: expected {d['expected']}, got {d['actual']}"
        )


def _failure(index, signature, step, field, expected, actual, events=6, shrunk=True):
    """A failure entry as a campaign records it (minimal trace shrunk to ``events`` events)."""
    diffs = [{"field": field, "expected": expected, "actual": actual}] if field else []
    entry = {
        "index": index,
        "trace_file": f"failures/trace-{index:05d}.jsonl",
        "events": 40,
        "report_file": f"failures/trace-{index:05d}.txt",
        "signature": signature,
        "step": step + 5,
        "line": 20,
        "message": f"step {step + 5}: schedule() differs",
        "diffs": diffs,
        "num_diffs": len(diffs),
        "shrunk_file": None,
        "shrunk_events": None,
    }
    if shrunk:
        entry.update(
            shrunk_file=f"failures/trace-{index:05d}.min.jsonl",
            shrunk_events=events,
            shrunk_step=step,
            shrunk_line=2 * step + 1,
            shrunk_message=f"step {step}: schedule() differs",
            shrunk_diffs=diffs,
            shrunk_num_diffs=len(diffs),
            shrunk_signature=signature,
        )
    return entry


def test_kinds_whose_minimal_traces_first_differ_alike_are_one_cause(tmp_path):
    # Kinds 1 and 2: minimal traces first differ at step 4 in num_scheduled_tokens (of other requests: the ids
    # do not count). Kind 3 differs in the same field at step 5: a cause of its own; so is the crash.
    # Kind 4 has the most traces, so its cause comes first; then the shared cause (2 traces), then the rest.
    failures = [
        _failure(1, "scheduler_output:num_scheduled_tokens", 4, "num_scheduled_tokens.<r1>", "2", "1"),
        _failure(
            2,
            "scheduler_output:scheduled_cached_reqs.num_computed_tokens",
            4,
            "num_scheduled_tokens.<r3>",
            "3",
            "<missing>",
        ),
        _failure(3, "scheduler_output:total_num_scheduled_tokens", 5, "num_scheduled_tokens.<r1>", "2", "1"),
        _failure(4, "scheduler_output:preempted_req_ids", 2, "preempted_req_ids", '["r1"]', '["r0"]'),
        _failure(5, "scheduler_output:preempted_req_ids", 3, "preempted_req_ids", '["r2"]', '["r0"]', events=9),
        _failure(6, "scheduler_output:preempted_req_ids", 2, "preempted_req_ids", '["r1"]', '["r2"]', events=8),
        _failure(7, "sut_error", 1, None, None, None),
    ]
    summary = _base_summary(status="fail", passed=3, failed=7, failures=failures)
    groups = compute_failure_groups(summary, tmp_path)
    assert [g["signature"].split(":")[-1] for g in groups] == [
        "preempted_req_ids",
        "num_scheduled_tokens",
        "scheduled_cached_reqs.num_computed_tokens",
        "total_num_scheduled_tokens",
        "sut_error",
    ]
    assert [g["cause"] for g in groups] == [1, 2, 2, 3, 4]
    assert groups[1]["cause_text"] == "2 kinds, one first difference: num_scheduled_tokens at step 4"
    page = render_html(summary, tmp_path)
    assert page.count('<tr class="cause">') == 1
    cause = re.search(r'<tr class="cause">(.*?)</tr>', page, re.S).group(1)
    assert "2 kinds, one first difference" in cause and "num_scheduled_tokens" in cause and "at step 4" in cause
    # the cause row sits right above its two kinds
    kinds = page[page.index('<table class="kinds">') :]
    assert (
        kinds.index('href="#kind-1"')
        < kinds.index('<tr class="cause">')
        < kinds.index('href="#kind-2"')
        < kinds.index('href="#kind-3"')
        < kinds.index("</table>")
    )
    assert "7 failing traces, 5 kinds of divergence, 4 distinct first differences." in page
    md = render_summary_md(summary, tmp_path)
    assert "| | **2 kinds, one first difference**: `num_scheduled_tokens` at step 4 | | | | |" in md
    # The smallest preemption trace (6 events) is the one shown; the crash shows its message.
    assert (
        '| 1 | `scheduler_output:preempted_req_ids` | 3 | `preempted_req_ids`: expected `["r1"]`, got '
        '`["r0"]` | step 2 of a 6-event trace |' in md
    )
    assert "| 5 | `sut_error` | 1 | schedule() differs | step 1 of a 6-event trace |" in md


def test_long_values_are_cut_where_they_differ_and_never_scroll(tmp_path):
    from schedconf.conformance.runs.report import render_short_pair

    # Two 40-number lists differing in the last one: cut alike, each at most 60 characters, both showing it.
    expected, actual = render_short_pair(list(range(40)), list(range(39)) + [99])
    assert len(expected) <= 60 and len(actual) <= 60
    assert expected.startswith("...") and expected.endswith(", 39]") and actual.endswith(", 99]")
    assert render_short_pair(["r1"], ["r0"]) == ('["r1"]', '["r0"]')  # short values stay whole
    # A summary written with a 600-character value (by hand, or by an older campaign) still shows it cut.
    huge = json.dumps(list(range(150)))
    summary = _base_summary(
        status="fail",
        passed=9,
        failed=1,
        failures=[_failure(1, "scheduler_output:scheduled_new_reqs", 3, "scheduled_new_reqs", huge, "[]")],
    )
    page = render_html(summary, tmp_path)
    assert huge not in page and re.search(r'<code class="expected">\[0, 1, 2, [^<]{0,50}\.\.\.</code>', page)


def test_an_old_summary_without_recorded_differences_still_renders(tmp_path):
    failure = _failure(1, "sut_error", 3, None, None, None)
    for key in (
        "diffs",
        "num_diffs",
        "line",
        "shrunk_diffs",
        "shrunk_num_diffs",
        "shrunk_line",
        "shrunk_step",
        "shrunk_message",
    ):
        failure.pop(key)
    summary = _base_summary(status="fail", passed=9, failed=1, failures=[failure])
    [group] = compute_failure_groups(summary, tmp_path)
    assert group["diffs"] == [] and group["where"] == "a 6-event trace"  # no text report to read the step from
    assert "schedule() differs" in render_html(summary, tmp_path)


@pytest.mark.parametrize("by, words", [("SIGTERM", "by SIGTERM"), ("SIGINT", "by Ctrl-C (SIGINT)")])
def test_an_interrupted_run_says_what_stopped_it(tmp_path, by, words):
    failing = _base_summary(
        status="fail",
        interrupted=True,
        interrupted_by=by,
        passed=4,
        failed=1,
        failures=[_failure(1, "sut_error", 1, None, None, None)],
    )
    stopped = _base_summary(status="interrupted", interrupted=True, interrupted_by=by, examples_run=5, passed=5)
    for summary in (failing, stopped):
        md = render_summary_md(summary, tmp_path)
        page = render_html(summary, tmp_path)
        assert words in md and words in page
        if by == "SIGTERM":
            assert "Ctrl-C" not in md and "Ctrl-C" not in page
