"""Steps in flight in Z3 (``spec/symbolic/in_flight.py``): proofs, mutants, drift guard.

``-m symbolic`` proves every in-flight transition at R = 4 request slots,
D = 2 and 3 steps in flight and ``num_spec_tokens`` any k in 0..2 (a second or
so each), and shows that each async mutant of ``conformance/checking/mutants.py`` the
encoding expresses breaks a proof.

The drift guard (default run) ties the encoding to the model: seeded random
programs (adds, re-adds of aborted ids, aborts, ``schedule()`` with steps in
flight, model outputs oldest first with 1 + accepted drafts tokens and stops
inside them, empty draft lists, refused calls) run on the concrete model
under ``vllm-0.33-async`` and ``vllm-0.33`` without spec decode and
``vllm-0.33-async`` and ``vllm-0.32-async`` with ``num_spec_tokens = 2``, with
``max_concurrent_batches`` 1 to 3, and under the async profiles with the V2 runner and
``pipeline_parallel_size`` 2 or 3 (the decode stagger); each call's before/after states are mapped to the
encoding's state and the call must be a sequence of enabled encoded transitions reaching the
mapped after-state exactly. It must catch a broken encoding and the
concrete mutants.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from schedconf.spec.errors import EngineCrash, InvalidEvent
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.symbolic import in_flight as F
from schedconf.spec.symbolic.in_flight import (
    FAILED,
    MUTANT_RULES,
    PROVED,
    DriftError,
    Evaluator,
    FlightShape,
    Z3Evaluator,
    assert_same,
    check_refusal,
    explain_output,
    explain_schedule,
    from_scheduler,
    prove,
    prove_mutant,
    python_evaluator,
    run_move,
)
from schedconf.spec.v1.config import SchedulerConfig, cdiv
from schedconf.spec.v1.scheduler import Scheduler

R = 4
K = 2
"""``num_spec_tokens`` of the spec-decode proofs and programs."""
EOS, STOP = 1, 2
PROFILES = ("vllm-0.33-async", "vllm-0.33")
SPEC_PROFILES = ("vllm-0.33-async", "vllm-0.32-async")
"""Async + spec decode (num_spec_tokens = K): 0.33 trims ``computed`` on a stop and every returned token resolves a
placeholder; 0.32 neither trims nor resolves the trimmed tokens' placeholders."""
DRIFT_CASES = [(p, 0) for p in PROFILES] + [(p, K) for p in SPEC_PROFILES]


# ------------------------------------------------------------------ proofs


def _assert_proved(res: F.FlightResult) -> None:
    bad = {g: s for g, s in res.goals.items() if s != PROVED}
    cex = "\n".join(list(res.counterexamples.values())[:1])
    assert res.status == PROVED, f"{res.transition} at {res.shape.label()}: {res.status} {bad}\n{cex}"
    assert set(res.goals) == set(F.goal_names())


@pytest.mark.symbolic
@pytest.mark.parametrize("steps", [2, 3])
@pytest.mark.parametrize("name", list(F.TRANSITIONS))
def test_transition_preserves_in_flight_invariants(name: str, steps: int) -> None:
    """Inv and lemmas and guard imply the model's assertions, the lemmas and Inv after (R = 4, D = 2 and 3,
    ``num_spec_tokens`` any k in 0..2, k > 0 under async only: so without spec decode too, in both modes)."""
    _assert_proved(prove(FlightShape(R, steps, K), name, timeout_s=60.0))


@pytest.mark.symbolic
@pytest.mark.parametrize("mutant", list(MUTANT_RULES))
def test_mutant_breaks_a_proof(mutant: str) -> None:
    """Each async mutant the encoding expresses yields a counterexample to the goal it breaks (k in 0..2)."""
    res = prove_mutant(FlightShape(R, 2, K), mutant, timeout_s=60.0)
    goal = MUTANT_RULES[mutant][1]
    assert res.goals.get(goal) == FAILED, res.goals
    assert goal in res.counterexamples


@pytest.mark.symbolic
def test_false_invariant_fails() -> None:
    """A rule that does not hold (``stale == 0`` for every request) is refuted by ``preempt``, with a counterexample."""

    def stale_never(s: F.FlightState, o: Any) -> Any:
        return F.land(*[F.eq(s.num_stale_output_tokens[r], 0) for r in s.shape.slots])

    F.LEMMAS["stale_never"] = stale_never
    try:
        res = prove(FlightShape(R, 2), "preempt", timeout_s=60.0)
        # With the false rule also a premise, the other transitions stay proved.
        ok = prove(FlightShape(R, 2), "apply_output", timeout_s=60.0)
    finally:
        del F.LEMMAS["stale_never"]
    assert res.goals["lemma:stale_never"] == FAILED
    assert "stale=" in res.counterexamples["lemma:stale_never"]
    assert ok.goals["lemma:stale_never"] == PROVED


@pytest.mark.symbolic
def test_skip_rule_bounds_samples_with_two_steps_in_flight() -> None:
    """Async: sampling steps in flight never exceed the tokens left to max_tokens with 2 steps in flight (every
    transition preserves it, with drafts too: ``computed + 2 - placeholders`` is ``num_tokens + 1`` for a request
    with a sampling step in flight, by ``decode_progress``, and a multi-token output stops at max_tokens), but
    do with 3: the skip rule subtracts ``placeholders - 1`` as if they were all drafts."""
    prop = ("samples_within_max_tokens",)
    for name in F.TRANSITIONS:
        _assert_proved_with(prove(FlightShape(R, 2, K), name, timeout_s=60.0, properties=prop), prop)
    res = prove(FlightShape(R, 3, K), "schedule_running", timeout_s=60.0, properties=prop)
    assert res.goals["prop:samples_within_max_tokens"] == FAILED, res.goals


def _assert_proved_with(res: F.FlightResult, props: tuple[str, ...]) -> None:
    bad = {g: s for g, s in res.goals.items() if s != PROVED}
    assert res.status == PROVED, f"{res.transition}: {bad}"
    assert set(res.goals) == set(F.goal_names()) | {f"prop:{p}" for p in props}


def test_three_steps_in_flight_schedule_a_token_past_max_tokens() -> None:
    """The D = 3 counterexample in the model (vLLM 0.33's rule, same formula): prompt 6, max_tokens 2, three
    steps in flight. Step 2: 6 + 2 - 1 = 7 < 8, scheduled. Step 3: 7 + 2 - 2 = 7 < 8, scheduled again, though
    steps 1 and 2 already sample both outputs: step 2's output finishes the request (length) and step 3's
    token is wasted (its output is ignored)."""
    config = SchedulerConfig(
        block_size=4,
        num_gpu_blocks=8,
        max_num_batched_tokens=16,
        max_num_seqs=2,
        max_model_len=16,
        max_concurrent_batches=3,
    )
    sched = Scheduler(config, "vllm-0.33-async")
    sched.add_request("a", [5] * 6, 2)
    assert [sched.schedule().num_scheduled_tokens for _ in range(3)] == [{"a": 6}, {"a": 1}, {"a": 1}]
    request = sched.requests["a"]
    assert (request.num_tokens, request.num_output_placeholders) == (6, 3)  # 6 + 3 > 6 + 2
    finish = []
    for _ in range(3):
        out = sched.in_flight[0].output
        tokens = {"a": (7,)} if "a" in sched.requests else {}
        finish.append([o.finish_reason for o in sched.update_from_output(out, ModelRunnerOutput(tokens))])
    assert finish == [[None], ["length"], []]


@pytest.mark.deep
@pytest.mark.parametrize("name", list(F.TRANSITIONS))
def test_transition_proved_at_larger_bounds(name: str) -> None:
    """R = 8, D = 6, k in 0..4 (about a minute for all transitions)."""
    _assert_proved(prove(FlightShape(8, 6, 4), name, timeout_s=600.0))


@pytest.mark.deep
@pytest.mark.parametrize(("profile", "num_spec_tokens"), DRIFT_CASES)
def test_drift_guard_long(profile: str, num_spec_tokens: int) -> None:
    """The drift guard over 3,000 longer programs."""
    for seed in range(10_000, 13_000):
        run_program(seed, num_events=120, profile=profile, num_spec_tokens=num_spec_tokens)


# ------------------------------------------------------------------ drift guard


@dataclass
class Program:
    """A concrete scheduler, the slot of each id it may still mention, and the log (for failure messages)."""

    sched: Scheduler
    shape: FlightShape
    rng: random.Random
    slot_of: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    next_id: int = 0
    aborted: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    crashed: bool = False

    def state(self) -> F.FlightState:
        return from_scheduler(self.sched, self.shape, self.slot_of)

    def release_slots(self) -> None:
        """Forget ids neither live nor scheduled by a step in flight: their slots are free again."""
        referenced = {rid for rec in self.sched.in_flight for rid in rec.output.num_scheduled_tokens}
        for rid in list(self.slot_of):
            if rid not in self.sched.requests and rid not in referenced:
                del self.slot_of[rid]

    def free_slot(self) -> int | None:
        used = set(self.slot_of.values())
        free = [q for q in range(self.shape.num_reqs) if q not in used]
        return self.rng.choice(free) if free else None


def random_config(rng: random.Random, max_concurrent_batches: int, num_spec_tokens: int = 0) -> SchedulerConfig:
    """A small, tight configuration (preemptions happen) with ``max_concurrent_batches`` steps in flight and
    ``num_spec_tokens`` drafts (the threshold 2 then may cut a padded admission: the engine crashes, and the
    program ends there)."""
    block_size = rng.choice([1, 2, 4])
    max_model_len = rng.randint(4, 14)
    chunked = rng.randint(0, 4) != 0
    max_num_seqs = rng.randint(1, 3)
    budget = rng.randint(max(max_num_seqs, 2), 16)
    if not chunked:
        budget = max(budget, max_model_len)
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=cdiv(max_model_len, block_size) + 1 + rng.randint(0, 3),
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=rng.choice([0, 0, 2]),
        enable_prefix_caching=rng.randint(0, 3) != 0,
        policy=rng.choice(["fcfs", "priority"]),
        max_concurrent_batches=max_concurrent_batches,
        num_spec_tokens=num_spec_tokens,
    )


def _add(p: Program, ev: Evaluator, mutant: str | None, rid: str | None = None) -> None:
    sched, rng = p.sched, p.rng
    reuse = rid is not None
    if rid is None:
        rid = f"r{p.next_id}"
        p.next_id += 1
    # Read from the records, not through is_scheduled_in_flight (which a mutant overrides).
    in_flight_id = reuse and any(rid in rec.output.num_scheduled_tokens for rec in sched.in_flight)
    q = p.slot_of[rid] if in_flight_id else p.free_slot()
    if q is None:
        return
    pre = p.state()
    length = rng.randint(1, sched.config.max_model_len - 1)
    prompt = [10 + i for i in range(length)] if rng.random() < 0.5 else [rng.randint(3, 9) for _ in range(length)]
    max_tokens = rng.randint(1, 8)
    try:
        sched.add_request(
            rid,
            prompt,
            max_tokens,
            priority=rng.randint(0, 2),
            arrival_time=len(p.log),
            eos_token_id=EOS,
            stop_token_ids=[STOP],
        )
    except InvalidEvent as exc:
        # Only a re-add while a step of the old request is in flight is refused here.
        assert exc.code == "request_id_in_flight", exc
        assert in_flight_id
        assert_same(pre, p.state(), f"refused add_request {rid}")
        move = ev("add_request", pre, {"slot": q, "num_prompt_tokens": length, "max_tokens": max_tokens}, mutant)
        if move.guard:
            raise DriftError(
                f"add_request {rid}: the model refuses it (request_id_in_flight), the encoding allows it"
            ) from exc
        p.log.append(f"add {rid} refused")
        return
    p.slot_of[rid] = q
    p.log.append(f"add {rid} len={length} max={max_tokens} -> slot {q}")
    post = run_move(
        ev,
        "add_request",
        pre,
        {"slot": q, "num_prompt_tokens": length, "max_tokens": max_tokens},
        f"add_request {rid}",
        mutant,
    )
    assert_same(p.state(), post, f"add_request {rid} after {p.log}")


def _readd(p: Program, ev: Evaluator, mutant: str | None) -> None:
    """Add again an id aborted before (refused while a step that scheduled it is in flight)."""
    gone = sorted(set(p.aborted) - set(p.sched.requests))
    if gone:
        _add(p, ev, mutant, p.rng.choice(gone))


def _abort(p: Program, ev: Evaluator, mutant: str | None) -> None:
    live = sorted(p.sched.requests)
    if not live:
        return
    rid = p.rng.choice(live)
    pre = p.state()
    p.sched.abort(rid)
    p.aborted.append(rid)
    p.log.append(f"abort {rid}")
    post = run_move(ev, "abort", pre, {"slot": p.slot_of[rid]}, f"abort {rid}", mutant)
    assert_same(p.state(), post, f"abort {rid} after {p.log}")


def _schedule(p: Program, ev: Evaluator, mutant: str | None) -> None:
    sched = p.sched
    if not sched.has_requests():
        return
    pre = p.state()
    if len(sched.in_flight) >= sched.config.max_concurrent_batches:
        with pytest.raises(InvalidEvent) as caught:
            sched.schedule()
        assert caught.value.code == "output_not_processed"
        assert_same(pre, p.state(), "refused schedule()")
        check_refusal(ev, pre, "schedule_refused", {}, ("begin_step",), "refused schedule()")
        p.log.append("schedule refused")
        return
    # A new request of this step gets its slot before the call (ids added since are all mapped already).
    try:
        sched.schedule()
    except EngineCrash as exc:
        # A padded admission cut by the threshold (vLLM's assertion): not encoded; the program ends.
        assert exc.code == "engine_assertion_padded_admission", exc
        p.log.append("schedule crashed")
        p.crashed = True
        return
    p.log.append(f"schedule -> step {sched.current_step}: {dict(sched.last_step.output.num_scheduled_tokens)}")
    post = explain_schedule(ev, pre, sched, p.slot_of, mutant)
    assert_same(p.state(), post, f"schedule() after {p.log}")


def _refused_output(p: Program, ev: Evaluator) -> None:
    sched = p.sched
    if sched.current_step == 0:
        return
    steps = [rec.step for rec in sched.in_flight]
    bad = [k for k in range(1, sched.current_step + 1) if not steps or k != steps[0]]
    if not bad:
        return
    k = p.rng.choice(bad)
    pre = p.state()
    with pytest.raises(InvalidEvent) as caught:
        sched.get_in_flight_output(k)
    name = {"duplicate_model_output": "output_duplicate", "model_output_out_of_order": "output_out_of_order"}[
        caught.value.code
    ]
    other = "output_out_of_order" if name == "output_duplicate" else "output_duplicate"
    check_refusal(ev, pre, name, {"step": k}, (other,), f"model output for step {k} ({caught.value.code})")
    p.log.append(f"output for step {k} refused ({caught.value.code})")


def _output(p: Program, ev: Evaluator, mutant: str | None) -> None:
    sched, rng = p.sched, p.rng
    if not sched.in_flight:
        return
    record = sched.in_flight[0]
    out = sched.get_in_flight_output(record.step)
    pre = p.state()
    before = set(sched.requests)
    sampled: dict[str, tuple[int, ...]] = {}
    for rid in out.num_scheduled_tokens:
        # 1 token plus any number of accepted drafts; a stop token one time in six (so a stop may come before
        # the last token: the tokens after it are trimmed).
        num = 1 + rng.randint(0, len(out.scheduled_spec_decode_tokens.get(rid, ())))
        tokens = tuple(rng.choice([EOS, STOP] + [7] * 10) for _ in range(num))
        if rid not in sched.requests:
            if rng.random() < 0.5:
                sampled[rid] = tokens  # vLLM ignores output for requests gone since
        elif record.samples[rid] and (sched.profile.async_scheduling or rng.random() < 0.9):
            sampled[rid] = tokens
    # Under async only an empty draft list is accepted; it empties spec_token_ids.
    drafts = {rid: () for rid in out.num_scheduled_tokens if sched.config.num_spec_tokens and rng.random() < 0.1}
    outputs = sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled, draft_token_ids=drafts))
    stopped = before - set(sched.requests)
    p.log.append(f"output of step {record.step}: {sampled} drafts {drafts} stopped {sorted(stopped)}")
    returned = {rid: len(tokens) for rid, tokens in sampled.items() if rid in before}
    kept = {o.req_id: len(o.new_token_ids) for o in outputs if o.req_id in stopped}
    post = explain_output(ev, pre, returned, stopped, p.slot_of, mutant, kept=kept)
    assert_same(p.state(), post, f"update_from_output() after {p.log}")


def run_program(
    seed: int,
    ev: Evaluator = python_evaluator,
    num_events: int = 60,
    mutant: str | None = None,
    scheduler_class: type[Scheduler] = Scheduler,
    profile: str | None = None,
    num_spec_tokens: int = 0,
    stagger: bool = False,
) -> Program:
    """A seeded random program on the model, each call checked against the encoding (``mutant``: its encoding).

    ``stagger``: the V2 runner with ``pipeline_parallel_size`` 2 or 3 (an async profile), so that a request
    decodes only every ``pipeline_parallel_size`` steps."""
    rng = random.Random(seed)
    profile = profile or rng.choice(PROFILES)
    mcb = rng.choice([1, 2, 2, 3, 3])
    config = random_config(rng, mcb, num_spec_tokens)
    if stagger:
        config = dataclasses.replace(config, use_v2_model_runner=True, pipeline_parallel_size=rng.choice([2, 3]))
    p = Program(scheduler_class(config, profile), FlightShape(R, 3, num_spec_tokens), rng)
    actions: list[tuple[int, Callable[[], None]]] = [
        (3, lambda: _add(p, ev, mutant)),
        (1, lambda: _readd(p, ev, mutant)),
        (1, lambda: _abort(p, ev, mutant)),
        (4, lambda: _schedule(p, ev, mutant)),
        (4, lambda: _output(p, ev, mutant)),
        (1, lambda: _refused_output(p, ev)),
    ]
    weights = [w for w, _ in actions]
    # The induction starts at the empty scheduler: it must satisfy the premises (and so must the last state).
    assert not F.get_failing_premises(p.state()), F.get_failing_premises(p.state())
    for _ in range(num_events):
        if p.crashed:
            break
        p.release_slots()
        rng.choices(actions, weights)[0][1]()
    if not p.crashed:
        assert not F.get_failing_premises(p.state()), (F.get_failing_premises(p.state()), p.log)
    return p


NUM_PROGRAMS = 150


@pytest.mark.parametrize(("profile", "num_spec_tokens"), DRIFT_CASES)
def test_drift_guard(profile: str, num_spec_tokens: int) -> None:
    """Every call of seeded random programs is a sequence of enabled encoded transitions reaching the model's state."""
    reached: set[str] = set()
    for seed in range(NUM_PROGRAMS):
        p = run_program(seed, profile=profile, num_spec_tokens=num_spec_tokens)
        for line in p.log:
            kind = line.split()[0]
            for code in ("refused (duplicate_model_output)", "refused (model_output_out_of_order)", "refused"):
                if code in line:
                    kind += " " + code
                    break
            reached.add(kind)
        if p.sched.stats.num_preemptions:
            reached.add("preempt")
        if p.sched.config.max_concurrent_batches > 1:
            reached.add("in flight")
    reached.discard("schedule crashed")
    assert reached == {
        "add",
        "add refused",
        "abort",
        "schedule",
        "schedule refused",
        "output",
        "preempt",
        "output refused (duplicate_model_output)",
        "output refused (model_output_out_of_order)",
        "in flight",
    }, reached


def test_drift_guard_reaches_stale_output() -> None:
    """The programs reach the corners the rules are about: stale output delivered, a preempted request
    waiting with stale output in flight, more than one placeholder."""
    corners: set[str] = set()

    def spy(name: str, s: F.FlightState, inputs: dict[str, Any], mutant: str | None = None) -> F.Move:
        move = python_evaluator(name, s, inputs, mutant)
        if name == "apply_output" and move.guard:
            if any(s.num_stale_output_tokens[r] > 0 and s.scheduled[0][r] > 0 for r in s.shape.slots):
                corners.add("stale output")
        if name == "begin_step" and any(x > 1 for x in s.num_output_placeholders):
            corners.add("placeholders > 1")
        if name == "end_step" and any(
            s.status[r] == F.PREEMPTED and s.num_stale_output_tokens[r] > 0 for r in s.shape.slots
        ):
            corners.add("stale request waits")
        return move

    for seed in range(NUM_PROGRAMS):
        run_program(seed, ev=spy, profile="vllm-0.33-async")
    assert corners == {"stale output", "placeholders > 1", "stale request waits"}, corners


@pytest.mark.parametrize("profile", SPEC_PROFILES)
def test_drift_guard_reaches_spec_decode_corners(profile: str) -> None:
    """Async + spec decode programs reach the corners the draft rules are about: drafts scheduled with steps in
    flight, rejected and accepted drafts, a stop inside a multi-token output (the tokens after it trimmed), a
    padded admission, a decode cut below its drafts while placeholders are pending (where the mutant
    ``async_drafts_with_placeholders_pending`` differs), a stale multi-token output. (Empty draft lists are
    sent too and change nothing, as in vLLM's engine under async: the drift guard checks that.)"""
    corners: set[str] = set()

    def spy(name: str, s: F.FlightState, inputs: dict[str, Any], mutant: str | None = None) -> F.Move:
        move = python_evaluator(name, s, inputs, mutant)
        if not move.guard:
            return move
        if name == "end_step" and s.num_steps > 1 and any(s.drafts[s.num_steps - 1][r] for r in s.shape.slots):
            corners.add("drafts with steps in flight")
        if name == "admit" and inputs["padded"]:
            corners.add("padded admission")
        if name == "schedule_running":
            q = inputs["slot"]
            wrong = python_evaluator(name, s, inputs, "async_drafts_with_placeholders_pending")
            if s.num_output_placeholders[q] > 0 and wrong.post.drafts != move.post.drafts:
                corners.add("drafts cut with placeholders pending")
        if name == "apply_output":
            for r in s.shape.slots:
                got, d0 = inputs["returned"][r], s.drafts[0][r]
                if s.status[r] == F.DEAD or not s.scheduled[0][r] or not got:
                    continue
                if s.num_stale_output_tokens[r]:
                    corners.add("stale output" + (" of several tokens" if got > 1 else ""))
                    continue
                if d0 and got < 1 + d0:
                    corners.add("drafts rejected")
                if got > 1:
                    corners.add("drafts accepted")
                if inputs["stop"][r] and inputs["kept"][r] < got:
                    corners.add("stop before the last token")
        return move

    for seed in range(NUM_PROGRAMS):
        run_program(seed, ev=spy, profile=profile, num_spec_tokens=K)
    assert corners >= {
        "drafts with steps in flight",
        "padded admission",
        "drafts cut with placeholders pending",
        "drafts rejected",
        "drafts accepted",
        "stop before the last token",
        "stale output",
        "stale output of several tokens",
    }, corners


STAGGER_PROFILES = ("vllm-0.33-async", "vllm-0.32-async")


@pytest.mark.parametrize("profile", STAGGER_PROFILES)
def test_drift_guard_with_decode_stagger(profile: str) -> None:
    """With pipeline parallelism 2 or 3 every call agrees with the encoding, and the programs reach the corners
    the stagger is about: a running request held back by it while a step is built, and a request sampling in
    two steps in flight (``pipeline_parallel_size`` apart)."""
    corners: set[str] = set()

    def spy(name: str, s: F.FlightState, inputs: dict[str, Any], mutant: str | None = None) -> F.Move:
        move = python_evaluator(name, s, inputs, mutant)
        if not move.guard:
            return move
        if name == "end_step":
            newest = s.num_steps - 1
            if any(
                s.status[r] == F.RUNNING
                and s.current_step < s.next_decode_eligible_step[r]
                and s.scheduled[newest][r] == 0
                for r in s.shape.slots
            ):
                corners.add("decode held back")
            if any(sum(s.samples[d][r] for d in range(s.num_steps)) > 1 for r in s.shape.slots):
                corners.add("two decodes in flight")
        return move

    for seed in range(NUM_PROGRAMS // 3):
        run_program(seed, ev=spy, profile=profile, stagger=True)
    assert corners == {"decode held back", "two decodes in flight"}, corners


def test_drift_guard_catches_broken_stagger_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoding that forgets to move ``next_decode_eligible_step`` after a decode is caught; one that drops
    the stagger's guard only allows more (the drift guard cannot see it: its proof fails, MUTANT_RULES)."""

    def no_stagger(s: F.FlightState, *args: Any, **kwargs: Any) -> F.FlightState:
        post = original(s, *args, **kwargs)
        return post.replace(next_decode_eligible_step=s.next_decode_eligible_step)

    original = F._schedule_tokens
    monkeypatch.setattr(F, "_schedule_tokens", no_stagger)
    exc = _first_drift(20, profile="vllm-0.33-async", stagger=True)
    assert exc is not None and "next_decode_eligible_step" in str(exc), exc


def test_drift_guard_through_z3_formulas() -> None:
    """The same check with each transition evaluated through its Z3 formula (the formulas the proofs use)."""
    ev = Z3Evaluator()
    for seed in range(8):
        run_program(seed, ev=ev, num_events=40, profile=PROFILES[seed % 2])
    for seed in range(4):
        run_program(seed, ev=ev, num_events=40, profile=SPEC_PROFILES[seed % 2], num_spec_tokens=K)
    for seed in range(4):
        run_program(seed, ev=ev, num_events=40, profile=STAGGER_PROFILES[seed % 2], stagger=True)
    # And through the formulas too, a broken encoding is caught.
    assert _first_drift(10, ev=ev, mutant="placeholders_kept_on_preempt", profile="vllm-0.33-async")


def _first_drift(num_programs: int, **kwargs: Any) -> DriftError | None:
    for seed in range(num_programs):
        try:
            run_program(seed, **kwargs)
        except DriftError as exc:
            return exc
    return None


@pytest.mark.parametrize(
    "mutant",
    ["stale_output_applied_as_fresh", "placeholders_kept_on_preempt", "async_drafts_with_placeholders_pending"],
)
def test_drift_guard_catches_broken_encoding(mutant: str) -> None:
    """An encoding whose preemption forgets a rule, or that counts drafts without the pending placeholders,
    no longer matches the model: the guard says so.

    (The other encoded mutants only weaken a guard: that encoding still allows every model transition,
    so the drift guard cannot see them, and the proofs catch them.)
    """
    k = K if mutant == "async_drafts_with_placeholders_pending" else 0
    exc = _first_drift(NUM_PROGRAMS, mutant=mutant, profile="vllm-0.33-async", num_spec_tokens=k)
    assert exc is not None


def test_drift_guard_catches_broken_placeholder_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoding that forgets AsyncScheduler's placeholder increment is caught too."""

    def no_placeholders(s: F.FlightState, *args: Any, **kwargs: Any) -> F.FlightState:
        post = original(s, *args, **kwargs)
        return post.replace(num_output_placeholders=s.num_output_placeholders)

    original = F._schedule_tokens
    monkeypatch.setattr(F, "_schedule_tokens", no_placeholders)
    exc = _first_drift(20, profile="vllm-0.33-async")
    assert exc is not None and "num_output_placeholders" in str(exc), exc


MODEL_MUTANTS = (
    "stale_output_applied_as_fresh",
    "placeholders_kept_on_preempt",
    "stale_request_resumed_early",
    "async_max_tokens_skip_missing",
    "in_flight_id_reused",
)


@pytest.mark.parametrize("name", MODEL_MUTANTS + ("async_drafts_with_placeholders_pending", "decode_stagger_ignored"))
def test_drift_guard_catches_model_mutant(name: str) -> None:
    """A mutated model no longer matches the encoding, so the proofs stop covering it: the guard must say so."""
    from schedconf.conformance.checking.mutants import MUTANTS

    k = K if name == "async_drafts_with_placeholders_pending" else 0
    exc = _first_drift(
        NUM_PROGRAMS,
        scheduler_class=MUTANTS[name].scheduler_class,
        profile="vllm-0.33-async",
        num_spec_tokens=k,
        stagger=name == "decode_stagger_ignored",
    )
    assert exc is not None, f"{name} survived {NUM_PROGRAMS} programs"
