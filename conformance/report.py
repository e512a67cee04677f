"""Run reports for people: ``summary.md`` and a self-contained ``report.html``.

The HTML has no scripts and loads nothing: tables, and inline SVG for each
shown trace: a per-request timeline (state per step, tokens scheduled) and
the KV blocks in use over the steps.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from conformance.trace import Trace, read_trace, write_atomic

STATE_COLORS = {
    "waiting": "#d9d9d9",
    "prefill": "#6baed6",
    "decode": "#74c476",
    "idle": "#c7e9c0",
    "preempted": "#fb6a4a",
    "finished": "#252525",
    "aborted": "#756bb1",
}


def compute_timeline(trace: Trace) -> tuple[list[str], list[dict[str, tuple[str, int]]], list[int]]:
    """Per step and request: (state, tokens scheduled); and blocks in use per step.

    States: waiting, prefill (a chunk that samples nothing), decode (it
    samples), idle (running but not scheduled), preempted, finished, aborted.
    Blocks in use come from replaying the trace on the reference model.
    """
    from conformance.adapters.reference import ReferenceSut
    from conformance.sut import SutInputError

    ref = ReferenceSut()
    ref.start(dict(trace.config), trace.profile)
    usable = trace.config["num_gpu_blocks"] - 1
    requests: list[str] = []
    state: dict[str, str] = {}
    rows: list[dict[str, tuple[str, int]]] = []
    used: list[int] = []
    current: dict[str, tuple[str, int]] = {}
    for event in trace.events:
        kind = event["kind"]
        try:
            if kind == "add_request":
                ref.add_request(event)
                if "expect_error" not in event:
                    rid = event["request_id"]
                    if rid not in requests:
                        requests.append(rid)
                    state[rid] = "waiting"
            elif kind == "abort":
                ref.abort(event["request_id"])
                if "expect_error" not in event and state.get(event["request_id"]) not in ("finished", None):
                    state[event["request_id"]] = "aborted"
            elif kind == "step":
                out = ref.schedule()
                obs = ref.observe() or {}
                used.append(usable - obs.get("num_free_blocks", usable))
                expect = event.get("expect", out)
                current = {}
                for rid in expect["preempted_req_ids"] or ():
                    state[rid] = "preempted"
                for rid, s in state.items():
                    if s in ("decode", "prefill"):
                        state[rid] = "idle"
                for rid, n in expect["num_scheduled_tokens"].items():
                    current[rid] = ("prefill", n)
                    state[rid] = "prefill"
                rows.append(current)
            elif kind == "model_output":
                outputs = ref.update_from_output(event["sampled_token_ids"], event["draft_token_ids"])
                for rid, toks in event["sampled_token_ids"].items():
                    if toks and rid in current:
                        current[rid] = ("decode", current[rid][1])
                        state[rid] = "decode"
                for o in event.get("expect", {"outputs": outputs})["outputs"]:
                    if o["finish_reason"] is not None:
                        state[o["req_id"]] = "finished"
        except SutInputError:
            pass
        if rows and kind in ("model_output", "abort"):
            row = rows[-1]
            for rid, s in state.items():
                if rid not in row or s in ("finished", "aborted", "preempted"):
                    if s in ("finished", "aborted", "preempted", "waiting", "idle"):
                        row[rid] = (s, row.get(rid, (s, 0))[1])
    return requests, rows, used


def render_timeline_svg(trace: Trace, title: str = "") -> str:
    """The timeline and block-usage charts of one trace, as inline SVG."""
    requests, rows, used = compute_timeline(trace)
    cell_w = max(14, min(40, 900 // max(len(rows), 1)))
    row_h, label_w, top = 18, 90, 20
    width = label_w + cell_w * max(len(rows), 1) + 10
    height = top + row_h * max(len(requests), 1) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="per-request timeline{": " + html.escape(title) if title else ""}" font-family="monospace" font-size="10">']
    for j in range(len(rows)):
        if j % max(1, 40 // cell_w) == 0:
            parts.append(f'<text x="{label_w + j * cell_w + 2}" y="12">{j + 1}</text>')
    for i, rid in enumerate(requests):
        y = top + i * row_h
        parts.append(f'<text x="2" y="{y + 13}">{html.escape(rid[:12])}</text>')
        for j, row in enumerate(rows):
            if rid not in row:
                continue
            st, n = row[rid]
            x = label_w + j * cell_w
            parts.append(f'<rect x="{x}" y="{y}" width="{cell_w - 1}" height="{row_h - 2}" fill="{STATE_COLORS[st]}">'
                         f'<title>step {j + 1}: {rid} {st}{f" ({n} tokens)" if n else ""}</title></rect>')
            if n and cell_w >= 18:
                color = "#fff" if st in ("finished", "aborted") else "#000"
                parts.append(f'<text x="{x + 2}" y="{y + 12}" fill="{color}">{n}</text>')
    parts.append("</svg>")
    # Block usage over steps.
    usable = trace.config["num_gpu_blocks"] - 1
    ch, cw = 80, cell_w * max(len(used), 1)
    bars = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + cw + 10}" height="{ch + 30}" role="img" '
            f'aria-label="KV blocks in use per step" font-family="monospace" font-size="10">',
            f'<text x="2" y="{ch // 2}">blocks</text><text x="2" y="{ch // 2 + 12}">(of {usable})</text>']
    for j, u in enumerate(used):
        h = int(ch * u / max(usable, 1))
        bars.append(f'<rect x="{label_w + j * cell_w}" y="{10 + ch - h}" width="{cell_w - 1}" height="{h}" fill="#9e9ac8">'
                    f'<title>step {j + 1}: {u} of {usable} blocks in use</title></rect>')
    bars.append(f'<line x1="{label_w}" y1="{10 + ch}" x2="{label_w + cw}" y2="{10 + ch}" stroke="#000"/>')
    bars.append("</svg>")
    legend = " ".join(f'<span style="background:{c};color:{"#fff" if s in ("finished", "aborted") else "#000"};'
                      f'padding:0 4px">{s}</span>' for s, c in STATE_COLORS.items())
    return f"<div>{legend}</div>\n" + "\n".join(parts) + "\n" + "\n".join(bars)


def render_summary_md(summary: dict[str, Any]) -> str:
    """The campaign summary as Markdown."""
    spec = summary["spec"]
    lines = [
        f"# schedconf run {summary['run_id']}",
        "",
        f"**{summary['status'].upper()}**: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['unknown']} unknown, {summary['discarded']} discarded (reference did not finish) "
        f"of {summary['examples_run']} traces run ({summary['examples_requested']} requested)"
        + (" — INTERRUPTED, partial results" if summary["interrupted"] else ""),
        "",
        f"- system under test: `{spec['sut']}`; profile `{spec['profile']}`; comparison `{spec['comparison']}`",
        f"- seed {spec['seed']}, generator `{spec['generator']}`, jobs {spec['jobs']}",
        f"- duration {summary.get('duration_s', '?')} s; {summary.get('traces_per_s', '?')} traces/s; "
        f"{summary.get('steps_run', '?')} steps",
        f"- reproduce: `{summary.get('command', '')}`",
        "",
    ]
    if summary.get("harness_error"):
        lines += ["## Harness error", "", "```", summary["harness_error"], "```", ""]
    shares = summary.get("feature_shares", {})
    if shares:
        lines += ["## What the traces reached", "", "| case | share of traces |", "|---|---|"]
        lines += [f"| {k} | {100 * v:.0f}% |" for k, v in shares.items()]
        lines.append("")
    if summary["failures"]:
        lines += ["## Failures", "", "| trace | first divergence | step | events | minimal trace | events |",
                  "|---|---|---|---|---|---|"]
        for f in summary["failures"][:200]:
            lines.append(f"| `{f['trace_file']}` | {f['signature']} | {f['step']} | {f['events']} | "
                         f"{'`' + f['shrunk_file'] + '`' if f['shrunk_file'] else '-'} | {f['shrunk_events'] or '-'} |")
        if len(summary["failures"]) > 200:
            lines.append(f"| ... {len(summary['failures']) - 200} more | | | | | |")
        lines += ["", "Replay one: `schedconf replay <trace> --sut " + spec["sut"] + "`", ""]
    if summary.get("unknowns"):
        lines += ["## Unknown verdicts (the scheduler declared the config unsupported)", ""]
        lines += [f"- trace {u['index']}: {u['reason']}" for u in summary["unknowns"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def render_html(summary: dict[str, Any], run_dir: Path, max_traces: int = 5) -> str:
    """The self-contained HTML report."""
    body = [f"<h1>schedconf run {html.escape(summary['run_id'])}</h1>",
            f"<pre>{html.escape(render_summary_md(summary))}</pre>"]
    shown = 0
    for f in summary["failures"]:
        if shown >= max_traces:
            break
        path = run_dir / (f["shrunk_file"] or f["trace_file"])
        try:
            trace = read_trace(path)
        except Exception as exc:  # noqa: BLE001
            body.append(f"<p>cannot read {html.escape(str(path))}: {html.escape(str(exc))}</p>")
            continue
        report_path = run_dir / (f["shrunk_file"] or f["trace_file"]).replace(".jsonl", ".txt")
        detail = report_path.read_text() if report_path.exists() else f["message"]
        body.append(f"<h2>Failure: trace {f['index']} — {html.escape(f['signature'])}</h2>")
        body.append(f"<p>{'minimal' if f['shrunk_file'] else 'original'} trace "
                    f"<code>{html.escape(str(path.name))}</code>, {len(trace.events)} events</p>")
        body.append(f"<pre>{html.escape(detail)}</pre>")
        body.append(render_timeline_svg(trace, f"trace {f['index']}"))
        shown += 1
    sample = run_dir / "sample.jsonl"
    if not summary["failures"] and sample.exists():
        trace = read_trace(sample)
        body.append(f"<h2>A sample trace ({len(trace.events)} events)</h2>")
        body.append(render_timeline_svg(trace, "sample"))
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}pre{background:#f6f6f6;padding:8px;"
             "overflow-x:auto}svg{display:block;margin:6px 0}")
    return (f"<!doctype html>\n<html><head><meta charset='utf-8'><title>schedconf {html.escape(summary['run_id'])}"
            f"</title><style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_reports(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write summary.md and report.html next to summary.json."""
    write_atomic(run_dir / "summary.md", render_summary_md(summary))
    write_atomic(run_dir / "report.html", render_html(summary, run_dir))


def load_summary(run_dir: Path) -> dict[str, Any]:
    """Read a run folder's summary.json."""
    return json.loads((run_dir / "summary.json").read_text())
