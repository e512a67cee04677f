"""Turn a recording of a live vLLM scheduler into an ordinary schedconf trace.

The recording (``conformance/live/recorder.py`` documents its lines) becomes:

* the header: the recorded config (optional fields left out at their
  defaults), the release profile of the recorded vLLM (``vllm-0.32``, or
  ``vllm-0.32-async`` for its ``AsyncScheduler``), ``origin`` ``live``;
* ``add_request`` per recorded ``add_request`` (the engine's own arrival times);
* ``abort`` per request a ``finish_requests(..., FINISHED_ABORTED)`` call
  actually finished (vLLM ignores ids that are not live; so does the trace);
* ``step`` per ``schedule()``: ``expect`` is what the engine decided,
  ``observe`` its free queue when the recording has it;
* ``model_output`` per ``update_from_output()``: for the step it answers (under
  async scheduling an older one), the sampled tokens, the drafts of the
  ``update_draft_token_ids`` call that followed, and ``expect``: the request
  outputs (and SchedulerStats) the engine returned.

A recording with a gap in its sequence numbers, a line the recorder could not
build, or a torn line before its last one is incomplete: :class:`IncompleteRecording`
(the CLI's exit 2). A torn LAST line is where the engine stopped mid-write: it is
dropped, with a note.

:func:`get_scope_problems` says why a recording is outside the model's scope
(the checker then runs the ``safety`` properties instead of ``strict``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedconf.conformance.bounds import InputFileError, read_bounded_text
from schedconf.conformance.traces.trace import Trace, TraceError, make_header, parse_trace_text, render_trace

RECORDING_FORMAT = "schedconf-recording"
OPTIONAL_DEFAULTS: dict[str, Any] = {
    "max_concurrent_batches": 1,
    "max_num_active_seqs": None,
    "long_prefill_token_threshold_adaptive": False,
    "use_v2_model_runner": False,
}
"""Config fields a trace header leaves out at these values (spec/v1/config.py OPTIONAL_FIELDS)."""
MODELLED_SPEC_METHODS = (None, "ngram")
"""Spec-decode methods whose scheduling the model covers (no lookahead slots)."""


class RecordingError(Exception):
    """A file that is not a readable recording (the CLI's exit 2)."""


class IncompleteRecording(RecordingError):
    """A recording that lost lines: a sequence-number gap, an ``error`` line, a torn line inside it."""


@dataclass
class Recording:
    """A recording read back: its start line, its call lines, and notes on how it was read."""

    path: str
    start: dict[str, Any]
    calls: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    @property
    def vllm_version(self) -> str:
        return str(self.start.get("vllm_version", "?"))

    @property
    def is_async(self) -> bool:
        return self.start.get("scheduler_class", "").endswith("AsyncScheduler")


def read_recording(path: str | Path) -> Recording:
    """Read and check a recording: JSON lines, ``seq`` 0.. without a gap, a ``start`` line first."""
    path = str(path)
    try:
        text = read_bounded_text(path, "recording")  # a device or an endless stream is refused, as for traces
    except InputFileError as exc:
        if exc.expected.startswith("a readable"):
            raise RecordingError(f"{path}: cannot read: {exc.found}") from None
        raise RecordingError(str(exc)) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == len(lines):
                notes.append(f"line {number} is torn (the engine stopped while writing it): dropped")
                break
            raise IncompleteRecording(f"{path}:{number}: not a JSON object: the recording is damaged") from None
        records.append(record)
    if not records:
        raise RecordingError(f"{path}: empty: not a schedconf recording")
    for number, record in enumerate(records, start=1):
        seq = record.get("seq")
        if seq != number - 1:
            raise IncompleteRecording(
                f"{path}:{number}: sequence number {seq!r}, expected {number - 1}: the recording is incomplete "
                f"(calls {number - 1}..{seq - 1 if isinstance(seq, int) else '?'} were lost); it cannot be checked"
            )
        if "error" in record:
            raise IncompleteRecording(
                f"{path}:{number}: the recorder lost call {seq} ({record.get('call')}): "
                f"{record['error']}; the recording is incomplete and cannot be checked"
            )
    start = records[0]
    if start.get("call") != "start" or start.get("format") != RECORDING_FORMAT:
        raise RecordingError(f"{path}:1: expected a {RECORDING_FORMAT} start line; not a schedconf recording")
    if start.get("version") != 1:
        raise RecordingError(f"{path}:1: recording version {start.get('version')!r}; this schedconf reads version 1")
    return Recording(path=path, start=start, calls=records[1:], notes=notes)


def get_profile_name(recording: Recording) -> str:
    """``vllm-MAJOR.MINOR`` of the recorded vLLM, ``-async`` for its AsyncScheduler."""
    major, _, rest = recording.vllm_version.partition(".")
    minor = rest.partition(".")[0]
    return f"vllm-{major}.{minor}" + ("-async" if recording.is_async else "")


def get_header_config(recording: Recording) -> dict[str, Any]:
    """The recorded config with the optional fields at their defaults left out."""
    config = dict(recording.start["config"])
    for name, default in OPTIONAL_DEFAULTS.items():
        if config.get(name, default) == default:
            config.pop(name, None)
    return config


def get_scope_problems(recording: Recording) -> list[str]:
    """Why the model cannot answer for this recording step by step (empty: within scope, check strictly)."""
    from schedconf.conformance.traces.trace import get_known_profiles

    problems: list[str] = []
    profile = get_profile_name(recording)
    if profile not in get_known_profiles():
        problems.append(f"vLLM {recording.vllm_version}: no release profile {profile}")
    engine = recording.start.get("engine", {})
    if (
        engine.get("num_kv_cache_groups", 1) != 1
        or engine.get("kv_cache_spec", "FullAttentionSpec") != "FullAttentionSpec"
    ):
        problems.append(
            f"KV cache of {engine.get('num_kv_cache_groups')} group(s) of {engine.get('kv_cache_spec')} "
            "(the model has one full-attention group)"
        )
    for key, what in (("kv_connector", "a KV connector"), ("ec_connector", "an encoder-cache connector")):
        if engine.get(key):
            problems.append(what)
    if engine.get("data_parallel_size", 1) != 1:
        problems.append(f"data parallel size {engine['data_parallel_size']}")
    config = recording.start.get("config", {})
    if config.get("max_concurrent_batches", 1) > 1 and not recording.is_async:
        problems.append(
            f"{config['max_concurrent_batches']} batches in flight without AsyncScheduler (pipeline parallelism)"
        )
    if engine.get("speculative_method") not in MODELLED_SPEC_METHODS:
        problems.append(f"speculative decoding by {engine.get('speculative_method')} (lookahead slots)")
    for record in recording.calls:
        call = record.get("call")
        if "raised" in record:
            problems.append(f"seq {record['seq']}: {call}() raised {record['raised']}")
        elif call == "add_request" and record.get("unsupported"):
            problems.append(
                f"seq {record['seq']}: request {record['request']['request_id']} uses "
                + ", ".join(record["unsupported"])
            )
        elif call == "finish_requests" and record.get("status") != "FINISHED_ABORTED":
            problems.append(
                f"seq {record['seq']}: finish_requests with {record.get('status')} (only aborts are modelled)"
            )
        elif call == "set_pause_state" and record.get("pause_state") != "UNPAUSED":
            problems.append(f"seq {record['seq']}: the engine paused scheduling ({record.get('pause_state')})")
        elif call == "schedule" and record.get("throttle_prefills"):
            problems.append(f"seq {record['seq']}: schedule() with prefills throttled (data-parallel balancing)")
        elif call == "reset_prefix_cache" and record.get("reset_connector"):
            problems.append(f"seq {record['seq']}: reset_prefix_cache of a KV connector")
    return problems


def recording_to_events(recording: Recording) -> list[dict[str, Any]]:
    """The trace events of a recording (see the module docstring)."""
    events: list[dict[str, Any]] = []
    pending_output: dict[str, Any] | None = None  # the last model_output, until the next schedule()
    for record in recording.calls:
        call = record["call"]
        if "raised" in record:
            break  # the engine core dies with its scheduler: nothing after it is the same engine
        if call == "add_request":
            events.append({"kind": "add_request", **record["request"]})
        elif call == "finish_requests":
            for rid in record.get("finished") or []:
                events.append({"kind": "abort", "request_id": rid})
        elif call == "schedule":
            pending_output = None
            event = {"kind": "step", "step": record["step"], "expect": record["output"]}
            if "observe" in record:
                event["observe"] = record["observe"]
            events.append(event)
        elif call == "update_from_output":
            expect: dict[str, Any] = {"outputs": record.get("outputs", [])}
            if "stats" in record:
                expect["stats"] = record["stats"]
            pending_output = {
                "kind": "model_output",
                "step": record["step"],
                "sampled_token_ids": record["sampled_token_ids"],
                "draft_token_ids": {},
                "expect": expect,
            }
            events.append(pending_output)
        elif call == "update_draft_token_ids" and pending_output is not None:
            pending_output["draft_token_ids"] = dict(sorted(record["draft_token_ids"].items()))
        elif call == "reset_prefix_cache":
            events.append(
                {
                    "kind": "reset_prefix_cache",
                    "reset_running_requests": bool(record.get("reset_running_requests", False)),
                    "expect": {"success": bool(record.get("result"))},
                }
            )
    return events


def recording_to_trace(recording: Recording, comparison: str = "strict") -> Trace:
    """The recording as a trace. Within scope it is validated like any trace file (a TraceError names the line)."""
    extra = {"comparison": comparison} if comparison in ("strict", "observable") else {}
    header = make_header(
        get_header_config(recording),
        get_profile_name(recording),
        seed=0,
        origin="live",
        **extra,
        description=f"recorded from vLLM {recording.vllm_version} "
        f"({recording.start.get('scheduler_class')}, pid {recording.start.get('pid')}): "
        f"{Path(recording.path).name}",
    )
    trace = Trace(header=header, events=recording_to_events(recording), path=recording.path)
    if comparison not in ("strict", "observable"):
        return trace  # safety: the config may be one the model refuses; nothing is replayed on the model
    return parse_trace_text(render_trace(trace), recording.path)


def is_trace_valid(trace: Trace) -> TraceError | None:
    """None if ``trace`` reads back as a valid trace file, else the error."""
    try:
        parse_trace_text(render_trace(trace), trace.path)
    except TraceError as exc:
        return exc
    return None
