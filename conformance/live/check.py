"""Check a recording of a live vLLM scheduler against the model: ``schedconf check RECORDING``.

1. Read the recording (:func:`schedconf.conformance.live.convert.read_recording`): a
   gap in its sequence numbers is refused as incomplete (exit 2).
2. Decide the comparison: ``strict`` when the recorded config, engine and
   requests are within the model's scope (:func:`get_scope_problems` is empty
   and the config is one the model accepts), ``safety`` otherwise, and say why.
3. Convert it to a trace and write it (default: ``RECORDING.trace.jsonl``): an
   ordinary trace, so ``schedconf replay`` and ``schedconf shrink`` work on it.
4. ``strict``: replay it against the reference model with the replay
   machinery: every ``schedule()`` must equal what the engine decided (block
   ids, free queue when recorded), every update the engine's request outputs.
   ``safety``: the engine's own recorded decisions are checked step by step
   against the policy-independent properties of ``conformance/CHECKS.md``
   (``schedconf.conformance.checking.safety``), since the model cannot answer for them.

Exit codes as ``schedconf replay``: 0 pass, 1 the engine diverged (the first
divergence printed, with the command that shrinks it), 2 an unreadable or
incomplete recording, or no verdict.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedconf.conformance.checking.compare import Divergence, FieldDiff
from schedconf.conformance.checking.verdict import FAIL, PASS, UNKNOWN, ReplayResult
from schedconf.conformance.live.convert import (
    Recording,
    get_profile_name,
    get_scope_problems,
    is_trace_valid,
    read_recording,
    recording_to_trace,
)
from schedconf.conformance.traces.trace import Trace, write_trace


@dataclass
class CheckOutcome:
    """What ``schedconf check`` found: the verdict, the comparison and why, the trace written."""

    result: ReplayResult
    comparison: str
    trace: Trace
    trace_path: Path | None
    scope_problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {PASS: 0, FAIL: 1}.get(self.result.verdict, 2)


def choose_comparison(recording: Recording, requested: str | None = None) -> tuple[str, list[str]]:
    """``strict`` within the model's scope, else ``safety``; the reasons it is out of scope."""
    problems = get_scope_problems(recording)
    if not problems:
        error = is_trace_valid(recording_to_trace(recording, "unchecked"))
        if error is not None:
            problems.append(f"the model refuses the recorded config or events: {error}")
    if requested is not None:
        return requested, problems
    return ("safety" if problems else "strict"), problems


def check_recording(
    path: str | Path, out: str | Path | None = None, comparison: str | None = None, step_timeout: float | None = 30.0
) -> CheckOutcome:
    """Read, convert, write and check one recording (see the module docstring)."""
    recording = read_recording(path)
    comparison, problems = choose_comparison(recording, comparison)
    trace = recording_to_trace(recording, comparison)
    trace_path = Path(out) if out else Path(str(path).removesuffix(".jsonl") + ".trace.jsonl")
    trace.path = str(trace_path)
    write_trace(trace_path, trace)
    if comparison == "safety":
        result = check_recorded_safety(trace)
    else:
        from schedconf.conformance.adapters import make_sut
        from schedconf.conformance.checking.replay import replay

        sut = make_sut("reference")
        try:
            result = replay(trace, sut, comparison, step_timeout=step_timeout)
        finally:
            sut.close()
    return CheckOutcome(
        result=result,
        comparison=comparison,
        trace=trace,
        trace_path=trace_path,
        scope_problems=problems,
        notes=list(recording.notes),
    )


# ------------------------------------------------------------------ safety


class _Recorded:
    """Answers ``observe()`` with what the recording observed after the current step (the safety run reads it)."""

    def __init__(self) -> None:
        self.observation: dict[str, Any] | None = None

    def observe(self) -> dict[str, Any] | None:
        return self.observation


def check_recorded_safety(trace: Trace) -> ReplayResult:
    """The safety properties (conformance/CHECKS.md) over the engine's recorded decisions.

    Unlike ``--comparison safety`` on a live scheduler, nothing is driven: each
    recorded ``schedule()`` output is checked as the engine produced it, and
    each recorded update with the tokens the engine sampled and the outputs it
    returned. ``liveness`` is not checked (the engine was stopped when the load
    ended, not when its requests could finish).
    """
    from schedconf.conformance.checking.safety.drive import SafetyRun, Violation

    if trace.is_in_flight:
        return ReplayResult(
            verdict=UNKNOWN,
            detail="unsupported: the safety properties are checked one step at a "
            "time; this recording ran steps in flight and is outside the "
            "model's scope",
        )
    recorded = _Recorded()
    run = SafetyRun(trace, recorded, lambda fn, *args: fn(*args))  # type: ignore[arg-type]
    pending: dict[int, tuple[dict[str, Any], Any]] = {}
    index = 0
    try:
        for index, event in enumerate(trace.events):
            run.used_index = index
            kind = event["kind"]
            if kind == "add_request":
                run.add_record(event)
            elif kind == "abort":
                rid = event["request_id"]
                rec = run.records.get(rid)
                if rec is not None and rec.ended is None:
                    rec.ended = f"aborted at step {run.steps_run}"
                    rec.table = []
                    if any(rid in out["num_scheduled_tokens"] for out, _ in pending.values()):
                        run.in_flight_aborted.add(rid)
            elif kind == "step":
                run.steps_run += 1
                _, writes = run.check_schedule(event["expect"])
                recorded.observation = event.get("observe")
                run.check_observation()
                pending[event["step"]] = (event["expect"], writes)
            elif kind == "model_output":
                output, writes = pending.pop(event["step"])
                run.apply_update(output, event["sampled_token_ids"], event["expect"]["outputs"], writes)
    except Violation as v:
        return ReplayResult(
            verdict=FAIL,
            events_run=index,
            steps_run=run.steps_run,
            extra={"comparison": "safety"},
            divergence=Divergence(
                event_index=index,
                line=trace.line_of(index),
                step=run.steps_run,
                kind="safety",
                diffs=(FieldDiff(v.prop, "holds", v.message),),
                message=f"step {run.steps_run}: {v.prop}: {v.message}",
            ),
        )
    return ReplayResult(
        verdict=PASS, events_run=len(trace.events), steps_run=run.steps_run, extra={"comparison": "safety"}
    )


# --------------------------------------------------------------------- CLI


def render_outcome(outcome: CheckOutcome, recording_path: str) -> str:
    """The lines ``schedconf check`` prints."""
    from schedconf.conformance.checking.replay import render_divergence

    lines = list(f"note: {n}" for n in outcome.notes)
    steps = outcome.trace.num_steps()
    requests = sum(1 for e in outcome.trace.events if e["kind"] == "add_request")
    lines.append(
        f"recording {recording_path}: {requests} requests, {steps} steps, profile {outcome.trace.profile}; "
        f"trace written to {outcome.trace_path}"
    )
    if outcome.scope_problems:
        shown = outcome.scope_problems[:5]
        more = len(outcome.scope_problems) - len(shown)
        lines.append(
            f"comparison {outcome.comparison}: outside the model's scope: "
            + "; ".join(shown)
            + (f" (and {more} more)" if more > 0 else "")
        )
    else:
        lines.append(f"comparison {outcome.comparison}: the config and every request are within the model's scope")
    r = outcome.result
    if r.verdict == PASS:
        lines.append(f"PASS ({r.steps_run} steps, {outcome.comparison})")
    elif r.verdict == FAIL:
        lines.append(f"FAIL {render_divergence(outcome.trace, r)}")
        release = outcome.trace.profile.removeprefix("vllm-").removesuffix("-async")
        lines.append(
            f"shrink it (vLLM's scheduler on the engine's recorded tokens, env built by `schedconf env vllm "
            f"{release}.0` or your release): schedconf shrink {outcome.trace_path} --sut "
            f"vllm-v1@{release}.0 --comparison {outcome.comparison}"
        )
    else:
        lines.append(f"UNKNOWN: {r.detail}")
    return "\n".join(lines)


def run_check(args: Any) -> int:
    """Carry out parsed ``schedconf check`` arguments; return the exit status."""
    from schedconf.conformance.live.convert import RecordingError

    worst = 0
    for path in args.recordings:
        try:
            outcome = check_recording(
                path,
                out=args.out if len(args.recordings) == 1 else None,
                comparison=args.comparison,
                step_timeout=args.timeout,
            )
        except RecordingError as exc:
            print(f"error: {exc}", file=sys.stderr)
            worst = max(worst, 2) if worst != 1 else 1
            continue
        print(render_outcome(outcome, str(path)))
        code = outcome.exit_code
        worst = 1 if 1 in (worst, code) else max(worst, code)
    return worst


__all__ = [
    "CheckOutcome",
    "check_recorded_safety",
    "check_recording",
    "choose_comparison",
    "get_profile_name",
    "render_outcome",
    "run_check",
]
