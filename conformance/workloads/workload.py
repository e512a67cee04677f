"""Workloads and the engine loop that turns them into traces with the reference model.

A workload is everything outside the scheduler: the config and profile, the
requests with the step at which each arrives, aborts, invalid inputs, and a
token oracle standing in for the model. ``run_workload`` drives the reference
scheduler the way vLLM's ``EngineCore.step`` does (schedule, model output,
update) and records every input and every expected output as a trace. An
input marked ``in_flight`` arrives while a step executes: after that step's
``schedule()`` and before its model output is applied (as under vLLM's async
scheduling, where requests come and go between the two calls).

A workload of a v0 profile (``vllm-0.10``, vLLM's legacy scheduler) runs on
the v0 model in a loop of its own (:func:`run_v0_workload`: one sampled token
per group that samples, no drafts, no in-flight inputs in generated
workloads); its config is the v0 config record and its trace says
``"scheduler": "v0"``. The v0 generator is ``conformance/workloads/workload_v0.py``.

The oracle is a greedy model made of a hash: the token a request samples at
output position ``pos`` depends only on (seed, request id, pos), so the same
request produces the same text however it is chunked, batched, preempted or
drafted. Drafts are proposals for the next positions, right with a given
probability; verification accepts the leading drafts that equal what the
model samples, exactly like greedy speculative decoding.
"""

# Size: the v1 workload generator: every knob of a workload and the config it runs under are drawn
# together, and the draws share one random stream whose order fixes the seeds' traces.

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from schedconf.conformance.sut import add_request_kwargs
from schedconf.conformance.traces.trace import Trace, make_header
from schedconf.spec.errors import EngineCrash, InvalidEvent
from schedconf.spec.output import ModelRunnerOutput, SchedulerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.profiles import PROFILES
from schedconf.spec.v1.scheduler import Scheduler

OBSERVE_MAX_BLOCKS = 512
"""Traces carry the free-queue observation only for pools this small."""


class WorkloadError(Exception):
    """A workload the engine loop cannot run (e.g. it never finishes)."""


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload, added once ``at_step`` steps have run.

    With ``in_flight`` it is added while step ``at_step + 1`` is pending
    (after its ``schedule()``, before its model output); with nothing to
    schedule there is no pending step and it is added at once.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    priority: int = 0
    arrival_time: int = 0
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    at_step: int = 0
    in_flight: bool = False
    order: int | None = None
    """Position among the inputs of the same slot (see ``_timed_inputs``); None: the default."""

    def to_event(self) -> dict[str, Any]:
        """The trace's ``add_request`` event."""
        return {
            "kind": "add_request",
            "request_id": self.request_id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "max_tokens": self.max_tokens,
            "priority": self.priority,
            "arrival_time": self.arrival_time,
            "eos_token_id": self.eos_token_id,
            "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": self.ignore_eos,
            "min_tokens": self.min_tokens,
        }


@dataclass(frozen=True)
class AbortSpec:
    """Abort ``request_id`` once ``at_step`` steps have run (a no-op if it already finished).

    ``in_flight`` and ``order`` as for :class:`RequestSpec`: in flight, while
    step ``at_step + 1`` is pending.
    """

    request_id: str
    at_step: int
    in_flight: bool = False
    order: int | None = None


@dataclass(frozen=True)
class InvalidInput:
    """A deliberately invalid input event; the reference's error code becomes its expect_error.

    If the reference accepts it after all, it is recorded as a valid input.
    ``in_flight`` and ``order`` as for :class:`RequestSpec`.
    """

    event: dict[str, Any]
    at_step: int
    in_flight: bool = False
    order: int | None = None


def _hash_int(*parts: object) -> int:
    data = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


@dataclass(frozen=True)
class HashOracle:
    """A deterministic stand-in for a greedy model (see the module docstring).

    Tokens are in ``[2, vocab_size)`` except that with probability
    ``eos_per_mille``/1000 the model samples ``eos_token_id``. Each draft is
    right with probability ``draft_accuracy_per_mille``/1000.
    """

    seed: int
    vocab_size: int = 64
    eos_token_id: int = 1
    eos_per_mille: int = 30
    draft_accuracy_per_mille: int = 600

    def token(self, request_id: str, pos: int) -> int:
        h = _hash_int("token", self.seed, request_id, pos)
        if h % 1000 < self.eos_per_mille:
            return self.eos_token_id
        return 2 + (h >> 16) % max(1, self.vocab_size - 2)

    def num_drafts(self, request_id: str, pos: int, num_spec_tokens: int) -> int:
        return _hash_int("ndrafts", self.seed, request_id, pos) % (num_spec_tokens + 1)

    def get_num_accepted_drafts(self, request_id: str, pos: int, k: int) -> int:
        """Async + spec decode: how many of the worker's ``k`` drafts for a step sampling at ``pos`` are right
        (the worker proposes ``draft(pos + j)``; greedy verification accepts the leading right ones)."""
        accepted = 0
        while accepted < k and self.draft(request_id, pos + accepted) == self.token(request_id, pos + accepted):
            accepted += 1
        return accepted

    def draft(self, request_id: str, pos: int) -> int:
        h = _hash_int("draft", self.seed, request_id, pos)
        right = self.token(request_id, pos)
        if h % 1000 < self.draft_accuracy_per_mille:
            return right
        wrong = 2 + (h >> 16) % max(1, self.vocab_size - 2)
        return wrong if wrong != right else (wrong + 1 if wrong + 1 < self.vocab_size else 2)


@dataclass(frozen=True)
class RecordedOracle:
    """Replays the tokens and drafts of an existing trace; beyond them, a fallback oracle.

    ``tokens[rid]`` is the request's output sequence as the trace sampled it;
    ``drafts[(rid, pos)]`` the drafts proposed when it had ``pos`` outputs.
    """

    tokens: dict[str, tuple[int, ...]]
    drafts: dict[tuple[str, int], tuple[int, ...]]
    fallback: HashOracle = field(default_factory=lambda: HashOracle(seed=0, eos_per_mille=0))
    accepted: dict[tuple[str, int], int] = field(default_factory=dict)
    """Async + spec decode: drafts accepted in the step that sampled at ``(rid, pos)``."""

    def token(self, request_id: str, pos: int) -> int:
        seq = self.tokens.get(request_id, ())
        return seq[pos] if pos < len(seq) else self.fallback.token(request_id, pos)

    def num_drafts(self, request_id: str, pos: int, num_spec_tokens: int) -> int:
        return min(len(self.drafts.get((request_id, pos), ())), num_spec_tokens)

    def draft(self, request_id: str, pos: int) -> int:  # pragma: no cover - drafts come whole
        raise NotImplementedError

    def draft_list(self, request_id: str, pos: int, k: int) -> list[int]:
        return list(self.drafts.get((request_id, pos), ()))[:k]

    def get_num_accepted_drafts(self, request_id: str, pos: int, k: int) -> int:
        if (request_id, pos) in self.accepted:
            return min(self.accepted[(request_id, pos)], k)
        return self.fallback.get_num_accepted_drafts(request_id, pos, k)


Oracle = HashOracle | RecordedOracle


@dataclass(frozen=True)
class ResetSpec:
    """``reset_prefix_cache(reset_running_requests)`` once ``at_step`` steps have run.

    ``in_flight`` and ``order`` as for :class:`RequestSpec`.
    """

    reset_running_requests: bool
    at_step: int
    in_flight: bool = False
    order: int | None = None


@dataclass(frozen=True)
class Workload:
    """Config, profile, timed inputs and the model stand-in."""

    config: SchedulerConfig
    profile: str
    requests: tuple[RequestSpec, ...]
    aborts: tuple[AbortSpec, ...] = ()
    invalid_inputs: tuple[InvalidInput, ...] = ()
    resets: tuple[ResetSpec, ...] = ()
    record_stats: bool = False
    """Record the scheduler's stats after each update (``model_output.expect.stats``, 0.32+ profiles)."""
    throttle_cadence: int = 0
    """vLLM's data-parallel coordinator (0.32+): with N > 1, every step but each N-th calls
    ``schedule(throttle_prefills=True)``; 0: no throttle."""
    throttled_steps: frozenset[int] = frozenset()
    """Steps that call ``schedule(throttle_prefills=True)`` besides the cadence's (a rebuilt trace's)."""
    oracle: Oracle = field(default_factory=lambda: HashOracle(seed=0))
    seed: int = 0
    origin: str = "generate"
    description: str = ""

    def replace(self, **changes: Any) -> Workload:
        return replace(self, **changes)

    def is_throttled(self, step: int) -> bool:
        """Does step ``step`` (1-based) throttle prefill?"""
        return step in self.throttled_steps or (self.throttle_cadence > 1 and step % self.throttle_cadence != 0)


@dataclass(frozen=True)
class RefusedConfigWorkload:
    """A config one step past a start-up limit (``conformance/workloads/config_limits.py``): no requests, no steps.

    Its trace is the header alone, whose ``expect_error`` is the rule's code:
    a scheduler must refuse the config at start with it, as the model does.
    ``config`` is the header's config as a dict (no config record holds a
    refused one).
    """

    config: dict[str, Any]
    profile: str
    rule: str
    code: str
    seed: int = 0
    origin: str = "generate"

    def replace(self, **changes: Any) -> RefusedConfigWorkload:
        return replace(self, **changes)


def make_refused_config_trace(workload: RefusedConfigWorkload) -> Trace:
    """The header-only trace of a refused config (the model must refuse it with exactly ``workload.code``)."""
    extra = {"scheduler": "v0"} if is_v0_profile(workload.profile) else {}
    header = make_header(
        workload.config,
        workload.profile,
        workload.seed,
        workload.origin,
        expect_error=workload.code,
        **extra,
        description=f"config one step past the {workload.rule} limit: refused at start with {workload.code}",
    )
    return Trace(header=header, events=[])


def oracle_id(request_id: str, incarnation: int) -> str:
    """The oracle's name for one incarnation of a request id (0: the first add).

    A re-added id is a new request with its own text: the oracle (and a
    RecordedOracle's tokens) key it apart from the earlier request of that id.
    """
    return request_id if incarnation == 0 else f"{request_id}#{incarnation}"


def respond(
    oracle: Oracle,
    output: SchedulerOutput,
    samples: dict[str, bool],
    num_spec_tokens: int,
    oracle_ids: Mapping[str, str] | None = None,
    positions: Mapping[str, int] | None = None,
    worker_drafts: bool = False,
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """The model's output for one step: sampled tokens (greedy verification) and next drafts.

    ``oracle_ids`` maps a request id to its oracle name (see :func:`oracle_id`)
    when an id has been re-added; ids it lacks are their own name. A request
    samples at output position ``num_output_tokens`` of its cached data (which
    counts the placeholders of its steps in flight), a new one at 0, unless
    ``positions`` says otherwise (a resumed request listed as new: V2 layout).

    With ``worker_drafts`` (AsyncScheduler with spec decode) the scheduled
    drafts are placeholders (-1) and the drafts stay in the worker, as in
    vLLM: the caller passes each request's live position in ``positions``
    (every earlier output has been applied), the oracle says how many of the
    worker's drafts are right, and no drafts are returned.
    """
    num_outputs = {c.req_id: c.num_output_tokens for c in output.scheduled_cached_reqs}
    num_outputs.update(positions or {})
    sampled: dict[str, tuple[int, ...]] = {}
    drafts: dict[str, tuple[int, ...]] = {}
    for rid in output.num_scheduled_tokens:
        if not samples.get(rid):
            continue
        oid = rid if oracle_ids is None else oracle_ids.get(rid, rid)
        pos = num_outputs.get(rid, 0)
        proposed = output.scheduled_spec_decode_tokens.get(rid, ())
        accepted = 0
        if worker_drafts:
            accepted = oracle.get_num_accepted_drafts(oid, pos, len(proposed))
        while accepted < len(proposed) and proposed[accepted] == oracle.token(oid, pos + accepted):
            accepted += 1
        sampled[rid] = tuple(oracle.token(oid, pos + i) for i in range(accepted + 1))
        if num_spec_tokens and not worker_drafts:
            nxt = pos + accepted + 1
            k = oracle.num_drafts(oid, nxt, num_spec_tokens)
            if isinstance(oracle, RecordedOracle):
                drafts[rid] = tuple(oracle.draft_list(oid, nxt, k))
            else:
                drafts[rid] = tuple(oracle.draft(oid, nxt + j) for j in range(k))
    return sampled, drafts


def _timed_inputs(workload: Workload) -> list[tuple[int, bool, tuple[int, int], object]]:
    """Every input as (at_step, in_flight, rank, input), in the order the loop applies them.

    At one step: the inputs before ``schedule()``, then those in flight.
    Inputs with an explicit ``order`` come first in their slot, by ``order``
    (a rebuilt trace keeps its exact sequence). The others follow: before the
    step, arrivals, invalid inputs, aborts (an abort can hit a request arriving
    at the same step); in flight, aborts, arrivals, invalid inputs (a re-add of
    an id aborted in that very step is refused, ``request_id_in_flight``, and
    is an invalid input).
    """
    items: list[tuple[int, bool, tuple[int, int], object]] = []
    n_req, n_inv, n_abort = len(workload.requests), len(workload.invalid_inputs), len(workload.aborts)

    def rank(item: RequestSpec | InvalidInput | AbortSpec, default: int) -> tuple[int, int]:
        return (0, item.order) if item.order is not None else (1, default)

    for i, r in enumerate(workload.requests):
        items.append((r.at_step, r.in_flight, rank(r, i + (n_abort if r.in_flight else 0)), r))
    for i, v in enumerate(workload.invalid_inputs):
        items.append((v.at_step, v.in_flight, rank(v, n_req + i + (n_abort if v.in_flight else 0)), v))
    for i, a in enumerate(workload.aborts):
        items.append((a.at_step, a.in_flight, rank(a, (0 if a.in_flight else n_req + n_inv) + i), a))
    for i, z in enumerate(workload.resets):  # last in their slot
        items.append((z.at_step, z.in_flight, rank(z, n_req + n_inv + n_abort + i), z))
    items.sort(key=lambda t: (t[0], t[1], t[2]))
    return items


def _apply_input(sched: Scheduler, item: object) -> dict[str, Any]:
    """Apply one input to the reference and return its trace event."""
    if isinstance(item, RequestSpec):
        event = item.to_event()
        sched.add_request(
            item.request_id,
            item.prompt_token_ids,
            item.max_tokens,
            priority=item.priority,
            arrival_time=item.arrival_time,
            eos_token_id=item.eos_token_id,
            ignore_eos=item.ignore_eos,
            stop_token_ids=item.stop_token_ids,
            min_tokens=item.min_tokens,
        )
        return event
    if isinstance(item, AbortSpec):
        sched.abort(item.request_id)
        return {"kind": "abort", "request_id": item.request_id}
    if isinstance(item, ResetSpec):
        success = sched.reset_prefix_cache(item.reset_running_requests)
        return {
            "kind": "reset_prefix_cache",
            "reset_running_requests": item.reset_running_requests,
            "expect": {"success": success},
        }
    assert isinstance(item, InvalidInput)
    event = dict(item.event)
    try:
        if event["kind"] == "add_request":
            sched.add_request(**add_request_kwargs(event))
        else:
            sched.abort(event["request_id"])
    except InvalidEvent as exc:
        event["expect_error"] = exc.code
    # Accepted (e.g. a "duplicate" whose original a shrinker removed): it was a
    # valid input after all and is recorded as one.
    return event


def apply_trace_event(sched: Scheduler, event: dict[str, Any]) -> Any:
    """Apply one input event of a trace to a model scheduler (or a subclass that records).

    Returns the ``SchedulerOutput`` of a ``step``, the request outputs of a
    ``model_output`` (applied to the step it names, the oldest in flight) and ``None`` for
    ``add_request`` and ``abort``. Events that expect an error are skipped
    (``None``); any other invalid input raises ``InvalidEvent``.
    """
    if "expect_error" in event:
        return None
    kind = event["kind"]
    if kind == "add_request":
        sched.add_request(**add_request_kwargs(event))
        return None
    if kind == "abort":
        sched.abort(event["request_id"])
        return None
    if kind == "step":
        return sched.schedule(throttle_prefills=True) if event.get("throttle_prefills") else sched.schedule()
    if kind == "reset_prefix_cache":
        return sched.reset_prefix_cache(event["reset_running_requests"])
    return sched.update_from_output(
        sched.get_in_flight_output(event["step"]),
        ModelRunnerOutput(
            {k: tuple(v) for k, v in event["sampled_token_ids"].items()},
            {k: tuple(v) for k, v in event["draft_token_ids"].items()},
        ),
    )


def run_workload(
    workload: Workload | RefusedConfigWorkload,
    max_steps: int = 10_000,
    check: bool = False,
    scheduler_class: type[Scheduler] = Scheduler,
) -> Trace:
    """Run the workload on the reference scheduler and record the trace.

    Inputs due at step k are applied after k steps have run; ``in_flight``
    ones after the schedule() of step k + 1, before its model output. When the
    scheduler has nothing to do, time skips to the next input (so idle
    stretches produce no empty steps). A ``schedule()`` at which the modelled
    release's engine crashes (``EngineCrash``, e.g. vLLM 0.32/0.33's assertion
    on a cut padded admission) becomes the trace's last event: a ``step`` with
    that ``expect_error``; the engine is dead, so nothing follows it. With
    ``check`` every invariant is checked after each call. ``scheduler_class``
    swaps in a variant of the model (a mutant) to run the workload on.

    A workload of a v0 profile (``vllm-0.10``) runs on the v0 model
    (:func:`run_v0_workload`); a refused config is its header alone
    (:func:`make_refused_config_trace`).
    """
    if isinstance(workload, RefusedConfigWorkload):
        return make_refused_config_trace(workload)
    if is_v0_profile(workload.profile):
        return run_v0_workload(workload, max_steps=max_steps, check=check)
    from schedconf.spec.v1.invariants import check_invariants

    sched = scheduler_class(workload.config, workload.profile)
    observe = workload.config.num_gpu_blocks <= OBSERVE_MAX_BLOCKS
    events: list[dict[str, Any]] = []
    inputs = _timed_inputs(workload)
    next_input = 0
    steps_done = 0
    now = 0  # steps done plus idle time skipped
    adds: dict[str, int] = {}  # request id -> number of accepted add_requests
    oracle_ids: dict[str, str] = {}  # re-added ids -> the oracle's name of the live incarnation

    def apply_due(in_flight: bool) -> None:
        """Apply the inputs due at ``now`` (before the step, or while it is pending)."""
        nonlocal next_input
        while next_input < len(inputs):
            at, item_in_flight, _, item = inputs[next_input]
            # With nothing to schedule no step is pending: an in-flight input is applied now.
            if (at, item_in_flight) > (now, in_flight or not sched.has_requests()):
                break
            event = _apply_input(sched, item)
            events.append(event)
            next_input += 1
            if event["kind"] == "add_request" and "expect_error" not in event:
                rid = event["request_id"]
                adds[rid] = adds.get(rid, 0) + 1
                if adds[rid] > 1:
                    oracle_ids[rid] = oracle_id(rid, adds[rid] - 1)
            if check:
                check_invariants(sched)

    # Steps in flight, oldest first: (output, which requests sample, their oracle names).
    pending: deque[tuple[SchedulerOutput, dict[str, bool], dict[str, str], dict[str, int]]] = deque()
    max_in_flight = workload.config.max_concurrent_batches

    worker_drafts = sched.profile.async_scheduling and workload.config.num_spec_tokens > 0
    delivered: dict[str, int] = {}  # oracle name -> tokens delivered in outputs so far

    def apply_oldest_output() -> None:
        output, samples, step_oracle_ids, positions = pending.popleft()
        if worker_drafts:
            # Where each request samples now: its drafts' acceptance in the
            # steps before is known only once their outputs are applied. The
            # tokens delivered so far (a live request's num_output_tokens; for
            # one finished since, whose output is ignored, the same count).
            positions = {rid: delivered.get(step_oracle_ids.get(rid, rid), 0) for rid in output.num_scheduled_tokens}
        sampled, drafts = respond(
            workload.oracle, output, samples, workload.config.num_spec_tokens, step_oracle_ids, positions, worker_drafts
        )
        outputs = sched.update_from_output(output, ModelRunnerOutput(sampled, drafts))
        for o in outputs:
            oid = step_oracle_ids.get(o.req_id, o.req_id)
            delivered[oid] = delivered.get(oid, 0) + len(o.new_token_ids)
        if check:
            check_invariants(sched)
        expect: dict[str, Any] = {"outputs": [o.to_canonical() for o in outputs]}
        if workload.record_stats and sched.last_scheduler_stats is not None:
            expect["stats"] = sched.last_scheduler_stats
        events.append(
            {
                "kind": "model_output",
                "step": output.step,
                "sampled_token_ids": {k: list(v) for k, v in sorted(sampled.items())},
                "draft_token_ids": {k: list(v) for k, v in sorted(drafts.items())},
                "expect": expect,
            }
        )

    # The engine loop of vLLM's EngineCore (step_with_batch_queue): schedule
    # while the batch queue has room and there is work, else apply the oldest
    # step's output. With max_concurrent_batches 1 this is step() itself.
    while True:
        if not pending:
            if not sched.has_requests() and next_input < len(inputs):
                now = max(now, inputs[next_input][0])  # nothing to do: skip to the next input
            apply_due(in_flight=False)
            if not sched.has_requests():
                if next_input < len(inputs):
                    continue
                break
        elif len(pending) < max_in_flight and sched.has_requests():
            apply_due(in_flight=False)
        if len(pending) >= max_in_flight or not sched.has_requests():
            apply_oldest_output()
            continue
        if steps_done >= max_steps:
            raise WorkloadError(f"workload still running after {max_steps} steps")
        throttle = workload.is_throttled(sched.current_step + 1)
        try:
            output = sched.schedule(throttle_prefills=throttle)
        except EngineCrash as exc:
            # The engine core dies in this step: the trace ends with the crash.
            crash: dict[str, Any] = {"kind": "step", "step": sched.current_step, "expect_error": exc.code}
            if throttle:
                crash["throttle_prefills"] = True
            events.append(crash)
            break
        if check:
            check_invariants(sched)
        step_event: dict[str, Any] = {"kind": "step", "step": output.step, "expect": output.to_canonical()}
        if throttle:
            step_event["throttle_prefills"] = True
        if observe:
            obs = sched.observe()
            step_event["observe"] = {
                "free_block_queue": obs["free_block_queue"],
                "num_free_blocks": obs["num_free_blocks"],
            }
        events.append(step_event)
        assert sched.last_step is not None
        # The oracle names of this step's requests: an id scheduled here cannot
        # be re-added before the update (request_id_in_flight).
        step_oracle_ids = {rid: oracle_ids[rid] for rid in output.num_scheduled_tokens if rid in oracle_ids}
        positions = {r.req_id: sched.requests[r.req_id].num_output_tokens for r in output.scheduled_new_reqs}
        pending.append((output, sched.last_step.samples, step_oracle_ids, positions))
        apply_due(in_flight=True)
        steps_done += 1
        now += 1
    extra = {"description": workload.description} if workload.description else {}
    header = make_header(workload.config.to_dict(), workload.profile, workload.seed, workload.origin, **extra)
    return Trace(header=header, events=events)


# ------------------------------------------------- the v0 engine loop


class _EngineDied(Exception):
    """An input crashed the model's engine: the trace ends with it."""


def is_engine_crash_code(code: str) -> bool:
    """True for the codes of an engine crash (``engine_*``), as opposed to a refused input."""
    return code.startswith("engine_")


def _apply_v0_input(sched: Any, item: object) -> dict[str, Any]:
    """Apply one input to the v0 model and return its trace event.

    A refusal becomes its expect_error; so does an engine crash (vLLM 0.10.2
    crashes freeing an aborted swapped group under prefix caching), after
    which the engine is dead (the loop ends the trace there).
    """
    if isinstance(item, RequestSpec):
        event = item.to_event()
    elif isinstance(item, AbortSpec):
        event = {"kind": "abort", "request_id": item.request_id}
    else:
        assert isinstance(item, InvalidInput)
        event = dict(item.event)
    try:
        if event["kind"] == "add_request":
            sched.add_request(**add_request_kwargs(event))
        else:
            sched.abort(event["request_id"])
    except InvalidEvent as exc:
        event["expect_error"] = exc.code
    return event


def get_v0_observation(sched: Any) -> dict[str, Any]:
    """The v0 observation after ``schedule()`` (PROTOCOL.md ``observe``): free blocks and block tables."""
    obs = sched.observe()
    return {key: obs[key] for key in ("num_free_gpu_blocks", "num_free_cpu_blocks", "block_tables", "cpu_block_tables")}


LIVELOCK_STEPS = 50
"""Steps in a row that change nothing (nothing scheduled, swapped, ignored or reported finished), with
no input left to come, after which a v0 workload is declared a livelock."""


THRASH_STEPS = 1000
"""Steps in a row in which no request samples a token (nor finishes), with no input left to come,
after which a v0 workload is declared a livelock: more than any prompt of our sizes needs, chunked
one token a step."""


def _does_nothing(expect: dict[str, Any]) -> bool:
    return not (
        expect["scheduled_seq_groups"]
        or expect["blocks_to_swap_in"]
        or expect["blocks_to_swap_out"]
        or expect["ignored_seq_groups"]
        or expect["finished_requests_ids"]
        or expect["preempted"]
    )


def run_v0_workload(
    workload: Workload, max_steps: int = 10_000, check: bool = False, step_times: list[int] | None = None
) -> Trace:
    """Run a v0 workload on the v0 model and record the trace.

    As :func:`schedconf.conformance.workloads.workload.run_workload`: inputs due at step k are
    applied after k steps, ``in_flight`` ones between step k + 1's
    ``schedule()`` and its model output, idle stretches are skipped. The model
    stands in for ``LLMEngine.step``: every group that samples gets the
    oracle's next token for its request (one token; no drafts in v0). An
    engine crash (``engine_swap_space_exhausted``, ...) is the trace's last event.
    A livelock (:data:`LIVELOCK_STEPS` steps in a row that do nothing, or
    :data:`THRASH_STEPS` in which no request samples a token, with no input
    left to come) raises WorkloadError: vLLM 0.10.2 spins there forever too
    (a prefix-caching chunk rounded down to 0 tokens; requests swapped or
    recomputed in turn without ever decoding).
    ``check`` runs the model's invariant checks after each call, when it has
    them (``check_invariants``). ``step_times``, when given, gets each step's
    time in the workload's clock (``at_step`` units: steps run plus idle time
    skipped) before the step runs.
    """
    from schedconf.spec.output import ModelRunnerOutput
    from schedconf.spec.schedulers import make_scheduler

    sched = make_scheduler(workload.config.to_dict(), workload.profile)
    checker = getattr(sched, "check_invariants", None) if check else None
    observe = workload.config.to_dict()["num_gpu_blocks"] <= OBSERVE_MAX_BLOCKS
    events: list[dict[str, Any]] = []
    inputs = _timed_inputs(workload)
    next_input = 0
    steps_done = 0
    now = 0
    adds: dict[str, int] = {}
    oracle_ids: dict[str, str] = {}
    num_sampled: dict[str, int] = {}  # oracle name -> tokens sampled so far (v0 keeps them over a recompute)
    idle_steps = 0
    steps_without_tokens = 0

    def apply_due(in_flight: bool) -> None:
        nonlocal next_input
        while next_input < len(inputs):
            at, item_in_flight, _, item = inputs[next_input]
            if (at, item_in_flight) > (now, in_flight or not sched.has_requests()):
                break
            event = _apply_v0_input(sched, item)
            events.append(event)
            next_input += 1
            if is_engine_crash_code(event.get("expect_error", "")):
                raise _EngineDied
            if event["kind"] == "add_request" and "expect_error" not in event:
                rid = event["request_id"]
                adds[rid] = adds.get(rid, 0) + 1
                if adds[rid] > 1:
                    oracle_ids[rid] = oracle_id(rid, adds[rid] - 1)
            if checker:
                checker()

    while True:
        if not sched.has_requests() and next_input < len(inputs):
            now = max(now, inputs[next_input][0])
        try:
            apply_due(in_flight=False)
        except _EngineDied:
            break
        if not sched.has_requests():
            if next_input < len(inputs):
                continue
            break
        if steps_done >= max_steps:
            raise WorkloadError(f"workload still running after {max_steps} steps")
        step = steps_done + 1
        if step_times is not None:
            step_times.append(now)
        try:
            output = sched.schedule()
        except EngineCrash as exc:
            events.append({"kind": "step", "step": step, "expect_error": exc.code})
            break
        if checker:
            checker()
        expect = output.to_canonical()
        idle_steps = idle_steps + 1 if _does_nothing(expect) and next_input == len(inputs) else 0
        sampling = any(g["do_sample"] for g in expect["scheduled_seq_groups"]) or expect["finished_requests_ids"]
        steps_without_tokens = 0 if sampling or next_input < len(inputs) else steps_without_tokens + 1
        if idle_steps >= LIVELOCK_STEPS or steps_without_tokens >= THRASH_STEPS:
            raise WorkloadError(
                f"livelock: {max(idle_steps, steps_without_tokens)} steps in a row without a sampled "
                f"token, no input left (step {step})"
            )
        step_event: dict[str, Any] = {"kind": "step", "step": step, "expect": expect}
        if observe:
            step_event["observe"] = get_v0_observation(sched)
        events.append(step_event)
        step_oracle_ids = {
            g["request_id"]: oracle_ids.get(g["request_id"], g["request_id"]) for g in expect["scheduled_seq_groups"]
        }
        try:
            apply_due(in_flight=True)
        except _EngineDied:
            break
        sampled: dict[str, tuple[int, ...]] = {}
        for group in expect["scheduled_seq_groups"]:
            if group["do_sample"]:
                oid = step_oracle_ids[group["request_id"]]
                sampled[group["request_id"]] = (workload.oracle.token(oid, num_sampled.get(oid, 0)),)
        outputs = sched.update_from_output(output, ModelRunnerOutput(sampled, {}))
        for rid in sampled:
            oid = step_oracle_ids[rid]
            num_sampled[oid] = num_sampled.get(oid, 0) + 1
        if checker:
            checker()
        events.append(
            {
                "kind": "model_output",
                "step": step,
                "sampled_token_ids": {k: list(v) for k, v in sorted(sampled.items())},
                "draft_token_ids": {},
                "expect": {"outputs": [o.to_canonical() for o in outputs]},
            }
        )
        steps_done += 1
        now += 1
    extra = {"description": workload.description} if workload.description else {}
    header = make_header(
        workload.config.to_dict(), workload.profile, workload.seed, workload.origin, scheduler="v0", **extra
    )
    return Trace(header=header, events=events)


def is_v0_profile(profile: str) -> bool:
    """True for a profile of vLLM's legacy v0 scheduler (the v1 profiles are answered without the v0 model)."""
    from schedconf.conformance.traces.trace import get_profile_scheduler

    return get_profile_scheduler(profile) == "v0"


def get_config_of(trace: Trace) -> Any:
    """The model's config record for a trace's header: v1 ``SchedulerConfig`` or the v0 config."""
    if trace.scheduler == "v0":
        from schedconf.spec.schedulers import make_config

        return make_config(trace.config, trace.profile)
    return SchedulerConfig.from_dict(trace.config)


def workload_from_trace(trace: Trace) -> Workload:
    """Rebuild a workload from any trace (ours or not), for shrinking.

    Arrival and abort steps come from the number of step events before them;
    an input between a ``step`` and its ``model_output`` is ``in_flight``; the
    event's index is its ``order``, so the inputs keep the trace's sequence.
    A re-add of an id already added becomes an :class:`InvalidInput` (the
    loop records it as a valid input when it is accepted, and a driver that
    ignores ``in_flight`` or ``order`` sees a refusal rather than a crash).
    The model's tokens and drafts become a RecordedOracle, each incarnation of
    a re-added id under its own oracle name (:func:`oracle_id`). With steps in
    flight, an input right after a ``step`` is ``in_flight`` of that step and
    one after a ``model_output`` comes before the next ``schedule()``; the
    rebuilt run fills the batch queue as vLLM's engine does, so a trace with
    another interleaving of schedules and outputs is rebuilt with that one.
    """
    requests: list[RequestSpec] = []
    aborts: list[AbortSpec] = []
    invalid: list[InvalidInput] = []
    resets: list[ResetSpec] = []
    tokens: dict[str, dict[int, int]] = {}  # oracle name -> output position -> token
    delivered: dict[str, int] = {}  # oracle name -> tokens appended so far
    step_positions: dict[int, dict[str, int]] = {}  # step -> request id -> output position it samples at
    drafts: dict[tuple[str, int], tuple[int, ...]] = {}
    # async + spec decode: (oracle name, position) -> (drafts accepted, exact or a lower bound)
    accepted: dict[tuple[str, int], tuple[int, bool]] = {}
    step_num_drafts: dict[int, dict[str, int]] = {}  # step -> request id -> drafts scheduled
    config = get_config_of(trace)
    worker_drafts = (
        trace.scheduler != "v0"
        and config.num_spec_tokens > 0
        and trace.profile in PROFILES
        and PROFILES[trace.profile].async_scheduling
    )
    adds: dict[str, int] = {}
    steps = 0
    throttled: set[int] = set()
    after_schedule = False  # a step scheduled, no model output since
    for index, event in enumerate(trace.events):
        kind = event["kind"]
        at, in_flight = (steps - 1, True) if after_schedule else (steps, False)
        if kind == "step":
            steps += 1
            if event.get("throttle_prefills"):
                throttled.add(steps)
            after_schedule = "expect_error" not in event
            if "expect" in event and trace.scheduler != "v0":
                x = event["expect"]
                step_num_drafts[event["step"]] = {r: len(d) for r, d in x["scheduled_spec_decode_tokens"].items()}
                step_positions[event["step"]] = {
                    **{
                        r["req_id"]: delivered.get(oracle_id(r["req_id"], adds.get(r["req_id"], 1) - 1), 0)
                        for r in x["scheduled_new_reqs"]
                    },
                    **{c["req_id"]: c["num_output_tokens"] for c in x["scheduled_cached_reqs"]},
                }
        elif kind == "add_request" and "expect_error" not in event and event["request_id"] not in adds:
            requests.append(
                RequestSpec(
                    request_id=event["request_id"],
                    prompt_token_ids=tuple(event["prompt_token_ids"]),
                    max_tokens=event["max_tokens"],
                    priority=event["priority"],
                    arrival_time=event["arrival_time"],
                    eos_token_id=event["eos_token_id"],
                    stop_token_ids=tuple(event["stop_token_ids"]),
                    ignore_eos=event["ignore_eos"],
                    min_tokens=event["min_tokens"],
                    at_step=at,
                    in_flight=in_flight,
                    order=index,
                )
            )
            adds[event["request_id"]] = adds.get(event["request_id"], 0) + 1
        elif kind == "abort" and "expect_error" not in event:
            aborts.append(AbortSpec(event["request_id"], at, in_flight, order=index))
        elif kind == "reset_prefix_cache" and "expect_error" not in event:
            resets.append(ResetSpec(event["reset_running_requests"], at, in_flight, order=index))
        elif kind in ("add_request", "abort"):
            # Refused inputs, and re-adds of an id (refused too if they move
            # before the first request's end, e.g. in a driver that ignores
            # ``in_flight``; recorded as valid inputs when accepted).
            invalid.append(
                InvalidInput({k: v for k, v in event.items() if k != "expect_error"}, at, in_flight, order=index)
            )
            if kind == "add_request" and "expect_error" not in event:
                adds[event["request_id"]] += 1
        elif kind == "model_output":
            if "expect_error" not in event:
                after_schedule = False
            positions = step_positions.get(event["step"], {})
            next_pos: dict[str, int] = {}
            for rid, toks in event["sampled_token_ids"].items():
                oid = oracle_id(rid, adds.get(rid, 1) - 1)
                at = positions.get(rid, len(tokens.get(oid, {})))
                if worker_drafts:
                    # The rebuilt run samples at the live position (see respond).
                    at = delivered.get(oid, 0)
                    k = step_num_drafts.get(event["step"], {}).get(rid, 0)
                    if toks:
                        # The oracle accepts min(L, k) of k drafts, L fixed per
                        # position: an observation below k gives L exactly, one
                        # at k a lower bound (several steps may sample at one
                        # position when outputs are ignored or dropped).
                        got, exact = len(toks) - 1, len(toks) - 1 < k
                        known, known_exact = accepted.get((oid, at), (0, False))
                        if not known_exact:
                            accepted[(oid, at)] = (got, True) if exact else (max(known, got), False)
                for i, tok in enumerate(toks):  # a dropped output's position is sampled again later
                    tokens.setdefault(oid, {})[at + i] = tok
                next_pos[rid] = at + len(toks)
            for rid, d in event["draft_token_ids"].items():
                oid = oracle_id(rid, adds.get(rid, 1) - 1)
                drafts[(oid, next_pos.get(rid, len(tokens.get(oid, {}))))] = tuple(d)
            for o in event.get("expect", {}).get("outputs", ()):
                oid = oracle_id(o["req_id"], adds.get(o["req_id"], 1) - 1)
                delivered[oid] = delivered.get(oid, 0) + len(o["new_token_ids"])
    oracle = RecordedOracle(
        tokens={k: tuple(v[p] for p in range(len(v)) if p in v) for k, v in tokens.items()},
        drafts=drafts,
        accepted={key: n for key, (n, _) in accepted.items()},
    )
    return Workload(
        config=config,
        profile=trace.profile,
        requests=tuple(requests),
        aborts=tuple(aborts),
        invalid_inputs=tuple(invalid),
        resets=tuple(resets),
        oracle=oracle,
        record_stats=any("stats" in e.get("expect", {}) for e in trace.events if e["kind"] == "model_output"),
        throttled_steps=frozenset(throttled),
        seed=trace.header.get("seed", 0),
        origin=trace.header.get("origin", "trace"),
    )
