"""JUnit XML for CI systems: one test case per trace, failures name their trace file."""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape, quoteattr

from schedconf.conformance.runs.report import render_diff
from schedconf.conformance.traces.trace import write_atomic


def render_junit(summary: dict[str, Any], outcomes: list[Any]) -> str:
    """A <testsuite> with one <testcase> per trace run.

    A failure's message names the trace to look at (the minimal one when
    shrunk), its step, the kind of divergence and what differed first there.
    """
    spec = summary["spec"]
    failures = {f["index"]: f for f in summary["failures"]}
    run_dir = summary["run_dir"]
    cases = []
    for o in sorted(outcomes, key=lambda o: o.index):
        name = f"trace-{o.index:05d}"
        head = f"<testcase classname={quoteattr('schedconf.' + spec['sut'])} name={quoteattr(name)}"
        if o.index in failures:
            f = failures[o.index]
            where = f"{run_dir}/{f['shrunk_file'] or f['trace_file']}"
            minimal = bool(f["shrunk_file"]) and "shrunk_step" in f  # the minimal trace's facts were recorded
            step = f["shrunk_step"] if minimal else f["step"]
            diffs = f.get("shrunk_diffs" if minimal else "diffs") or []
            msg = f"{where}: step {step}: {f['signature']}" + (f": {render_diff(diffs[0])}" if diffs else "")
            text = (
                f"failing trace: {run_dir}/{f['trace_file']}\nminimal trace: "
                f"{run_dir + '/' + f['shrunk_file'] if f['shrunk_file'] else '-'}\n\n{o.report}"
            )
            cases.append(
                f'{head}><failure message={quoteattr(msg)} type="divergence">{escape(text)}</failure></testcase>'
            )
        elif o.verdict == "unknown":
            cases.append(f"{head}><skipped message={quoteattr('verdict unknown: ' + o.report)}/></testcase>")
        elif o.verdict == "discarded":
            cases.append(f'{head}><skipped message="the reference did not finish this workload"/></testcase>')
        else:
            cases.append(f"{head}/>")
    skipped = summary["unknown"] + summary["discarded"]
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        f'<testsuite name={quoteattr("schedconf " + spec["sut"])} tests="{len(outcomes)}" '
        f'failures="{summary["failed"]}" errors="0" skipped="{skipped}" time="{summary.get("duration_s", 0)}">\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )


def write_junit(path: str, summary: dict[str, Any], outcomes: list[Any]) -> None:
    write_atomic(path, render_junit(summary, outcomes))
