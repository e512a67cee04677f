"""Replay a trace against a scheduler under test and find the first divergence.

Each input event goes to the SUT; each ``step`` compares ``schedule()`` with the
expected SchedulerOutput (and, under ``strict``, the free queue when both sides
observe it); each ``model_output`` compares the request outputs. The first
difference stops the replay and becomes the verdict ``fail``; a SUT that
declares a configuration unsupported gives ``unknown``.

Timeouts: every call gets ``step_timeout`` seconds. A SUT that enforces its
own timeouts (``enforces_timeouts``, the stdio adapter) is given the
timeout and the deadline; for an in-process SUT an alarm interrupts the
call (main thread only). A call that runs out of time is a failure of kind
``sut_timeout``; when the caller's ``deadline`` (a shrink budget) passes
instead, :class:`ReplayDeadline` is raised: no verdict, the caller stops.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from schedconf.conformance.bounds import render_truncated_lines
from schedconf.conformance.checking.compare import Comparator, Divergence, FieldDiff
from schedconf.conformance.checking.verdict import FAIL, PASS, UNKNOWN, ReplayResult
from schedconf.conformance.sut import SchedulerUnderTest, SutInputError, SutUnsupported, call_schedule
from schedconf.conformance.traces.trace import Trace


class StepTimeout(Exception):
    """A call into an in-process SUT took longer than the per-step timeout."""

    kind = "sut_timeout"


class ReplayDeadline(Exception):
    """The caller's deadline passed during a replay: the replay has no verdict."""


@contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise StepTimeout in the main thread after ``seconds`` (no-op elsewhere)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):  # noqa: ANN001, ARG001
        raise StepTimeout(f"no answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _failure_of(exc: BaseException) -> tuple[str, str]:
    """The divergence kind and message of a SUT that raised ``exc``.

    The adapters' errors carry their kind (``sut_timeout``, ``sut_exited``,
    ``protocol_error``, ``sut_error``) and a message that says what happened,
    without the stderr tail, which the report shows on its own; an exception
    of the scheduler's own is a ``sut_error`` named by its type
    (``KeyError: 'r1'``).
    """
    kind = getattr(exc, "kind", "sut_error")
    message = getattr(exc, "plain_message", None)
    if message is None:
        message = f"{type(exc).__name__}: {exc}" if kind == "sut_error" else str(exc)
    return kind, message


def replay(
    trace: Trace,
    sut: SchedulerUnderTest,
    comparison: str = "strict",
    step_timeout: float | None = None,
    start: bool = True,
    deadline: float | None = None,
    while_running: Callable[[], None] | None = None,
) -> ReplayResult:
    """Run every event of ``trace`` on ``sut``; stop at the first divergence.

    ``deadline`` (a ``time.monotonic()`` value) bounds the whole replay:
    past it, :class:`ReplayDeadline` is raised. ``while_running`` is the caller's
    own work, done while a scheduler that takes the trace as one ``batch`` runs it
    (called once, right after the batch is sent; not at all otherwise). It must
    not raise, except to stop everything.
    """
    enforced = bool(getattr(sut, "enforces_timeouts", False))
    if enforced:
        if step_timeout:
            sut.timeout_s = step_timeout  # type: ignore[attr-defined]
        sut.deadline = deadline  # type: ignore[attr-defined]
    try:
        return _replay(trace, sut, comparison, step_timeout, start, deadline, enforced, while_running)
    finally:
        if enforced:
            sut.deadline = None  # type: ignore[attr-defined]


def _alarm_s(seconds: float | None, deadline: float | None) -> float | None:
    """Seconds until the alarm for an in-process call: the timeout or the deadline, whichever is first."""
    if deadline is None:
        return seconds
    left = max(deadline - time.monotonic(), 0.001)
    return min(seconds, left) if seconds else left


def _replay(
    trace: Trace,
    sut: SchedulerUnderTest,
    comparison: str,
    step_timeout: float | None,
    start: bool,
    deadline: float | None,
    enforced: bool,
    while_running: Callable[[], None] | None = None,
) -> ReplayResult:
    comparator = Comparator(comparison) if comparison != "safety" else None
    events = trace.events
    step: int | None = None
    steps_run = 0

    def fail(
        index: int, kind: str, diffs: list[FieldDiff] | tuple[FieldDiff, ...] = (), message: str = "", detail: str = ""
    ) -> ReplayResult:
        return ReplayResult(
            verdict=FAIL,
            divergence=Divergence(
                event_index=index, line=trace.line_of(index), step=step, kind=kind, diffs=tuple(diffs), message=message
            ),
            events_run=index,
            steps_run=steps_run,
            detail=detail,
            sut_stderr=_stderr_of(sut),
        )

    def past_deadline() -> bool:
        return deadline is not None and time.monotonic() >= deadline - 0.01

    def raised(index: int, what: str, exc: BaseException) -> ReplayResult:
        kind, message = _failure_of(exc)
        if kind == "sut_timeout" and past_deadline():
            raise ReplayDeadline(f"deadline passed during {what}") from None
        own = kind == "sut_error" and not hasattr(exc, "plain_message")  # else the adapter's stderr tail tells
        detail = traceback.format_exc() if own else ""
        return fail(index, kind, message=f"{what}: {message}", detail=detail)

    refused_config = trace.header.get("expect_error")

    def config_verdict(code: str | None, message: str) -> ReplayResult:
        """The verdict of ``start`` on a trace whose header expects (or not) a refused config."""
        if code == refused_config:
            return ReplayResult(verdict=PASS)
        return ReplayResult(
            verdict=FAIL,
            sut_stderr=_stderr_of(sut),
            divergence=Divergence(
                event_index=0,
                line=1,
                step=None,
                kind="input_error",
                diffs=(FieldDiff("error", refused_config, code),),
                message=message,
            ),
        )

    try:
        if start:
            # an in-process scheduler may import heavy modules on its first start
            with _deadline(None if enforced else _alarm_s(step_timeout and max(step_timeout, 120.0), deadline)):
                sut.start(dict(trace.config), trace.profile)
    except SutUnsupported as exc:
        return ReplayResult(verdict=UNKNOWN, detail=f"unsupported: {exc}")
    except SutInputError as exc:
        if trace.is_in_flight and not getattr(sut, "in_flight", False) and not refused_config:
            # A scheduler that does not run steps in flight may not know max_concurrent_batches at all.
            return ReplayResult(
                verdict=UNKNOWN,
                detail=f"unsupported: the trace runs steps in flight and the scheduler refused its config ({exc})",
            )
        expected = f"expected error {refused_config}" if refused_config else "a valid config"
        return config_verdict(exc.code, f"init: {expected}, the scheduler refused the config with {exc}")
    except Exception as exc:  # noqa: BLE001
        failed = raised(0, "start", exc)
        if failed.divergence is not None:  # init answers for the header (line 1), not for the first event
            failed.divergence = dataclasses.replace(failed.divergence, line=1)
        return failed
    if refused_config:
        return config_verdict(None, f"init: expected error {refused_config}, the scheduler accepted the config")
    in_flight = bool(getattr(sut, "in_flight", False))
    if comparison == "safety" and trace.is_in_flight:
        return ReplayResult(
            verdict=UNKNOWN,
            detail="unsupported: the safety comparison drives the scheduler one "
            "step at a time; replay a trace with steps in flight with "
            "--comparison strict or observable",
        )
    if trace.is_in_flight and not in_flight:
        return ReplayResult(
            verdict=UNKNOWN,
            detail="unsupported: the trace runs steps in flight (max_concurrent_batches "
            "> 1 or an -async profile) and the scheduler does not declare "
            "in_flight support",
        )
    if comparison == "safety" and trace.scheduler == "v0":
        return ReplayResult(
            verdict=UNKNOWN,
            detail="unsupported: the safety comparison checks v1 schedulers; "
            "replay a v0 trace with --comparison strict or observable",
        )
    if comparison == "safety":
        from schedconf.conformance.checking.safety.drive import run_safety

        def timed_call(fn: Any, *args: Any) -> Any:
            with _deadline(None if enforced else _alarm_s(step_timeout, deadline)):
                return fn(*args)

        return run_safety(trace, sut, timed_call, raised)
    assert comparator is not None

    def call(kind: str, event: dict[str, Any]) -> Any:
        if kind == "add_request":
            return sut.add_request(event)
        if kind == "abort":
            return sut.abort(event["request_id"])
        if kind == "step":
            return call_schedule(sut, bool(event.get("throttle_prefills")))
        if kind == "reset_prefix_cache":
            reset = getattr(sut, "reset_prefix_cache", None)
            if reset is None:
                raise SutUnsupported("the scheduler has no reset_prefix_cache")
            return {"success": reset(event["reset_running_requests"])}
        if in_flight:
            # A scheduler that declares in_flight takes the step whose output it applies (adapters/impl.py).
            update_in_flight: Callable[..., Any] = sut.update_from_output
            return update_in_flight(event["sampled_token_ids"], event["draft_token_ids"], step=event["step"])
        return sut.update_from_output(event["sampled_token_ids"], event["draft_token_ids"])

    def observes(step_event: dict[str, Any]) -> bool:
        """Is the free queue observed after this step (when its output matched)?"""
        return comparison == "strict" and "observe" in step_event

    def run_events() -> ReplayResult:
        """Call, compare, stop at the first divergence."""
        nonlocal step, steps_run
        assert comparator is not None
        for index, event in enumerate(trace.events):
            kind = event["kind"]
            expect_error = event.get("expect_error")
            if kind == "step":
                step = event["step"]
            try:
                with _deadline(None if enforced else _alarm_s(step_timeout, deadline)):
                    actual: Any = call(kind, event)
                if kind == "step":
                    steps_run += 1
            except SutInputError as exc:
                if expect_error == exc.code:
                    continue
                return fail(
                    index,
                    "input_error",
                    [FieldDiff("error", expect_error, exc.code)],
                    message=f"{kind}: {'expected error ' + expect_error if expect_error else 'no error expected'}, got {exc}",
                )
            except SutUnsupported as exc:
                return ReplayResult(
                    verdict=UNKNOWN, events_run=index, steps_run=steps_run, detail=f"unsupported: {exc}"
                )
            except Exception as exc:  # noqa: BLE001 - the SUT's failure is a recorded result
                return raised(index, kind, exc)
            if expect_error is not None:
                return fail(
                    index,
                    "input_error",
                    [FieldDiff("error", expect_error, None)],
                    message=f"{kind}: expected error {expect_error}, the scheduler accepted it",
                )
            if kind == "step":
                diffs = comparator.compare_scheduler_output(event["expect"], actual)
                if diffs:
                    return fail(index, "scheduler_output", diffs, message=f"step {step}: schedule() differs")
                if observes(event):
                    try:
                        with _deadline(None if enforced else _alarm_s(step_timeout, deadline)):
                            observed = sut.observe()
                    except Exception as exc:  # noqa: BLE001
                        return raised(index, "observe", exc)
                    diffs = comparator.compare_observation(event["observe"], observed)
                    if diffs:
                        return fail(index, "observation", diffs, message=f"step {step}: the free queue differs")
            elif kind == "reset_prefix_cache":
                if actual != event["expect"]:
                    return fail(
                        index,
                        "reset_prefix_cache",
                        [FieldDiff("success", event["expect"]["success"], actual["success"])],
                        message="reset_prefix_cache() differs",
                    )
            elif kind == "model_output":
                diffs = comparator.compare_request_outputs(event["expect"]["outputs"], actual)
                if diffs:
                    return fail(index, "request_outputs", diffs, message=f"step {step}: update_from_output() differs")
                expected_stats = event["expect"].get("stats")
                get_stats = getattr(sut, "get_scheduler_stats", None)
                if trace.config.get("log_stats") is False and comparison == "strict" and get_stats is not None:
                    # Without log_stats an update reports no SchedulerStats at all.
                    reported = get_stats()
                    if reported is not None:
                        return fail(
                            index,
                            "scheduler_stats",
                            [FieldDiff("stats", None, reported)],
                            message=f"step {event['step']}: stats reported with log_stats off",
                        )
                if expected_stats is not None and comparison == "strict" and get_stats is not None:
                    actual_stats = get_stats()
                    if actual_stats is not None and actual_stats != expected_stats:
                        return fail(
                            index,
                            "scheduler_stats",
                            compare_stats(expected_stats, actual_stats),
                            message=f"step {event['step']}: the scheduler stats after update_from_output() differ",
                        )
        return ReplayResult(verdict=PASS, events_run=len(events), steps_run=steps_run, sut_stderr=_stderr_of(sut))

    plan_batch = getattr(sut, "plan_batch", None)
    if plan_batch is not None and getattr(sut, "supports_batch", False):
        # The whole trace in one request (PROTOCOL.md, "batch"), planned by the very calls below.
        with sut.planning() as planned:  # type: ignore[attr-defined]
            for event in events:
                try:
                    call(event["kind"], event)
                    # A step that is refused as expected is not observed (the replay goes on at once).
                    if event["kind"] == "step" and "expect_error" not in event and observes(event):
                        sut.observe()
                except SutUnsupported:
                    break  # the replay stops there too
        plan_batch(planned, while_running)
        try:
            result = run_events()
        except BaseException:
            # Interrupted (SIGTERM, Ctrl-C, the caller's deadline): the scheduler may still be running the
            # batch, so it is stopped, not waited for; the next trace starts a fresh process.
            sut.kill()  # type: ignore[attr-defined]
            raise
        sut.end_batch()  # type: ignore[attr-defined]
        return result
    return run_events()


def compare_stats(expected: Any, actual: Any, prefix: str = "stats") -> list[FieldDiff]:
    """The differing leaves of two stats dicts, by dotted path."""
    if not isinstance(actual, dict) or not isinstance(expected, dict):
        return [FieldDiff(prefix, expected, actual)] if expected != actual else []
    diffs: list[FieldDiff] = []
    for key in sorted(set(expected) | set(actual)):
        if expected.get(key) != actual.get(key):
            diffs += compare_stats(expected.get(key), actual.get(key), f"{prefix}.{key}")
    return diffs


def _stderr_of(sut: SchedulerUnderTest) -> str:
    tail = getattr(sut, "stderr_tail", None)
    return tail() if callable(tail) else ""


def render_reference_state(trace: Trace, event_index: int) -> str:
    """The reference model's queues and blocks just before event ``event_index``."""
    from schedconf.conformance.adapters.reference import ReferenceSut
    from schedconf.spec.v1.render import render_blocks, render_queues

    ref = ReferenceSut()
    ref.start(dict(trace.config), trace.profile)
    for event in trace.events[:event_index]:
        try:
            if event["kind"] == "add_request":
                ref.add_request(event)
            elif event["kind"] == "abort":
                ref.abort(event["request_id"])
            elif event["kind"] == "step":
                ref.schedule(bool(event.get("throttle_prefills")))
            elif event["kind"] == "reset_prefix_cache":
                ref.reset_prefix_cache(event["reset_running_requests"])
            elif ref.is_v0():
                ref.update_from_output(event["sampled_token_ids"], event["draft_token_ids"])
            else:
                ref.update_from_output(event["sampled_token_ids"], event["draft_token_ids"], step=event["step"])
        except SutInputError:
            continue
    assert ref.scheduler is not None
    if ref.is_v0():
        return render_v0_state(ref.scheduler)
    obs = ref.scheduler.observe()
    return render_queues(obs) + "\n" + render_blocks(obs)


def render_v0_state(sched: Any) -> str:
    """The v0 model's queues (in order, with each group's progress) and its GPU and CPU blocks."""
    queues = sched.get_queues()
    obs = sched.observe()
    lines = []
    for name in ("waiting", "running", "swapped"):
        parts = []
        for rid in queues[name]:
            g = queues["groups"][rid]
            parts.append(f"{rid}({g['stage'].lower()} {g['num_computed_tokens']}/{g['len']}, {g['outputs']} out)")
        lines.append(f"{name}: {' '.join(parts) or '-'}")
    lines.append(f"free blocks: gpu {obs['num_free_gpu_blocks']}, cpu {obs['num_free_cpu_blocks']}")
    tables = [f"{rid}={blocks}" for rid, blocks in obs["block_tables"].items()]
    tables += [f"{rid}=cpu{blocks}" for rid, blocks in obs["cpu_block_tables"].items()]
    lines.append(f"block tables: {' '.join(tables) or '-'}")
    return "\n".join(lines)


def render_divergence(trace: Trace, result: ReplayResult, max_diffs: int = 20) -> str:
    """A human report of a failing replay: where, the input event, a table of fields, the reference state."""
    d = result.divergence
    if d is None:
        return f"verdict: {result.verdict}" + (f" ({result.detail})" if result.detail else "")
    event = trace.events[d.event_index] if d.event_index < len(trace.events) else {}
    lines = [
        f"{trace.path}:{d.line}: first divergence {render_where(d.step, d.line)}: {d.message}",
        f"  kind: {d.signature()}",
        f"  event: {_short(event)}",
    ]
    if d.diffs:
        width = max(len(x.field) for x in d.diffs[:max_diffs])
        lines.append(f"  {'field'.ljust(width)} | expected | actual")
        for x in d.diffs[:max_diffs]:
            lines.append(f"  {x.field.ljust(width)} | {_short(x.expected)} | {_short(x.actual)}")
        if len(d.diffs) > max_diffs:
            lines.append(f"  ... {len(d.diffs) - max_diffs} more differing fields")
    if "expect_error" in trace.header:
        lines.append(f"  the reference refuses this config: {trace.header['expect_error']}")
    else:
        lines.append("  reference state before this event:")
        lines.extend("    " + ln for ln in render_truncated_lines(render_reference_state(trace, d.event_index)))
    if result.detail:
        lines.append("  detail:")
        lines.extend("    " + ln for ln in result.detail.rstrip().splitlines()[-15:])
    if result.sut_stderr:
        lines.append("  scheduler stderr (last lines):")
        lines.extend("    " + ln for ln in result.sut_stderr.splitlines()[-15:])
    return "\n".join(lines)


def render_where(step: int | None, line: int) -> str:
    """``at step 3``; with no step, ``at init`` (line 1, the header) or ``before the first step`` (an input event)."""
    if step is not None:
        return f"at step {step}"
    return "at init" if line <= 1 else "before the first step"


def _short(value: Any, limit: int = 160) -> str:
    import json

    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."
