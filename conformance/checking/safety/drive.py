"""Driving a scheduler under the ``safety`` comparison: its own schedule decides what runs.

The harness cannot replay the trace's model outputs verbatim (they belong to
the reference's schedule), so it feeds the trace's *inputs* and builds each
step's model output from the SUT's own SchedulerOutput:

* inputs: every ``add_request`` and ``abort`` at the step index where the
  trace has it (after that many steps; one between a ``step`` and its
  ``model_output`` arrives in flight, after the SUT's ``schedule()`` and
  before its update). With no live request, time skips to the next input.
  An input the trace expects refused must be refused with that code, except
  the two codes that depend on the schedule (``duplicate_request_id``,
  ``request_id_in_flight``): whether those apply is decided from this run.
* model output: a request whose known tokens (prompt plus outputs) are all
  computed by this step samples one token: the next one of its *output
  script* (the tokens the trace's ``model_output`` events gave that request
  incarnation, in order), past the script's end a deterministic filler that
  is never an EOS or stop token of the request. Prefill chunks sample
  nothing. No drafts are ever proposed (``draft_token_ids`` is always
  empty), so only a scheduler's own placeholder drafts can appear.
* the run ends when every request has ended (finished or aborted) and the
  trace's inputs are spent, or when the liveness bound passes.

After every ``schedule()`` and update the properties of
``conformance/checking/safety/properties.py`` are checked; the first violation is the
verdict, a ``Divergence`` of kind ``safety`` whose field names the property.
Its event index is the last trace event the run had used (an input fed or a
script token consumed), so the trace cut after it replays to the same
violation.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schedconf.conformance import bounds
from schedconf.conformance.checking.compare import Divergence, FieldDiff
from schedconf.conformance.checking.safety import properties as P
from schedconf.conformance.checking.verdict import FAIL, PASS, UNKNOWN, ReplayResult
from schedconf.conformance.sut import SchedulerUnderTest, SutInputError, SutUnsupported
from schedconf.conformance.traces.trace import Trace
from schedconf.conformance.workloads.workload import oracle_id

STATE_DEPENDENT_CODES = ("duplicate_request_id", "request_id_in_flight")


class Violation(Exception):
    """A property failed (internal to the driver: becomes the ``safety`` divergence)."""

    def __init__(self, prop: str, message: str) -> None:
        super().__init__(message)
        self.prop = prop
        self.message = message


@dataclass
class TimedInput:
    """One input event of the trace: due after ``at`` steps (``in_flight``: while step ``at`` is pending)."""

    at: int
    in_flight: bool
    index: int
    event: dict[str, Any]


@dataclass
class ScriptToken:
    token: int
    event_index: int


def get_timed_inputs(trace: Trace) -> list[TimedInput]:
    """The trace's add_request and abort events with the step after which each is due."""
    out = []
    steps, pending = 0, False
    for index, event in enumerate(trace.events):
        kind = event["kind"]
        if kind == "step":
            steps += 1
            pending = "expect_error" not in event
        elif kind == "model_output":
            pending = False
        else:
            out.append(TimedInput(steps, pending, index, event))
    return out


def get_output_scripts(trace: Trace) -> dict[str, list[ScriptToken]]:
    """Oracle name (``oracle_id``) -> the tokens the trace's model outputs gave that request incarnation, in order."""
    scripts: dict[str, list[ScriptToken]] = {}
    adds: dict[str, int] = {}
    for index, event in enumerate(trace.events):
        if event["kind"] == "add_request" and "expect_error" not in event:
            adds[event["request_id"]] = adds.get(event["request_id"], 0) + 1
        elif event["kind"] == "model_output":
            for rid, toks in event["sampled_token_ids"].items():
                oid = oracle_id(rid, adds.get(rid, 1) - 1)
                scripts.setdefault(oid, []).extend(ScriptToken(t, index) for t in toks)
    return scripts


def get_filler_token(oid: str, pos: int, avoid: set[int]) -> int:
    """A deterministic token for output position ``pos`` that is none of ``avoid`` (the request's stop tokens)."""
    h = int.from_bytes(hashlib.sha256(f"filler\x1f{oid}\x1f{pos}".encode()).digest()[:4], "little")
    token = 2 + h % 1000
    while token in avoid:
        token += 1
    return token


@dataclass
class SafetyRun:
    """The state of one safety run: the harness's records of the SUT's requests and the KV written."""

    trace: Trace
    sut: SchedulerUnderTest
    call: Callable[..., Any]
    """``call(fn, *args)`` runs one SUT call under the replay's timeout."""
    records: dict[str, P.RequestRecord] = field(default_factory=dict)
    oracle_names: dict[str, str] = field(default_factory=dict)
    incarnations: dict[str, int] = field(default_factory=dict)
    written: dict[int, P.KvWrite] = field(default_factory=dict)
    clock: int = 0
    steps_run: int = 0
    used_index: int = 0
    deadline: int | None = None
    last_input_step: int = 0
    in_flight_aborted: set[str] = field(default_factory=set)
    preemptions_reported: bool = True
    """False after a SchedulerOutput without ``preempted_req_ids`` (vLLM 0.11): tables of requests it
    preempted are not known to have emptied."""

    def __post_init__(self) -> None:
        cfg = self.trace.config
        self.block_size = cfg["block_size"]
        self.max_model_len = cfg["max_model_len"]
        self.num_gpu_blocks = cfg["num_gpu_blocks"]
        self.num_usable_blocks = cfg["num_gpu_blocks"] - 1
        from schedconf.spec.v1.profiles import get_profile

        self.stop_order = get_profile(self.trace.profile).stop_check_order
        self.scripts = get_output_scripts(self.trace)
        self.crash_codes = {e["expect_error"] for e in self.trace.events if e["kind"] == "step" and "expect_error" in e}

    # ------------------------------------------------------------- inputs

    def is_live(self, rid: str) -> bool:
        rec = self.records.get(rid)
        return rec is not None and rec.ended is None

    def has_live(self) -> bool:
        return any(r.ended is None for r in self.records.values())

    def apply_input(self, item: TimedInput, pending: dict[str, Any] | None) -> Divergence | None:
        """Feed one input; a wrong refusal (or acceptance) is an ``input_error`` divergence."""
        event = item.event
        kind = event["kind"]
        expect = event.get("expect_error")
        rid = event.get("request_id")
        if expect in STATE_DEPENDENT_CODES or (expect is None and kind == "add_request"):
            if kind == "add_request" and isinstance(rid, str) and self.is_live(rid):
                expect = "duplicate_request_id"
            elif kind == "add_request" and pending is not None and rid in self.in_flight_aborted:
                expect = "request_id_in_flight"
            elif expect in STATE_DEPENDENT_CODES:
                expect = None
        self.used_index = max(self.used_index, item.index)
        allowed = {expect}
        if expect is not None and kind == "add_request" and isinstance(rid, str) and self.is_live(rid):
            allowed.add("duplicate_request_id")  # checked before the other fields (spec/v1/scheduler.py)
        try:
            if kind == "add_request":
                self.call(self.sut.add_request, event)
            else:
                self.call(self.sut.abort, event["request_id"])
        except SutInputError as exc:
            if exc.code in allowed:
                return None
            return self.input_error(
                item,
                expect,
                exc.code,
                f"{kind}: {'expected error ' + expect if expect else 'no error expected'}, got {exc}",
            )
        if expect is not None:
            return self.input_error(item, expect, None, f"{kind}: expected error {expect}, the scheduler accepted it")
        if kind == "add_request":
            self.add_record(event)
        else:
            rid = event["request_id"]  # there: the abort above was called with it
            rec = self.records.get(rid)
            if rec is not None and rec.ended is None:
                rec.ended = f"aborted by the harness at step {self.steps_run}"
                rec.table = []
                if pending is not None and rid in pending["num_scheduled_tokens"]:
                    self.in_flight_aborted.add(rid)
        self.last_input_step = self.clock
        # An input in flight arrives after this step's schedule(): the bound counts the steps after it.
        in_flight = 1 if pending is not None else 0
        self.deadline = self.clock + in_flight + P.compute_liveness_bound(self.records.values(), self.max_model_len)
        return None

    def add_record(self, event: dict[str, Any]) -> None:
        rid = event["request_id"]
        n = self.incarnations.get(rid, 0)
        self.incarnations[rid] = n + 1
        self.oracle_names[rid] = oracle_id(rid, n)
        self.records[rid] = P.RequestRecord(
            request_id=rid,
            tokens=list(event["prompt_token_ids"]),
            num_prompt=len(event["prompt_token_ids"]),
            max_tokens=event["max_tokens"],
            min_tokens=event["min_tokens"],
            eos_token_id=None if event["ignore_eos"] else event["eos_token_id"],
            stop_token_ids=tuple(event["stop_token_ids"]),
            added_at_step=self.steps_run,
        )

    def input_error(self, item: TimedInput, expected: str | None, actual: str | None, message: str) -> Divergence:
        return Divergence(
            event_index=item.index,
            line=self.trace.line_of(item.index),
            step=self.steps_run,
            kind="input_error",
            diffs=(FieldDiff("error", expected, actual),),
            message=message,
        )

    # -------------------------------------------------------------- steps

    def sample(self, output: dict[str, Any]) -> dict[str, list[int]]:
        """One token for each scheduled request that computes all its known tokens in this step."""
        sampled = {}
        reported = P.get_reported_computed(output, self.records)
        for rid, n in output["num_scheduled_tokens"].items():
            rec = self.records.get(rid)
            if rec is None or rid not in reported or reported[rid][0] + n < len(rec.tokens):
                continue
            oid = self.oracle_names.get(rid, rid)
            script = self.scripts.get(oid, [])
            pos = rec.num_output
            if pos < len(script):
                token = script[pos].token
                self.used_index = max(self.used_index, script[pos].event_index)
            else:
                avoid = set(rec.stop_token_ids) | ({rec.eos_token_id} if rec.eos_token_id is not None else set())
                token = get_filler_token(oid, pos, avoid)
            sampled[rid] = [token]
        return sampled

    def check_schedule(self, output: dict[str, Any]) -> tuple[dict[str, list[int]], dict[int, P.KvWrite]]:
        """The properties of one SchedulerOutput; returns the step's block tables and KV writes."""
        cfg = self.trace.config
        expect(P.check_token_budget(output, cfg["max_num_batched_tokens"]), "token_budget")
        expect(P.check_seats(output, cfg["max_num_seqs"]), "seats")
        expect(P.check_known_requests(output, self.records), "known_requests")
        expect(P.check_progress(output, self.records), "progress")
        expect(P.check_max_model_len(output, self.max_model_len, self.records), "max_model_len")
        expect(P.check_block_ids(output, self.num_gpu_blocks), "block_ids")
        tables = P.get_step_tables(output, self.records)
        writes = P.get_step_writes(output, self.records, tables, self.block_size)
        expect(
            P.check_computed_kv(output, self.records, tables, {**self.written, **writes}, self.block_size),
            "computed_kv",
        )
        for rid in output.get("preempted_req_ids") or ():
            if rid in self.records:
                self.records[rid].table = []
        for rid, table in tables.items():
            if rid in self.records:
                self.records[rid].table = table
        self.preemptions_reported = output.get("preempted_req_ids") is not None
        if not self.preemptions_reported:
            # a release that does not report preemptions (0.11): only this step's tables are known to be current
            all_tables = {rid: t for rid, t in tables.items() if self.is_live(rid)}
        else:
            all_tables = {rid: r.table for rid, r in self.records.items() if r.ended is None and r.table}
        expect(P.check_block_exclusivity(all_tables, self.records, self.block_size), "block_exclusivity")
        return tables, writes

    def check_observation(self) -> None:
        """The block properties over what the SUT reports of its blocks (``observe``), when it does."""
        obs = self.call(self.sut.observe)
        if not obs:
            return
        tables = obs.get("block_tables")
        free = obs.get("num_free_blocks")
        expect(P.check_observed_block_ids(tables, obs.get("free_block_queue"), self.num_gpu_blocks), "block_ids")
        expect(P.check_blocks_return(tables, free, self.records, self.num_usable_blocks), "blocks_return")
        if tables is not None:
            expect(
                P.check_block_exclusivity(tables, self.records, self.block_size, obs.get("free_block_queue")),
                "block_exclusivity",
            )
            if free is not None:
                expect(
                    P.check_block_conservation(tables, free, self.records, self.num_usable_blocks), "block_conservation"
                )
            expect(P.check_block_tables(tables, self.records, self.preemptions_reported), "block_tables")

    def apply_update(
        self, output: dict[str, Any], sampled: dict[str, list[int]], outputs: Any, writes: dict[int, P.KvWrite]
    ) -> None:
        """Check the request outputs of one update and move the records on."""
        if not isinstance(outputs, list):
            raise Violation("request_lifecycle", f"update_from_output() returned {outputs!r}, not a list of outputs")
        live_sampled = {rid: t for rid, t in sampled.items() if rid not in self.in_flight_aborted}
        expect(P.check_request_lifecycle(live_sampled, outputs, self.records), "request_lifecycle")
        self.written.update(writes)
        reported = P.get_reported_computed(output, self.records)
        drafts = output.get("scheduled_spec_decode_tokens", {})
        for rid, n in output["num_scheduled_tokens"].items():
            rec = self.records.get(rid)
            if rec is not None and rid in reported:
                rec.computed = reported[rid][0] + n - (len(drafts.get(rid, ())) if rid in sampled else 0)
        for rid, toks in live_sampled.items():
            self.records[rid].tokens.extend(toks)
        expect(
            P.check_stop_rules(live_sampled, outputs, self.records, self.max_model_len, self.stop_order), "stop_rules"
        )
        for o in outputs:
            rec = self.records.get(o["req_id"])
            if o["finish_reason"] is not None and rec is not None and rec.ended is None:
                rec.ended = f"finished ({o['finish_reason']}) at step {self.steps_run}"
                rec.table = []
        self.in_flight_aborted.clear()


def expect(messages: list[str], prop: str) -> None:
    """Raise the first violation of ``prop``, if any."""
    if messages:
        raise Violation(prop, messages[0])


def run_safety(
    trace: Trace, sut: SchedulerUnderTest, call: Callable[..., Any], raised: Callable[[int, str, BaseException], Any]
) -> Any:
    """Drive ``sut`` through the trace's inputs under the safety properties; return a ReplayResult.

    ``call(fn, *args)`` runs one SUT call under the replay's timeout;
    ``raised(index, what, exc)`` turns a SUT exception into a result.
    """
    run = SafetyRun(trace, sut, call)
    inputs = get_timed_inputs(trace)
    nxt = 0

    def result(verdict: str, divergence: Divergence | None = None, detail: str = "") -> ReplayResult:
        tail = getattr(sut, "stderr_tail", None)
        return ReplayResult(
            verdict=verdict,
            divergence=divergence,
            events_run=run.used_index + 1,
            steps_run=run.steps_run,
            detail=detail,
            sut_stderr=tail() if callable(tail) else "",
            extra={"comparison": "safety"},
        )

    def is_due(item: TimedInput, in_flight: bool) -> bool:
        """Before a schedule(): inputs due after ``clock`` steps (and late in-flight ones); in flight: those of the pending step."""
        if item.in_flight:
            return item.at <= run.clock + (1 if in_flight else 0)
        return item.at <= run.clock

    def feed(in_flight: bool, pending: dict[str, Any] | None) -> Divergence | None:
        nonlocal nxt
        while nxt < len(inputs) and is_due(inputs[nxt], in_flight):
            item = inputs[nxt]
            nxt += 1
            bad = run.apply_input(item, pending)
            if bad is not None:
                return bad
        return None

    current_step = 1  # the step being worked on: its inputs, schedule() and update
    try:
        while True:
            current_step = run.steps_run + 1
            if not run.has_live() and nxt < len(inputs):
                # nothing to do: time skips to the next input (no empty steps); one due in flight
                # has no pending step to wait for and arrives at once
                item = inputs[nxt]
                run.clock = max(run.clock, item.at - (1 if item.in_flight else 0))
                nxt += 1
                bad = run.apply_input(item, None)
                if bad is not None:
                    return result(FAIL, bad)
                continue
            bad = feed(False, None)
            if bad is not None:
                return result(FAIL, bad)
            if not run.has_live():
                if nxt < len(inputs):
                    continue
                break
            if nxt >= len(inputs):
                expect(
                    P.check_liveness(
                        run.clock, run.deadline, run.records, run.num_usable_blocks, run.block_size, run.last_input_step
                    ),
                    "liveness",
                )
                if run.deadline is not None and run.clock > run.deadline:
                    break  # only requests that cannot fit are left
            if run.steps_run >= bounds.MAX_SAFETY_STEPS:
                live = sorted(r.request_id for r in run.records.values() if r.ended is None)
                return result(
                    UNKNOWN,
                    detail=f"unsupported: the safety run reached schedconf's bound of "
                    f"{bounds.MAX_SAFETY_STEPS} steps (docs/reference/bounds.md) with "
                    f"{len(live)} request(s) live ({', '.join(live[:5])}): every property "
                    "held until then; a trace this long is checked with strict or "
                    "observable",
                )
            try:
                output = call(sut.schedule)
            except SutInputError as exc:
                if exc.code in run.crash_codes:
                    return result(PASS, detail=f"the engine died as the trace records: {exc}")
                # the scheduler's own schedule killed its engine (e.g. vLLM 0.32/0.33's padded-admission
                # assertion, modelled on purpose): no request ends after it
                return result(
                    FAIL,
                    Divergence(
                        run.used_index,
                        trace.line_of(run.used_index),
                        run.steps_run + 1,
                        "sut_error",
                        (FieldDiff("error", None, exc.code),),
                        f"schedule() of step {run.steps_run + 1}: the engine died: {exc}",
                    ),
                )
            run.steps_run += 1
            tables, writes = run.check_schedule(output)
            run.check_observation()
            bad = feed(True, output)
            if bad is not None:
                return result(FAIL, bad)
            sampled = run.sample(output)
            outputs = call(sut.update_from_output, sampled, {})
            run.apply_update(output, sampled, outputs, writes)
            run.check_observation()
            run.clock += 1
        run.check_observation()
        never = [r.request_id for r in run.records.values() if r.ended is None]
        if never:
            return result(PASS, detail=f"left live (they cannot fit the pool alone): {', '.join(never)}")
        return result(PASS)
    except Violation as v:
        return result(
            FAIL,
            Divergence(
                event_index=run.used_index,
                line=trace.line_of(run.used_index),
                step=run.steps_run,
                kind="safety",
                diffs=(FieldDiff(v.prop, "holds", v.message),),
                message=f"step {run.steps_run}: {v.prop}: {v.message}",
            ),
        )
    except SutUnsupported as exc:
        return result(UNKNOWN, detail=f"unsupported: {exc}")
    except Exception as exc:  # noqa: BLE001 - the SUT's failure is a recorded result
        failed = raised(run.used_index, f"step {current_step}", exc)
        if failed.divergence is not None:  # the SUT's own step it failed in (the trace's steps do not apply)
            failed.divergence = dataclasses.replace(failed.divergence, step=current_step)
        return failed
