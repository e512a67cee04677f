"""Run reports for people: ``summary.md`` and a self-contained ``report.html``.

Both come from one context (:func:`compute_report_context`) and a Jinja2
template each (``conformance/runs/templates/``). The first screen says the verdict
(pass, fail, unknown, harness error, interrupted, or still running / killed;
an interrupted run says whether by Ctrl-C or SIGTERM), then a table of the
failures grouped by kind of divergence (the ``signature``: the divergence
kind and its most telling field): per kind its count, what differed first in
its smallest trace (``field: expected X, got Y``, values cut short where
they differ, never scrolled sideways) and where (``step 2 of a 5-event
trace``). Kinds whose minimal traces first differ at the same step in the
same field are shown together as one cause ("3 kinds, one first
difference"). Below, one section per kind: its smallest trace, the recorded
differing fields, the config fields that matter to it, links to the trace
and its text report, and the exact ``schedconf replay`` command that
reproduces it.

The facts shown come from the summary's failure entries, recorded by the
campaign (:func:`get_failure_facts`: step, trace line, the first differing
fields; ``shrunk_*`` for the minimal trace), not parsed from text.

The HTML has no scripts and loads nothing: tables, and inline SVG for the
smallest trace of each kind: a per-request timeline (state per step, tokens
scheduled) and the KV blocks in use over the steps. Everything that comes
from traces or from the scheduler's output is escaped (autoescape).

A v0 trace (vLLM's legacy scheduler) gets its own timeline, read from the
trace alone (prefill chunks, decodes, swapped out, preempted, ignored), and a
step table (scheduled groups with their chunk sizes, swap and copy pairs,
ignored and finished requests); a v0 run shows its coverage shares (swap-out,
swap-in, recompute, ignored, partial prefills, prefix hits) first.
"""

# Size: every section of report.html and summary.md is rendered from the same run records, with the
# same escaping and bounds; the templates hold the layout.

from __future__ import annotations

import html
import json
import re
import shlex
from dataclasses import fields
from pathlib import Path
from typing import Any
from urllib.parse import quote

from schedconf.conformance.traces.trace import Trace, read_trace, write_atomic

TEMPLATES = Path(__file__).with_name("templates")

STATE_COLORS = {
    "waiting": "#d9d9d9",
    "prefill": "#6baed6",
    "decode": "#74c476",
    "idle": "#c7e9c0",
    "preempted": "#fb6a4a",
    "finished": "#252525",
    "aborted": "#756bb1",
}

V0_STATE_COLORS = {**STATE_COLORS, "swapped": "#fdae6b", "ignored": "#969696"}
"""The v0 timeline's states: v1's, plus swapped out (CPU blocks) and ignored (prompt over the limit)."""


def compute_timeline(trace: Trace) -> tuple[list[str], list[dict[str, tuple[str, int]]], list[int]]:
    """Per step and request: (state, tokens scheduled); and blocks in use per step.

    States: waiting, prefill (a chunk that samples nothing), decode (it
    samples), idle (running but not scheduled), preempted, finished, aborted.
    Blocks in use come from replaying the trace on the reference model.
    """
    from schedconf.conformance.adapters.reference import ReferenceSut
    from schedconf.conformance.sut import SutInputError

    ref = ReferenceSut()
    ref.start(dict(trace.config), trace.profile)
    usable = trace.config["num_gpu_blocks"] - 1
    requests: list[str] = []
    state: dict[str, str] = {}
    rows: list[dict[str, tuple[str, int]]] = []
    used: list[int] = []
    current: dict[str, tuple[str, int]] = {}
    step_rows: dict[int, int] = {}  # step -> its row (an output may answer an older step in flight)
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
                out = ref.schedule(bool(event.get("throttle_prefills")))
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
                step_rows[event["step"]] = len(rows)
                rows.append(current)
            elif kind == "model_output":
                outputs = ref.update_from_output(
                    event["sampled_token_ids"], event["draft_token_ids"], step=event["step"]
                )
                # With steps in flight the output answers an older step: mark its row.
                answered = rows[step_rows[event["step"]]] if event["step"] in step_rows else current
                for rid, toks in event["sampled_token_ids"].items():
                    if toks and rid in answered:
                        answered[rid] = ("decode", answered[rid][1])
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


def compute_v0_timeline(trace: Trace) -> tuple[list[str], list[dict[str, tuple[str, int]]], list[int]]:
    """:func:`compute_timeline` for a v0 trace, from the trace alone.

    States: prefill (a chunk that does not sample), decode (it samples),
    waiting, idle (holds GPU blocks, not scheduled), swapped (holds CPU
    blocks), preempted (lost its GPU blocks while live: recomputed), ignored,
    finished, aborted. Queues come from the steps' observations when the
    trace has them; blocks in use are ``num_gpu_blocks - num_free_gpu_blocks``
    (0 without an observation).
    """
    total = trace.config["num_gpu_blocks"]
    requests: list[str] = []
    state: dict[str, str] = {}
    rows: list[dict[str, tuple[str, int]]] = []
    used: list[int] = []
    for event in trace.events:
        kind = event["kind"]
        if "expect_error" in event:
            continue
        if kind == "add_request":
            rid = event["request_id"]
            if rid not in requests:
                requests.append(rid)
            state[rid] = "waiting"
        elif kind == "abort" and state.get(event["request_id"]) not in (None, "finished", "ignored"):
            state[event["request_id"]] = "aborted"
        elif kind == "step":
            x = event["expect"]
            obs = event.get("observe")
            current: dict[str, tuple[str, int]] = {}
            for group in x["scheduled_seq_groups"]:
                st = "decode" if group["do_sample"] else "prefill"
                current[group["request_id"]] = (st, group["token_chunk_size"])
                state[group["request_id"]] = st
            for rid in x["ignored_seq_groups"]:
                state[rid] = "ignored"
            for rid, s in state.items():
                if rid in current or s in ("finished", "aborted", "ignored"):
                    continue
                if obs is not None:
                    if obs["cpu_block_tables"].get(rid):
                        state[rid] = "swapped"
                    elif obs["block_tables"].get(rid):
                        state[rid] = "idle"
                    elif s in ("decode", "prefill", "idle"):
                        state[rid] = "preempted"
                elif s in ("decode", "prefill"):
                    state[rid] = "idle"
            used.append(total - obs["num_free_gpu_blocks"] if obs is not None else 0)
            rows.append(current)
        elif kind == "model_output":
            for o in event["expect"]["outputs"]:
                if o["finish_reason"] is not None and state.get(o["req_id"]) != "ignored":
                    state[o["req_id"]] = "finished"
        if rows and kind in ("model_output", "abort"):
            row = rows[-1]
            for rid, s in state.items():
                if rid not in row or s in ("finished", "aborted", "ignored"):
                    if s not in ("decode", "prefill"):
                        row[rid] = (s, row.get(rid, (s, 0))[1])
    return requests, rows, used


def compute_v0_step_rows(trace: Trace, limit: int = 60) -> list[dict[str, str]]:
    """One readable row per v0 step (the first ``limit``): what ran, what moved between GPU and CPU, what ended.

    A scheduled group reads ``r1 P4`` (a prompt chunk of 4 tokens that does
    not sample), ``r1 P4*`` (a prompt chunk that samples) or ``r1 D`` (a
    decode), with its GPU block table.
    """
    rows: list[dict[str, str]] = []
    for event in trace.events:
        if event["kind"] != "step":
            continue
        if len(rows) >= limit:
            break
        if "expect_error" in event:
            rows.append(
                {
                    "step": str(event["step"]),
                    "scheduled": f"engine crash: {event['expect_error']}",
                    "swap": "",
                    "other": "",
                }
            )
            continue
        x = event["expect"]
        groups = []
        for g in x["scheduled_seq_groups"]:
            what = f"P{g['token_chunk_size']}{'*' if g['do_sample'] else ''}" if g["is_prompt"] else "D"
            groups.append(f"{g['request_id']} {what} {g['block_table']}")
        swap = []
        if x["blocks_to_swap_out"]:
            swap.append(f"out gpu->cpu {x['blocks_to_swap_out']}")
        if x["blocks_to_swap_in"]:
            swap.append(f"in cpu->gpu {x['blocks_to_swap_in']}")
        if x["blocks_to_copy"]:
            swap.append(f"copy {x['blocks_to_copy']}")
        other = []
        if x["preempted"]:
            other.append(f"preempted {x['preempted']}")
        if x["ignored_seq_groups"]:
            other.append(f"ignored {', '.join(x['ignored_seq_groups'])}")
        if x["finished_requests_ids"]:
            other.append(f"finished {', '.join(x['finished_requests_ids'])}")
        other.append(f"{x['num_batched_tokens']} tokens, running {x['running_queue_size']}")
        if "observe" in event:
            other.append(
                f"free gpu {event['observe']['num_free_gpu_blocks']}, cpu {event['observe']['num_free_cpu_blocks']}"
            )
        rows.append(
            {
                "step": str(event["step"]),
                "scheduled": "; ".join(groups) or "-",
                "swap": "; ".join(swap),
                "other": "; ".join(other),
            }
        )
    return rows


def render_timeline_svg(trace: Trace, title: str = "") -> str:
    """The timeline and block-usage charts of one trace, as inline SVG."""
    v0 = trace.scheduler == "v0"
    colors = V0_STATE_COLORS if v0 else STATE_COLORS
    requests, rows, used = compute_v0_timeline(trace) if v0 else compute_timeline(trace)
    cell_w = max(14, min(40, 900 // max(len(rows), 1)))
    row_h, label_w, top = 18, 90, 20
    width = label_w + cell_w * max(len(rows), 1) + 10
    height = top + row_h * max(len(requests), 1) + 10
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="per-request timeline{": " + html.escape(title) if title else ""}" font-family="monospace" font-size="10">'
    ]
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
            parts.append(
                f'<rect x="{x}" y="{y}" width="{cell_w - 1}" height="{row_h - 2}" fill="{colors[st]}">'
                f"<title>step {j + 1}: {html.escape(rid)} {st}{f' ({n} tokens)' if n else ''}</title></rect>"
            )
            if n and cell_w >= 18:
                color = "#fff" if st in ("finished", "aborted") else "#000"
                parts.append(f'<text x="{x + 2}" y="{y + 12}" fill="{color}">{n}</text>')
    parts.append("</svg>")
    # Block usage over steps.
    usable = trace.config["num_gpu_blocks"] - (0 if v0 else 1)  # v0 has no null block
    ch, cw = 80, cell_w * max(len(used), 1)
    bars = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + cw + 10}" height="{ch + 30}" role="img" '
        f'aria-label="KV blocks in use per step" font-family="monospace" font-size="10">',
        f'<text x="2" y="{ch // 2}">blocks</text><text x="2" y="{ch // 2 + 12}">(of {usable})</text>',
    ]
    for j, u in enumerate(used):
        h = int(ch * u / max(usable, 1))
        bars.append(
            f'<rect x="{label_w + j * cell_w}" y="{10 + ch - h}" width="{cell_w - 1}" height="{h}" fill="#9e9ac8">'
            f"<title>step {j + 1}: {u} of {usable} blocks in use</title></rect>"
        )
    bars.append(f'<line x1="{label_w}" y1="{10 + ch}" x2="{label_w + cw}" y2="{10 + ch}" stroke="#000"/>')
    bars.append("</svg>")
    legend = " ".join(
        f'<span style="background:{c};color:{"#fff" if s in ("finished", "aborted") else "#000"};'
        f'padding:0 4px">{s}</span>'
        for s, c in colors.items()
    )
    return f"<div>{legend}</div>\n" + "\n".join(parts) + "\n" + "\n".join(bars)


# ------------------------------------------------------------ what to show

# Which config sizes govern a kind of divergence: the first entry whose key
# occurs in the signature wins. Feature switches off their default are always
# shown (see compute_relevant_config), so these lists name the sizes.
SECTION_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "preempted",
        "preemption",
        ("num_gpu_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "num_lookahead_tokens"),
    ),
    ("block", "KV block allocation", ("num_gpu_blocks", "block_size", "enable_prefix_caching", "num_lookahead_tokens")),
    ("num_computed_tokens", "prefix hits", ("block_size", "enable_prefix_caching", "num_gpu_blocks")),
    ("spec_decode", "speculative decoding", ("num_spec_tokens", "num_lookahead_tokens", "max_num_batched_tokens")),
    (
        "resumed",
        "resumption after preemption",
        ("num_gpu_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs"),
    ),
    (
        "scheduled",
        "the token budget",
        (
            "max_num_batched_tokens",
            "max_num_seqs",
            "enable_chunked_prefill",
            "long_prefill_token_threshold",
            "num_gpu_blocks",
            "block_size",
        ),
    ),
    ("finished", "stopping", ("max_model_len", "num_spec_tokens")),
    ("outputs", "stopping and sampled tokens", ("max_model_len", "num_spec_tokens")),
    ("error", "input validation", ("max_model_len", "max_num_batched_tokens", "enable_chunked_prefill")),
)

# Switches that turn a feature on or off: shown whenever off their default.
SWITCH_FIELDS = (
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "num_spec_tokens",
    "num_lookahead_tokens",
    "long_prefill_token_threshold",
    "scheduler_reserve_full_isl",
)

CONFIG_RULE = (
    "Config shown: the profile and the policy always; every feature switch that is off its default "
    "(chunked prefill, prefix caching, spec tokens, lookahead, long-prefill threshold, full-ISL "
    "reservation); and the sizes that govern this kind of divergence (for preemption: the pool, "
    "block size, token budget and seats). The full config is the trace's first line."
)

STATUS_TEXT = {
    "pass": ("PASS", "every trace run conforms"),
    "fail": ("FAIL", "the scheduler under test departed from the specification"),
    "unknown": ("UNKNOWN", "the scheduler declared every config unsupported: nothing was checked"),
    "harness_error": ("HARNESS ERROR", "the harness itself failed: the results are incomplete"),
    "interrupted": ("INTERRUPTED", "the run was stopped early: partial results"),
    "running": (
        "RUNNING OR KILLED",
        "this summary was written while the run was going: either it is still "
        "running, or it was killed before it could finish (no final summary). The counts are partial; "
        "schedconf report DIR re-renders this page from the latest summary.json",
    ),
}


RUNNING_PHASES = ("starting", "replaying", "shrinking")
"""The statuses a summary has while its run goes (conformance/runs/campaign.py); shown as RUNNING OR KILLED."""


def get_config_defaults() -> dict[str, Any]:
    """The scheduler config's default value of each field."""
    from schedconf.spec.v1.config import SchedulerConfig

    return {f.name: f.default for f in fields(SchedulerConfig)}


def get_section_rule(signature: str) -> tuple[str, tuple[str, ...]]:
    """What a kind of divergence is about and the config sizes that govern it."""
    if signature.split(":")[0] == "sut_error":
        return "a crash or timeout of the scheduler", tuple(get_config_defaults())
    field = signature.partition(":")[2] or signature
    for key, topic, names in SECTION_FIELDS:
        if key in field:
            return topic, names
    return "", ()


def compute_relevant_config(signature: str, header: dict[str, Any]) -> list[dict[str, Any]]:
    """The config fields that matter to a kind of divergence, each with why it is shown."""
    config = header.get("config") or {}
    if header.get("scheduler") == "v0":  # no defaults to be off of: every v0 field is shown
        return [{"name": "profile", "value": header.get("profile", "?"), "why": "always"}] + [
            {"name": name, "value": json.dumps(value), "why": "v0 config"} for name, value in config.items()
        ]
    defaults = get_config_defaults()
    topic, names = get_section_rule(signature)
    rows = [
        {"name": "profile", "value": header.get("profile", "?"), "why": "always"},
        {"name": "policy", "value": config.get("policy", "?"), "why": "always"},
    ]
    for name in defaults:
        if name == "policy" or name not in config:
            continue
        if name in names:
            why = f"governs {topic}"
        elif name in SWITCH_FIELDS and config[name] != defaults[name]:
            why = f"not the default ({json.dumps(defaults[name])})"
        else:
            continue
        rows.append({"name": name, "value": json.dumps(config[name]), "why": why})
    for name in sorted(set(config) - set(defaults)):
        rows.append({"name": name, "value": json.dumps(config[name]), "why": "not a known config field"})
    return rows


def get_trace_header(path: Path) -> dict[str, Any]:
    """The header (line 1) of a trace file, without reading the rest; {} if unreadable."""
    try:
        with path.open() as f:
            header = json.loads(f.readline())
        return header if isinstance(header, dict) else {}
    except (OSError, ValueError):
        return {}


def render_replay_command(path: Path | str, sut: str, comparison: str) -> str:
    """The shell command that replays one trace against the SUT."""
    return f"schedconf replay {shlex.quote(str(path))} --sut {shlex.quote(sut)} --comparison {shlex.quote(comparison)}"


def get_first_divergence(report_path: Path) -> tuple[int | None, str]:
    """Step and message from the first line of a text divergence report (``...: first divergence at step N: M``)."""
    try:
        with report_path.open() as f:
            first = f.readline()
    except OSError:
        return None, ""
    m = re.search(r"first divergence at step (None|\d+): (.*)$", first.rstrip("\n"))
    if not m:
        return None, ""
    return (None if m.group(1) == "None" else int(m.group(1))), m.group(2)


def get_smallest_trace(failures: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The failure whose trace is smallest: the shortest minimal trace if any was shrunk, else the shortest original."""
    shrunk = [f for f in failures if f.get("shrunk_file")]
    if shrunk:
        return min(shrunk, key=lambda f: (f.get("shrunk_events") or 0, f.get("index", 0))), True
    return min(failures, key=lambda f: (f.get("events") or 0, f.get("index", 0))), False


# ------------------------------------------------------ what differed first

DIFF_LIMIT = 3
"""How many differing fields a failure entry records (the most telling first)."""

VALUE_WIDTH = 60
"""The longest expected or actual value a failure entry records, in characters (longer ones are cut)."""


def render_short_value(value: Any, width: int = VALUE_WIDTH) -> str:
    """A value as compact JSON (a string as it is), cut to ``width`` characters ending in ``...``."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= width else text[: max(width - 3, 1)] + "..."


def render_short_pair(expected: Any, actual: Any, width: int = VALUE_WIDTH) -> tuple[str, str]:
    """Expected and actual as text of at most ``width`` characters each, both showing where they first differ.

    Values that fit are kept whole. Longer ones are cut alike, a quarter of
    ``width`` or a little more before the first character where their texts
    differ, at the start of an item (after a ``, ``, ``[`` or ``{``) when one
    is near (``...`` marks each cut): two long lists that share a prefix
    still show their difference.
    """
    texts = [v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str) for v in (expected, actual)]
    if all(len(t) <= width for t in texts):
        return texts[0], texts[1]
    same = 0
    while same < min(len(t) for t in texts) and texts[0][same] == texts[1][same]:
        same += 1
    target = max(same - width // 4, 0)
    item = max(
        texts[0].rfind(", ", 0, target + 1) + 2,
        texts[0].rfind("[", 0, target + 1) + 1,
        texts[0].rfind("{", 0, target + 1) + 1,
    )
    start = item if same - item <= width // 2 else target
    start = start if start > 3 else 0
    out = []
    for text in texts:
        head = "..." if start else ""
        body = text[start:]
        if len(head) + len(body) > width:
            body = body[: max(width - len(head) - 3, 1)] + "..."
        out.append(head + body)
    return out[0], out[1]


def get_first_diffs(
    divergence: dict[str, Any], limit: int = DIFF_LIMIT, width: int = VALUE_WIDTH
) -> list[dict[str, str]]:
    """The first ``limit`` differing fields of a divergence (``Divergence.to_dict()``), as short text.

    The fields the signature names (its most telling field) come first, then
    the others in the comparator's order; each value is at most ``width``
    characters, cut where expected and actual differ (:func:`render_short_pair`).
    """
    from schedconf.conformance.checking.compare import _generalize

    telling = str(divergence.get("signature") or "").partition(":")[2]
    diffs = sorted(divergence.get("diffs") or [], key=lambda d: _generalize(str(d.get("field", ""))) != telling)
    out = []
    for d in diffs[:limit]:
        expected, actual = render_short_pair(d.get("expected"), d.get("actual"), width)
        out.append({"field": str(d.get("field", "")), "expected": expected, "actual": actual})
    return out


def get_failure_facts(divergence: dict[str, Any] | None) -> dict[str, Any]:
    """What a failure entry records of its first divergence: step, trace line, the first differing fields.

    ``diffs`` holds at most :data:`DIFF_LIMIT` fields (:func:`get_first_diffs`);
    ``num_diffs`` counts them all.
    """
    div = divergence or {}
    return {
        "step": div.get("step"),
        "line": div.get("line"),
        "message": div.get("message", ""),
        "diffs": get_first_diffs(div),
        "num_diffs": len(div.get("diffs") or []),
    }


def render_diff(diff: dict[str, Any]) -> str:
    """One differing field as a line: ``field: expected X, got Y``."""
    return f"{diff['field']}: expected {diff['expected']}, got {diff['actual']}"


def render_where(step: int | None, line: int | None, events: int | None) -> str:
    """Where a trace first differs, with its size: ``step 2 of a 5-event trace``, ``at init, ...``."""
    size = f"a {events if events is not None else '?'}-event trace"
    if step is not None:
        return f"step {step} of {size}"
    if line == 1:
        return f"at init, {size}"
    if line is not None and line > 1:
        return f"event {line - 1} of {size}, before the first step"
    return size


def get_cause_key(signature: str, step: int | None, diffs: list[dict[str, Any]]) -> tuple[Any, ...]:
    """What kinds with one root cause share: the divergence kind, the step and the first differing field.

    The field is generalized (request ids and list positions dropped), so the
    minimal traces of two kinds match whatever their ids. A kind without
    differing fields (a crash, a timeout) is a cause of its own.
    """
    from schedconf.conformance.checking.compare import _generalize

    if not diffs:
        return ("kind", signature)
    return (signature.partition(":")[0], step, _generalize(str(diffs[0]["field"])))


def compute_causes(groups: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Kinds grouped by first difference (:func:`get_cause_key`), most traces first; a cause keeps its kinds' order."""
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for g in groups:
        by_key.setdefault(g["cause_key"], []).append(g)
    order = {key: i for i, key in enumerate(by_key)}
    return sorted(by_key.values(), key=lambda kinds: (-sum(g["count"] for g in kinds), order[kinds[0]["cause_key"]]))


def compute_failure_groups(summary: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """Failures grouped by signature, each with its smallest trace, what differed first there and how to replay it.

    Kinds come grouped by cause (:func:`compute_causes`), the cause with the
    most traces first; ``cause``, ``cause_kinds`` and ``cause_text`` say which.
    """
    spec = summary.get("spec") or {}
    sut, comparison = str(spec.get("sut", "?")), str(spec.get("comparison", "strict"))
    by_sig: dict[str, list[dict[str, Any]]] = {}
    for f in summary.get("failures") or []:
        by_sig.setdefault(str(f.get("signature") or "?"), []).append(f)
    groups = []
    for signature, members in sorted(by_sig.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        best, shrunk = get_smallest_trace(members)
        trace_file = best["shrunk_file"] if shrunk else best.get("trace_file", "")
        report_file = trace_file[: -len(".jsonl")] + ".txt" if trace_file.endswith(".jsonl") else ""
        if not (run_dir / report_file).is_file():
            report_file = best.get("report_file") or ""
        step, message = best.get("step"), best.get("message", "")
        line, diffs = best.get("line"), list(best.get("diffs") or [])
        num_diffs = best.get("num_diffs", len(diffs))
        step_note = ""
        if shrunk:
            if "shrunk_step" in best:  # recorded by the campaign
                min_step, min_message = best.get("shrunk_step"), best.get("shrunk_message", "")
            else:  # a summary from before minimal traces' facts were recorded: read the text report
                min_step, min_message = get_first_divergence(run_dir / report_file)
            line, diffs = best.get("shrunk_line"), list(best.get("shrunk_diffs") or [])
            num_diffs = best.get("shrunk_num_diffs", len(diffs))
            step_note = f"step {step} in the original trace {best.get('trace_file', '')}"
            step, message = min_step, min_message or message  # the minimal trace's step, None if unknown
        if step is not None:
            message = re.sub(rf"^step {step}: ", "", str(message))
        events = best.get("shrunk_events") if shrunk else best.get("events")
        diffs = [
            dict(d, **dict(zip(("expected", "actual"), render_short_pair(d.get("expected"), d.get("actual")))))
            for d in diffs
        ]  # a summary written with longer values still shows them short
        kind, _, field = signature.partition(":")
        topic, _ = get_section_rule(signature)
        header = get_trace_header(run_dir / trace_file)
        groups.append(
            {
                "signature": signature,
                "kind": kind,
                "field": field,
                "topic": topic,
                "count": len(members),
                "indices": sorted(f.get("index", 0) for f in members),
                "members": sorted(members, key=lambda f: f.get("index", 0)),
                "best": best,
                "shrunk": shrunk,
                "trace_file": trace_file,
                "trace_href": quote(trace_file),
                "trace_path": str(run_dir / trace_file),
                "events": events,
                "report_file": report_file,
                "report_href": quote(report_file),
                "original_file": best.get("trace_file", ""),
                "original_events": best.get("events"),
                "step": step,
                "step_note": step_note,
                "message": message,
                "message_short": render_short_value(str(message), 200),
                "line": line,
                "diffs": diffs,
                "more_diffs": max(num_diffs - len(diffs), 0),
                "other_diffs": max(num_diffs - 1, 0),
                "where": render_where(step, line, events),
                "cause_key": get_cause_key(signature, step, diffs),
                "config": compute_relevant_config(signature, header),
                "header_missing": not header,
                "replay": render_replay_command(run_dir / trace_file, sut, comparison),
            }
        )
    ordered = []
    for number, kinds in enumerate(compute_causes(groups), 1):
        for i, g in enumerate(kinds):
            g.update(cause=number, cause_kinds=len(kinds), cause_first=i == 0, cause_text=render_cause(kinds))
            ordered.append(g)
    return ordered


def render_cause(kinds: list[dict[str, Any]]) -> str:
    """``3 kinds, one first difference: FIELD at step N`` (empty for a kind alone)."""
    if len(kinds) < 2:
        return ""
    _, step, field = kinds[0]["cause_key"]
    return f"{len(kinds)} kinds, one first difference: {field}" + (f" at step {step}" if step is not None else "")


def get_interruption_cause(summary: dict[str, Any]) -> str:
    """How an interrupted run was stopped, from ``interrupted_by``: ``by SIGTERM``, ``by Ctrl-C (SIGINT)``, or ""."""
    return {"SIGTERM": "by SIGTERM", "SIGINT": "by Ctrl-C (SIGINT)"}.get(str(summary.get("interrupted_by")), "")


def compute_report_context(summary: dict[str, Any], run_dir: Path | None = None) -> dict[str, Any]:
    """Everything both reports show, computed once (missing fields of a partial summary read as unknown)."""
    run_dir = Path(run_dir if run_dir is not None else summary.get("run_dir", "."))
    spec = summary.get("spec") or {}
    status = str(summary.get("status") or "running")
    if status in RUNNING_PHASES:  # the phase a run was in when this summary was written
        status = "running"
    label, meaning = STATUS_TEXT.get(status, (status.upper(), ""))
    groups = compute_failure_groups(summary, run_dir)
    failed = summary.get("failed", len(summary.get("failures") or []))
    notes = []
    stopper = get_interruption_cause(summary)
    if status == "interrupted" and stopper:
        meaning = f"the run was stopped early {stopper}: partial results"
    if summary.get("interrupted") and status != "interrupted":
        notes.append(f"The run was interrupted{' ' + stopper if stopper else ''}: the results are partial.")
    if status == "fail" and groups:
        causes = len({g["cause"] for g in groups})
        notes.append(
            f"{failed} failing trace{'' if failed == 1 else 's'}, {len(groups)} kind"
            f"{'' if len(groups) == 1 else 's'} of divergence"
            + (f", {causes} distinct first difference{'' if causes == 1 else 's'}." if causes < len(groups) else ".")
        )
    if len(summary.get("failures") or []) < (failed or 0):
        notes.append(f"Only {len(summary.get('failures') or [])} of the {failed} failures are listed.")
    counts = [
        (name, summary.get(key, "?"))
        for name, key in (
            ("passed", "passed"),
            ("failed", "failed"),
            ("unknown", "unknown"),
            ("discarded (reference did not finish)", "discarded"),
            ("run", "examples_run"),
            ("requested", "examples_requested"),
        )
    ]
    facts = [
        ("system under test", spec.get("sut", "?")),
        ("profile", spec.get("profile", "?")),
        ("comparison", spec.get("comparison", "?")),
        ("seed", spec.get("seed", "?")),
        ("generator", spec.get("generator", "?")),
        ("jobs", spec.get("jobs", "?")),
    ]
    if spec.get("config_overrides"):
        facts.append(("config overrides", json.dumps(spec["config_overrides"], sort_keys=True)))
    facts += [
        ("duration", f"{summary['duration_s']} s" if "duration_s" in summary else "?"),
        ("rate", f"{summary['traces_per_s']} traces/s" if summary.get("traces_per_s") else "?"),
        ("steps", summary.get("steps_run", "?")),
        ("run folder", str(run_dir)),
    ]
    shares = summary.get("feature_shares") or {}
    if not shares and summary.get("features") and summary.get("examples_run"):
        shares = {k: v / summary["examples_run"] for k, v in sorted(summary["features"].items())}
    coverage = summary.get("coverage") or {}
    if coverage:
        from schedconf.conformance.workloads.workload_v0 import V0_COVERAGE

        coverage = dict(
            sorted(
                coverage.items(), key=lambda kv: V0_COVERAGE.index(kv[0]) if kv[0] in V0_COVERAGE else len(V0_COVERAGE)
            )
        )  # the order (summary.json sorts its keys)
    return {
        "coverage": [{"name": k, "pct": round(100 * float(v), 1)} for k, v in coverage.items()],
        "run_id": str(summary.get("run_id", run_dir.name)),
        "status": status,
        "label": label,
        "meaning": meaning,
        "notes": notes,
        "counts": counts,
        "facts": facts,
        "command": summary.get("command") or "",
        "harness_error": summary.get("harness_error"),
        "harness_traceback": summary.get("harness_traceback"),
        "groups": groups,
        "failed": failed,
        "shares": [{"name": k, "pct": round(100 * float(v))} for k, v in shares.items()],
        "unknowns": summary.get("unknowns") or [],
        "unknown": summary.get("unknown", 0),
        "config_rule": CONFIG_RULE,
        "sut": spec.get("sut", "?"),
    }


# ---------------------------------------------------------------- rendering


def get_template(name: str) -> Any:
    """A template from conformance/runs/templates/; autoescaped unless it renders Markdown."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=not name.endswith(".md.j2"),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["md_cell"] = render_md_cell
    env.filters["wrap_points"] = render_wrap_points
    env.filters["md_code"] = render_md_code
    return env.get_template(name)


def render_wrap_points(value: Any) -> Any:
    """HTML-escaped text with a line-break opportunity (``<wbr>``) after each ``.``, ``:`` and ``,``.

    Long field paths and signatures then wrap between their parts in a narrow
    table column instead of in the middle of a name.
    """
    from markupsafe import Markup, escape

    return Markup(re.sub(r"([.:,])", r"\1<wbr>", str(escape(value))))


def render_md_cell(value: Any) -> str:
    """A value safe inside one Markdown table cell: one line, pipes escaped."""
    return " ".join(str(value).split()).replace("|", "\\|")


def render_md_code(value: Any) -> str:
    """A value as Markdown inline code, fenced with more backticks than it holds."""
    text = " ".join(str(value).split())
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def render_summary_md(summary: dict[str, Any], run_dir: Path | None = None) -> str:
    """The campaign summary as Markdown, failures grouped by kind of divergence."""
    return get_template("summary.md.j2").render(**compute_report_context(summary, run_dir))


def render_html(summary: dict[str, Any], run_dir: Path, max_traces: int = 5) -> str:
    """The self-contained HTML report (no scripts, no external resources)."""
    from markupsafe import Markup

    context = compute_report_context(summary, run_dir)
    for i, group in enumerate(context["groups"]):
        group["timeline"], group["detail"], group["trace_error"], group["v0_steps"] = None, "", "", []
        if i >= max_traces:
            continue
        report = run_dir / group["report_file"] if group["report_file"] else None
        if report is not None and report.is_file():
            group["detail"] = report.read_text(errors="replace")
        try:
            trace = read_trace(run_dir / group["trace_file"])
            group["timeline"] = Markup(render_timeline_svg(trace, f"trace {group['best'].get('index', '?')}"))
            if trace.scheduler == "v0":
                group["v0_steps"] = compute_v0_step_rows(trace)
        except Exception as exc:  # noqa: BLE001 - a broken file must not lose the rest of the page
            group["trace_error"] = f"cannot read {run_dir / group['trace_file']}: {exc}"
    context["max_traces"] = max_traces
    context["sample"] = None
    sample = run_dir / "sample.jsonl"
    if not context["groups"] and sample.is_file():
        try:
            trace = read_trace(sample)
            context["sample"] = {
                "events": len(trace.events),
                "timeline": Markup(render_timeline_svg(trace, "sample")),
                "v0_steps": compute_v0_step_rows(trace) if trace.scheduler == "v0" else [],
            }
        except Exception:  # noqa: BLE001
            pass
    return get_template("report.html.j2").render(**context)


def write_reports(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write summary.md and report.html next to summary.json."""
    write_atomic(run_dir / "summary.md", render_summary_md(summary, run_dir))
    write_atomic(run_dir / "report.html", render_html(summary, run_dir))


def load_summary(run_dir: Path) -> dict[str, Any]:
    """Read a run folder's summary.json (a regular file within ``schedconf.conformance.bounds.MAX_FILE_BYTES``)."""
    from schedconf.conformance.bounds import read_bounded_text

    return json.loads(read_bounded_text(run_dir / "summary.json", "run summary"))
