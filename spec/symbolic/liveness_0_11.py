"""The vllm-0.11 liveness counterexample, found by Z3 (issue 14, part 2).

``LIVENESS.md`` shows with a witness trace that the 0.11 rules can loop
forever on two requests with one ``(priority, arrival_time)`` key. This
module finds such a loop with Z3 instead of a seeded search: a small,
separate encoding of one whole step (``schedule()`` then
``update_from_output()``) of ``spec/v1/scheduler.py`` under a release's rules,
unrolled ``k`` steps from a state where every request was just added, and a
query for a *lasso*: a state between steps that comes back with a request
still live. The main encoding (``transitions.py``) encodes loop iterations
of the 0.33 rules; this one encodes whole steps of both 0.11 and 0.33, for
the fragment below.

State between steps (:class:`StepState`), per request slot ``r`` (request
id ``r<slot>``, so slot order is id order): ``status`` (:data:`WAITING`,
:data:`RUNNING`, :data:`PREEMPTED`, :data:`DONE`), ``num_tokens``,
``num_computed_tokens``, ``num_blocks`` (blocks held), ``running_rank``
(index in ``running``) and ``waiting_rank`` (index in the FCFS ``waiting``
deque; under priority ``waiting`` is a heap ordered by ``(priority,
arrival_time, request_id)``, a function of the set of waiting requests, and
the rank is kept 0). Fixed per run (:class:`StepConfig`, :class:`Requests`):
the config values and each request's prompt length, ``max_tokens``,
priority and arrival time, Python ints or Z3 terms.

What is abstracted, and why it is sound for the liveness question
----------------------------------------------------------------------
* Prefix caching off, no speculative decoding, no lookahead, chunked
  prefill on, synchronous steps (``max_concurrent_batches = 1``), no EOS or
  stop tokens, ``min_tokens = 0``: the fragment. The query's configs are in
  it, and a lasso found there is a lasso of the model (checked concretely by
  :func:`realise`). A claim that no lasso exists is a claim about this
  fragment only.
* Block ids are counts: with prefix caching off nothing the scheduler
  decides reads a block id or the free-queue order; allocation needs
  ``max(cdiv(tokens, block_size) - held, 0)`` blocks out of ``num_blocks -
  sum(held)`` free ones (``KVCacheManager.get_num_blocks_to_allocate``).
  Token values are left out: with no EOS or stop ids the stop check reads
  lengths only. The model's full state is this state plus data from a
  finite set (block ids and their order, token values, which the stand-in
  model draws from the position, ``is_prefill_chunk``) that the decisions do
  not read; so if the encoded state repeats with a request live, the
  model's run is eventually periodic with that request live too, possibly
  with a longer period (the block ids may permute). :func:`realise` checks
  it with ``lasso.find_lasso``.
* The model samples exactly one token for every request whose step reaches
  the end of its sequence (``StepRecord.samples``), as the campaigns' model
  does (``schedconf.conformance.workloads.workload.respond``).

The encoding is one Python function per piece of ``spec/v1/scheduler.py``
(each cites the function it mirrors) over values that are Python ints or
Z3 terms (``z3ops``), so it also runs concretely: :func:`run_encoded` steps
it on Python ints, and ``tests/symbolic/test_liveness_0_11.py`` compares it
step by step with the reference scheduler (the drift guard), besides
realising the lasso Z3 finds.

The rules (:class:`StepRules`) are read from the release profile
(``spec/v1/profiles.py``): ``priority_self_preemption``,
``priority_victim_repair``, ``reserve_full_sequence_at_admission``,
``exempt_lone_request_from_threshold``. The knobs that do not matter in the
fragment (drafts, stop order with lengths only, requeue order and
chunking-off overflow with chunked prefill on, free-queue order) are left
out. :func:`get_rules` can override a knob (the mutants of the tests).

CLI: ``python -m schedconf.spec.symbolic.liveness_0_11 [--slots 2] [--steps 6]
[--block-sizes 4] [--max-blocks 2] [--timeout 60]`` runs the 0.11 and 0.33
queries (priority with tied keys allowed under 0.11 and distinct keys
under 0.33, and FCFS) and prints what Z3 found, with the reference's lasso.
"""

# Size: the vLLM 0.11 liveness encoding is one lasso search: its state, its transitions and the
# starvation goal read each other's fields.

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import z3

from schedconf.spec.symbolic.z3ops import cdiv, count, eq, imax, imin, is_z3, ite, land, lnot, lor, total, value_of
from schedconf.spec.v1.profiles import get_profile

WAITING, RUNNING, PREEMPTED, DONE = 0, 1, 2, 3
STATUS_NAMES = {WAITING: "WAITING", RUNNING: "RUNNING", PREEMPTED: "PREEMPTED", DONE: "DONE"}
Policy = Literal["fcfs", "priority"]


@dataclass(frozen=True)
class StepRules:
    """The release rules the fragment reads (knobs of ``schedconf.spec.v1.profiles.Profile``)."""

    name: str
    priority_self_preemption: Literal["break", "continue"]
    priority_victim_repair: Literal["none", "scheduled_only", "index"]
    reserve_full_sequence_at_admission: bool
    exempt_lone_request_from_threshold: bool


def get_rules(profile: str, **overrides: Any) -> StepRules:
    """The fragment's rules of ``profile``, with knobs overridden (mutants)."""
    p = get_profile(profile)
    rules = StepRules(
        p.name,
        p.priority_self_preemption,
        p.priority_victim_repair,
        p.reserve_full_sequence_at_admission,
        p.exempt_lone_request_from_threshold,
    )
    return replace(rules, **overrides)


@dataclass(frozen=True)
class StepConfig:
    """``SchedulerConfig`` values of the fragment; ``block_size`` is a Python int, the rest ints or Z3 terms."""

    block_size: int
    num_blocks: Any
    """Usable blocks: ``num_gpu_blocks - 1`` (block 0 is the null block)."""
    max_model_len: Any
    max_num_batched_tokens: Any
    max_num_seqs: Any
    long_prefill_token_threshold: Any
    policy: Policy
    max_num_blocks: int | None = None
    """A Python bound on ``num_blocks`` (symbolic configs): ``cdiv`` becomes a sum of comparisons."""


@dataclass(frozen=True)
class Requests:
    """Per slot: prompt length, ``max_tokens``, priority, arrival time."""

    num_prompt_tokens: list[Any]
    max_tokens: list[Any]
    priority: list[Any]
    arrival_time: list[Any]


@dataclass
class StepState:
    """The state between two steps (module docstring); one list entry per slot."""

    status: list[Any]
    num_tokens: list[Any]
    num_computed_tokens: list[Any]
    num_blocks: list[Any]
    running_rank: list[Any]
    waiting_rank: list[Any]

    def copy(self) -> StepState:
        return StepState(*(list(getattr(self, f)) for f in STATE_FIELDS))


STATE_FIELDS = ("status", "num_tokens", "num_computed_tokens", "num_blocks", "running_rank", "waiting_rank")


def get_initial_state(reqs: Requests, policy: Policy) -> StepState:
    """Every request added (``Scheduler.add_request``), in slot order, nothing scheduled."""
    n = len(reqs.num_prompt_tokens)
    waiting_rank = list(range(n)) if policy == "fcfs" else [0] * n
    return StepState([WAITING] * n, list(reqs.num_prompt_tokens), [0] * n, [0] * n, [0] * n, waiting_rank)


# ----------------------------------------------------------------- helpers


def _pick(sel: list[Any], values: list[Any]) -> Any:
    """The value of the (at most one) selected slot, 0 when none is."""
    return total(ite(s, v, 0) for s, v in zip(sel, values))


def _set(sel: list[Any], values: list[Any], new: Any) -> list[Any]:
    return [ite(s, new, v) for s, v in zip(sel, values)]


def _is_waiting(status: Any) -> Any:
    return lor(eq(status, WAITING), eq(status, PREEMPTED))


def _key_lt(reqs: Requests, a: int, b: int) -> Any:
    """``victim_key`` of ``a`` below that of ``b``: ``(priority, arrival_time)`` lexicographic."""
    pa, pb, ta, tb = reqs.priority[a], reqs.priority[b], reqs.arrival_time[a], reqs.arrival_time[b]
    return lor(_lt(pa, pb), land(eq(pa, pb), _lt(ta, tb)))


def _lt(a: Any, b: Any) -> Any:
    return a < b


def _compact(member: list[Any], rank: list[Any]) -> list[Any]:
    """Ranks of the members renumbered 0.. in order (removals from a list); 0 for non-members."""
    n = len(member)
    return [ite(member[r], count(land(member[s], rank[s] < rank[r]) for s in range(n) if s != r), 0) for r in range(n)]


def get_num_blocks_to_allocate(cfg: StepConfig, num_tokens: Any, held: Any) -> Any:
    """``KVCacheManager.get_num_blocks_to_allocate`` without prefix hits: ``max(cdiv - held, 0)``.

    ``num_tokens`` is capped at ``max_model_len <= num_blocks * block_size``,
    so with a bound on ``num_blocks`` the ceiling is the number of block
    boundaries below ``num_tokens`` (linear, faster for Z3 than ``div``).
    """
    if is_z3(num_tokens) and cfg.max_num_blocks is not None:
        blocks = count(num_tokens > i * cfg.block_size for i in range(cfg.max_num_blocks))
    else:
        blocks = cdiv(num_tokens, cfg.block_size)
    return imax(blocks - held, 0)


def get_long_prefill_token_threshold(cfg: StepConfig, rules: StepRules, s: StepState) -> Any:
    """``Scheduler.get_long_prefill_token_threshold`` (no adaptive threshold): 0.33 exempts a lone request."""
    if not rules.exempt_lone_request_from_threshold:
        return cfg.long_prefill_token_threshold
    num_eligible = count(lnot(eq(st, DONE)) for st in s.status)
    return ite(num_eligible <= 1, 0, cfg.long_prefill_token_threshold)


def _cap_threshold(n: Any, threshold: Any) -> Any:
    return ite(land(0 < threshold, threshold < n), threshold, n)


def select_victim(cfg: StepConfig, reqs: Requests, s: StepState) -> list[Any]:
    """``Scheduler.select_victim``, one-hot over slots: FCFS the tail of ``running``;
    priority the *first* running request with the maximal ``(priority, arrival_time)``."""
    n = len(s.status)
    running = [eq(st, RUNNING) for st in s.status]
    if cfg.policy == "fcfs":
        run_len = count(running)
        return [land(running[r], eq(s.running_rank[r], run_len - 1)) for r in range(n)]
    # r is the victim iff every other running s has a lower key, or the same key and comes later.
    return [
        land(
            running[r],
            *(
                lnot(
                    land(
                        running[o],
                        lor(
                            _key_lt(reqs, r, o), land(lnot(_key_lt(reqs, o, r)), s.running_rank[o] < s.running_rank[r])
                        ),
                    )
                )
                for o in range(n)
                if o != r
            ),
        )
        for r in range(n)
    ]


def select_waiting_head(cfg: StepConfig, reqs: Requests, s: StepState) -> list[Any]:
    """``waiting.peek_request()``, one-hot: FCFS the deque's head; priority the least
    ``(priority, arrival_time, request_id)`` (``PriorityRequestQueue``; slot order is id order)."""
    n = len(s.status)
    waiting = [_is_waiting(st) for st in s.status]
    if cfg.policy == "fcfs":
        return [land(waiting[r], eq(s.waiting_rank[r], 0)) for r in range(n)]
    return [
        land(
            waiting[r],
            *(
                lnot(land(waiting[o], lor(_key_lt(reqs, o, r), land(lnot(_key_lt(reqs, r, o)), o < r))))
                for o in range(n)
                if o != r
            ),
        )
        for r in range(n)
    ]


# ------------------------------------------------------------------- a step


@dataclass
class _Step:
    """What one ``schedule()`` accumulates (``scheduler._StepState``), per slot."""

    token_budget: Any
    num_scheduled_tokens: list[Any]
    in_scheduled_running: list[Any]
    """In ``scheduled_running_reqs`` (the repair reads it)."""
    preempted: Any = False
    flags: dict[str, Any] = field(default_factory=dict)
    """Paths the encoding leaves out or unroll bounds overrun; the query requires them False."""


def _preempt(
    cfg: StepConfig, rules: StepRules, s: StepState, st: _Step, victim: list[Any], fail: Any, req_index: Any
) -> Any:
    """``_remove_priority_victim`` (priority) or ``running.remove`` (FCFS), then ``_preempt_request``.

    Returns the cursor, moved back under the ``index`` repair when the victim stood before it.
    """
    n = len(s.status)
    v_rank = _pick(victim, s.running_rank)
    was_scheduled = lor(*(land(victim[r], st.in_scheduled_running[r]) for r in range(n)))
    if cfg.policy == "priority":
        repair = rules.priority_victim_repair
        if repair == "index":
            req_index = ite(land(fail, v_rank < req_index), req_index - 1, req_index)
        elif repair == "scheduled_only":
            req_index = ite(land(fail, was_scheduled), req_index - 1, req_index)
        if repair != "none":
            # Give back the victim's tokens and forget what it was given.
            st.token_budget = st.token_budget + ite(fail, _pick(victim, st.num_scheduled_tokens), 0)
            st.num_scheduled_tokens = _set(victim, st.num_scheduled_tokens, 0)
        # ("none", <=0.11: the tokens stay in num_scheduled_tokens; _update_after_schedule counts them.)
    st.in_scheduled_running = _set(victim, st.in_scheduled_running, False)
    # Remove from running: the requests behind it move up.
    s.running_rank = [
        ite(land(fail, eq(s.status[r], RUNNING), s.running_rank[r] > v_rank), s.running_rank[r] - 1, s.running_rank[r])
        for r in range(n)
    ]
    s.running_rank = _set(victim, s.running_rank, 0)
    # _preempt_request: free the blocks, computed to 0, to the head of waiting (FCFS) or into the heap.
    if cfg.policy == "fcfs":
        s.waiting_rank = [
            ite(land(fail, _is_waiting(s.status[r])), s.waiting_rank[r] + 1, s.waiting_rank[r]) for r in range(n)
        ]
        s.waiting_rank = _set(victim, s.waiting_rank, 0)
    s.num_blocks = _set(victim, s.num_blocks, 0)
    s.num_computed_tokens = _set(victim, s.num_computed_tokens, 0)
    s.status = _set(victim, s.status, PREEMPTED)
    st.preempted = lor(st.preempted, fail)
    return req_index


def schedule_running(
    cfg: StepConfig, reqs: Requests, rules: StepRules, s: StepState, st: _Step, threshold: Any
) -> None:
    """``Scheduler._schedule_running`` with ``_allocate_or_preempt`` (no drafts, no placeholders).

    Unrolled: an iteration either moves the cursor on or removes a request
    from ``running``, so ``2 * slots`` iterations end the loop; an allocation
    either fits or removes a request, so ``slots`` attempts end it.
    """
    n = len(s.status)
    req_index: Any = 0
    active: Any = True
    for _ in range(2 * n):
        running = [eq(x, RUNNING) for x in s.status]
        go = land(active, req_index < count(running), st.token_budget > 0)
        sel = [land(go, running[r], eq(s.running_rank[r], req_index)) for r in range(n)]
        computed = _pick(sel, s.num_computed_tokens)
        num_new = _pick(sel, s.num_tokens) - computed
        num_new = _cap_threshold(num_new, threshold)
        num_new = imin(num_new, st.token_budget)
        num_new = imin(num_new, cfg.max_model_len - 1 - computed)
        st.flags["past_max_model_len"] = lor(st.flags.get("past_max_model_len", False), land(go, num_new < 0))
        # num_new_tokens == 0: continue with the next request.
        req_index = ite(land(go, num_new <= 0), req_index + 1, req_index)
        trying = land(go, num_new > 0)
        allocated: Any = False
        self_preempted: Any = False
        for _ in range(n):
            attempt = land(trying, lnot(allocated), lnot(self_preempted))
            held = _pick(sel, s.num_blocks)
            need = get_num_blocks_to_allocate(cfg, imin(computed + num_new, cfg.max_model_len), held)
            num_free = cfg.num_blocks - total(s.num_blocks)
            fits = land(attempt, need <= num_free)
            s.num_blocks = [ite(land(fits, sel[r]), s.num_blocks[r] + need, s.num_blocks[r]) for r in range(n)]
            allocated = lor(allocated, fits)
            fail = land(attempt, lnot(need <= num_free))
            victim = [land(fail, v) for v in select_victim(cfg, reqs, s)]
            req_index = _preempt(cfg, rules, s, st, victim, fail, req_index)
            self_preempted = lor(self_preempted, lor(*(land(victim[r], sel[r]) for r in range(n))))
        st.flags["alloc_unroll"] = lor(
            st.flags.get("alloc_unroll", False), land(trying, lnot(allocated), lnot(self_preempted))
        )
        if not (cfg.policy == "priority" and rules.priority_self_preemption == "continue"):
            active = land(active, lnot(self_preempted))  # break
        # (0.33 priority: continue, the cursor stays on the slot the next request moved into.)
        scheduled = land(trying, allocated)
        st.num_scheduled_tokens = [ite(land(scheduled, sel[r]), num_new, st.num_scheduled_tokens[r]) for r in range(n)]
        st.in_scheduled_running = [lor(st.in_scheduled_running[r], land(scheduled, sel[r])) for r in range(n)]
        st.token_budget = st.token_budget - ite(scheduled, num_new, 0)
        req_index = ite(scheduled, req_index + 1, req_index)
    running = [eq(x, RUNNING) for x in s.status]
    st.flags["running_unroll"] = land(active, req_index < count(running), st.token_budget > 0)


def schedule_waiting(
    cfg: StepConfig, reqs: Requests, rules: StepRules, s: StepState, st: _Step, threshold: Any, enabled: Any
) -> None:
    """``Scheduler._schedule_waiting`` without prefix hits, padding, stale output or skips (chunked prefill on).

    A request refused by the seats, the full-sequence gate or the slots ends
    the loop; ``slots`` iterations admit everyone.
    """
    n = len(s.status)
    active = enabled
    for _ in range(n):
        running = [eq(x, RUNNING) for x in s.status]
        waiting = [_is_waiting(x) for x in s.status]
        go = land(active, st.token_budget > 0, lor(*waiting), count(running) < cfg.max_num_seqs)
        head = [land(go, h) for h in select_waiting_head(cfg, reqs, s)]
        computed = _pick(head, s.num_computed_tokens)  # no prefix hit; nonzero only for a 0.11 unrepaired victim
        held = _pick(head, s.num_blocks)
        num_tokens = _pick(head, s.num_tokens)
        num_new = _cap_threshold(num_tokens - computed, threshold)
        num_new = imin(num_new, st.token_budget)
        num_free = cfg.num_blocks - total(s.num_blocks)
        gate: Any = True
        if rules.reserve_full_sequence_at_admission:
            gate = get_num_blocks_to_allocate(cfg, imin(num_tokens, cfg.max_model_len), held) <= num_free
        need = get_num_blocks_to_allocate(cfg, imin(computed + num_new, cfg.max_model_len), held)
        admit = land(go, num_new > 0, gate, need <= num_free)
        st.flags["admit_nothing"] = lor(st.flags.get("admit_nothing", False), land(go, num_new <= 0))
        run_len = count(running)
        if cfg.policy == "fcfs":
            s.waiting_rank = [ite(land(admit, waiting[r]), s.waiting_rank[r] - 1, s.waiting_rank[r]) for r in range(n)]
        sel = [land(admit, h) for h in head]
        s.waiting_rank = _set(sel, s.waiting_rank, 0)
        s.running_rank = _set(sel, s.running_rank, run_len)
        s.num_blocks = [ite(sel[r], s.num_blocks[r] + need, s.num_blocks[r]) for r in range(n)]
        s.status = _set(sel, s.status, RUNNING)
        st.num_scheduled_tokens = _set(sel, st.num_scheduled_tokens, num_new)
        st.token_budget = st.token_budget - ite(admit, num_new, 0)
        active = admit


def update_after_schedule(s: StepState, st: _Step) -> list[Any]:
    """``Scheduler._update_after_schedule``: scheduled tokens count as computed; returns ``samples`` per slot."""
    n = len(s.status)
    s.num_computed_tokens = [s.num_computed_tokens[r] + st.num_scheduled_tokens[r] for r in range(n)]
    return [land(st.num_scheduled_tokens[r] > 0, s.num_computed_tokens[r] >= s.num_tokens[r]) for r in range(n)]


def update_from_output(cfg: StepConfig, reqs: Requests, s: StepState, samples: list[Any]) -> None:
    """``Scheduler.update_from_output`` with one sampled token per sampling request, the length stop
    (``stop._check_length``; no EOS or stop ids) and ``_free_request``."""
    n = len(s.status)
    s.num_tokens = [s.num_tokens[r] + ite(samples[r], 1, 0) for r in range(n)]
    stopped = [
        land(
            samples[r],
            lor(
                s.num_tokens[r] >= cfg.max_model_len, s.num_tokens[r] - reqs.num_prompt_tokens[r] >= reqs.max_tokens[r]
            ),
        )
        for r in range(n)
    ]
    s.status = _set(stopped, s.status, DONE)
    s.num_blocks = _set(stopped, s.num_blocks, 0)
    s.num_computed_tokens = [ite(eq(s.status[r], DONE), 0, s.num_computed_tokens[r]) for r in range(n)]


def step(cfg: StepConfig, reqs: Requests, rules: StepRules, s: StepState) -> tuple[StepState, dict[str, Any]]:
    """One ``Scheduler.schedule()`` then its ``update_from_output()``; returns the new state and the flags."""
    n = len(s.status)
    s = s.copy()
    threshold = get_long_prefill_token_threshold(cfg, rules, s)
    st = _Step(cfg.max_num_batched_tokens, [0] * n, [False] * n)
    schedule_running(cfg, reqs, rules, s, st, threshold)
    # No admission in a step that preempted (Scheduler.schedule).
    schedule_waiting(cfg, reqs, rules, s, st, threshold, lnot(st.preempted))
    samples = update_after_schedule(s, st)
    update_from_output(cfg, reqs, s, samples)
    s.running_rank = _compact([eq(x, RUNNING) for x in s.status], s.running_rank)
    if cfg.policy == "fcfs":
        s.waiting_rank = _compact([_is_waiting(x) for x in s.status], s.waiting_rank)
    else:
        s.waiting_rank = [0] * n
    return s, st.flags


def is_live(s: StepState) -> Any:
    return lor(*(lnot(eq(x, DONE)) for x in s.status))


def eq_states(a: StepState, b: StepState) -> Any:
    """The same state between steps: statuses, and every field of each live slot."""
    parts = []
    for r in range(len(a.status)):
        same_live = land(*(eq(getattr(a, f)[r], getattr(b, f)[r]) for f in STATE_FIELDS[1:]))
        parts.append(land(eq(a.status[r], b.status[r]), lor(eq(a.status[r], DONE), same_live)))
    return land(*parts)


# ------------------------------------------------------------ concrete run


def run_encoded(cfg: StepConfig, reqs: Requests, rules: StepRules, num_steps: int) -> list[StepState]:
    """The encoding on Python ints: the states before step 1, after step 1, ... (stops when all are done)."""
    states = [get_initial_state(reqs, cfg.policy)]
    for _ in range(num_steps):
        if not is_live(states[-1]):
            break
        nxt, flags = step(cfg, reqs, rules, states[-1])
        bad = [k for k, v in flags.items() if v]
        assert not bad, f"encoding left its fragment: {bad}"
        states.append(nxt)
    return states


def get_model_state(sched: Any, num_slots: int) -> StepState:
    """A ``schedconf.spec.v1.scheduler.Scheduler``'s state between steps, as the encoding's (requests ``r0..``)."""
    from schedconf.spec.v1.request import RequestStatus

    running = [r.request_id for r in sched.running]
    waiting = [r.request_id for r in sched.waiting]
    s = StepState(*([0] * num_slots for _ in STATE_FIELDS))
    for i in range(num_slots):
        rid = f"r{i}"
        req = sched.requests.get(rid)
        if req is None:
            s.status[i] = DONE
            continue
        s.status[i] = {
            RequestStatus.WAITING: WAITING,
            RequestStatus.RUNNING: RUNNING,
            RequestStatus.PREEMPTED: PREEMPTED,
        }[req.status]
        s.num_tokens[i] = req.num_tokens
        s.num_computed_tokens[i] = req.num_computed_tokens
        s.num_blocks[i] = len(sched.kv_cache_manager.req_to_blocks.get(rid, ()))
        s.running_rank[i] = running.index(rid) if rid in running else 0
        s.waiting_rank[i] = waiting.index(rid) if rid in waiting and sched.policy == "fcfs" else 0
    return s


def get_state_key(s: StepState) -> tuple[Any, ...]:
    """A concrete state as a tuple, done slots reduced to their status (what ``eq_states`` compares)."""
    return tuple(
        (DONE,) if value_of(s.status[r]) == DONE else tuple(value_of(getattr(s, f)[r]) for f in STATE_FIELDS)
        for r in range(len(s.status))
    )


def render_state(s: StepState) -> str:
    parts = []
    for r in range(len(s.status)):
        st = value_of(s.status[r])
        if st == DONE:
            parts.append(f"r{r} done")
            continue
        where = f"running[{value_of(s.running_rank[r])}]" if st == RUNNING else STATUS_NAMES[st].lower()
        parts.append(
            f"r{r} {where} tokens={value_of(s.num_tokens[r])} computed={value_of(s.num_computed_tokens[r])}"
            f" blocks={value_of(s.num_blocks[r])}"
        )
    return "; ".join(parts)


# ------------------------------------------------------------------ query


@dataclass(frozen=True)
class Bounds:
    """The query's sizes: request slots, steps, block size, and the ranges of the config values."""

    num_slots: int = 2
    num_steps: int = 10
    block_size: int = 4
    max_blocks: int = 4
    """Usable blocks at most (at least ``cdiv(max_model_len, block_size)``, at least 2)."""
    max_budget: int = 8
    max_tokens: int = 8


@dataclass
class Found:
    """A lasso the query found: the config, the requests, and the states ``s_0 .. s_k`` (``s_j == s_k``)."""

    profile: str
    policy: Policy
    config: dict[str, int]
    requests: list[dict[str, int]]
    states: list[StepState]
    start: int
    """``j``: the state after ``j`` steps comes back after ``k`` steps."""

    @property
    def period(self) -> int:
        return len(self.states) - 1 - self.start


@dataclass
class QueryResult:
    profile: str
    policy: Policy
    bounds: Bounds
    answer: str
    """``sat`` (a lasso), ``unsat`` (none up to the bound) or ``unknown``."""
    seconds: float
    found: Found | None = None


def build_query(
    bounds: Bounds, profile: str, policy: Policy, rules: StepRules | None = None, distinct_keys: bool = False
) -> tuple[z3.Solver, dict[str, Any]]:
    """The lasso query: initial state, ``num_steps`` encoded steps, ``s_j == s_k`` for a ``j < k`` with a live request.

    Config ranges (the ``SchedulerConfig`` checks, chunked prefill on):
    ``cdiv(max_model_len, block_size) <= num_blocks <= max_blocks``,
    ``max_num_seqs <= max_num_batched_tokens <= max_budget``, ``max_num_seqs <=
    slots``, ``0 <= threshold <= max_model_len``; requests: ``1 <= prompt <=
    max_model_len - 1``, ``1 <= max_tokens <= bounds.max_tokens``, priority and
    arrival in ``[0, slots)``; keys pairwise distinct with ``distinct_keys``.
    """
    rules = rules or get_rules(profile)
    n, bs = bounds.num_slots, bounds.block_size
    I = z3.Int  # noqa: E741
    v = {
        "num_blocks": I("num_blocks"),
        "max_model_len": I("max_model_len"),
        "max_num_batched_tokens": I("max_num_batched_tokens"),
        "max_num_seqs": I("max_num_seqs"),
        "long_prefill_token_threshold": I("long_prefill_token_threshold"),
    }
    cfg = StepConfig(bs, policy=policy, max_num_blocks=bounds.max_blocks, **v)
    reqs = Requests(
        [I(f"prompt_{r}") for r in range(n)],
        [I(f"max_tokens_{r}") for r in range(n)],
        [I(f"priority_{r}") for r in range(n)],
        [I(f"arrival_{r}") for r in range(n)],
    )
    # Substituting the per-step equalities first (solve-eqs) halves Z3's time on these queries.
    solver = z3.Then("simplify", "propagate-values", "solve-eqs", "smt").solver()
    mml = cfg.max_model_len
    solver.add(
        mml >= 2,
        mml <= bounds.max_blocks * bs,
        cfg.num_blocks >= 2,
        cfg.num_blocks <= bounds.max_blocks,
        cfg.num_blocks * bs >= mml,
        cfg.max_num_seqs >= 1,
        cfg.max_num_seqs <= n,
        cfg.max_num_batched_tokens >= cfg.max_num_seqs,
        cfg.max_num_batched_tokens <= bounds.max_budget,
        cfg.long_prefill_token_threshold >= 0,
        cfg.long_prefill_token_threshold <= mml,
    )
    for r in range(n):
        solver.add(
            reqs.num_prompt_tokens[r] >= 1,
            reqs.num_prompt_tokens[r] <= mml - 1,
            reqs.max_tokens[r] >= 1,
            reqs.max_tokens[r] <= bounds.max_tokens,
            reqs.priority[r] >= 0,
            reqs.priority[r] < n,
            reqs.arrival_time[r] >= 0,
            reqs.arrival_time[r] < n,
        )
        if distinct_keys:
            for o in range(r):
                solver.add(lor(reqs.priority[r] != reqs.priority[o], reqs.arrival_time[r] != reqs.arrival_time[o]))
    states = [get_initial_state(reqs, policy)]
    for k in range(bounds.num_steps):
        # Name each state's fields so the model can be read back and the formula stays shared.
        nxt, flags = step(cfg, reqs, rules, states[-1])
        named = StepState(*([] for _ in STATE_FIELDS))
        for f in STATE_FIELDS:
            for r, value in enumerate(getattr(nxt, f)):
                var = I(f"{f}_{k + 1}_{r}")
                solver.add(var == value)
                getattr(named, f).append(var)
        for flag in flags.values():
            if is_z3(flag) or flag:
                solver.add(lnot(flag) if is_z3(flag) else False)
        states.append(named)
    last = states[-1]
    start = I("lasso_start")
    solver.add(start >= 0, start < bounds.num_steps, is_live(last))
    solver.add(lor(*(land(start == j, eq_states(states[j], last)) for j in range(bounds.num_steps))))
    return solver, {"cfg": cfg, "reqs": reqs, "states": states, "start": start, "vars": v}


def solve(
    bounds: Bounds,
    profile: str,
    policy: Policy,
    rules: StepRules | None = None,
    distinct_keys: bool = False,
    timeout_s: float = 60.0,
) -> QueryResult:
    """Run :func:`build_query`; on ``sat`` read the lasso back (:class:`Found`)."""
    t0 = time.perf_counter()
    solver, parts = build_query(bounds, profile, policy, rules, distinct_keys)
    solver.set("timeout", int(timeout_s * 1000))
    answer = str(solver.check())
    seconds = time.perf_counter() - t0
    result = QueryResult(profile, policy, bounds, answer, seconds)
    if answer != "sat":
        return result
    m = solver.model()

    def val(x: Any) -> int:
        return value_of(m.eval(x, model_completion=True)) if is_z3(x) else x

    config = {k: val(x) for k, x in parts["vars"].items()}
    config["block_size"] = bounds.block_size
    reqs = parts["reqs"]
    requests = [
        {
            "num_prompt_tokens": val(reqs.num_prompt_tokens[r]),
            "max_tokens": val(reqs.max_tokens[r]),
            "priority": val(reqs.priority[r]),
            "arrival_time": val(reqs.arrival_time[r]),
        }
        for r in range(bounds.num_slots)
    ]
    states = [StepState(*([val(x) for x in getattr(s, f)] for f in STATE_FIELDS)) for s in parts["states"]]
    result.found = Found(profile, policy, config, requests, states, val(parts["start"]))
    return result


def get_concrete(found: Found) -> tuple[StepConfig, Requests]:
    """The found config and requests as Python values of the encoding."""
    c = found.config
    cfg = StepConfig(
        c["block_size"],
        c["num_blocks"],
        c["max_model_len"],
        c["max_num_batched_tokens"],
        c["max_num_seqs"],
        c["long_prefill_token_threshold"],
        found.policy,
    )
    rs = found.requests
    return cfg, Requests(
        [r["num_prompt_tokens"] for r in rs],
        [r["max_tokens"] for r in rs],
        [r["priority"] for r in rs],
        [r["arrival_time"] for r in rs],
    )


def get_workload(found: Found) -> Any:
    """The found lasso as a ``schedconf.conformance.workloads.workload.Workload`` (every request added at step 0)."""
    from schedconf.conformance.workloads.workload import HashOracle, RequestSpec, Workload
    from schedconf.spec.v1.config import SchedulerConfig

    c = found.config
    config = SchedulerConfig(
        block_size=c["block_size"],
        num_gpu_blocks=c["num_blocks"] + 1,
        max_num_batched_tokens=c["max_num_batched_tokens"],
        max_num_seqs=c["max_num_seqs"],
        max_model_len=c["max_model_len"],
        enable_chunked_prefill=True,
        long_prefill_token_threshold=c["long_prefill_token_threshold"],
        enable_prefix_caching=False,
        policy=found.policy,
        num_spec_tokens=0,
        num_lookahead_tokens=0,
        scheduler_reserve_full_isl=None,
    )
    requests = tuple(
        RequestSpec(
            f"r{i}",
            tuple(100 * (i + 1) + j for j in range(r["num_prompt_tokens"])),
            r["max_tokens"],
            priority=r["priority"],
            arrival_time=r["arrival_time"],
        )
        for i, r in enumerate(found.requests)
    )
    return Workload(
        config=config,
        profile=found.profile,
        requests=requests,
        oracle=HashOracle(seed=0, eos_per_mille=0),
        seed=0,
        origin="symbolic-witness",
    )


def realise(found: Found, max_steps: int = 500) -> Any:
    """Run the found workload on the reference scheduler and look for its lasso (``lasso.find_lasso``)."""
    from schedconf.spec.symbolic.liveness_witnesses import find_workload_lasso

    return find_workload_lasso(get_workload(found), max_steps)


def render_found(found: Found) -> str:
    """The lasso as lines: config, requests, and each state ``s_0 .. s_k``."""
    lines = [
        f"{found.profile} {found.policy}: config {found.config}",
        "requests " + "; ".join(f"r{i} {r}" for i, r in enumerate(found.requests)),
    ]
    for i, s in enumerate(found.states):
        mark = " <- lasso start" if i == found.start else (f" == s_{found.start}" if i == len(found.states) - 1 else "")
        lines.append(f"  s_{i}: {render_state(s)}{mark}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.spec.symbolic.liveness_0_11", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--block-sizes", default="4")
    parser.add_argument("--max-blocks", type=int, default=2)
    parser.add_argument("--policies", default="priority,fcfs")
    parser.add_argument("--profiles", default="vllm-0.11,vllm-0.33")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    for bs in (int(x) for x in args.block_sizes.split(",")):
        bounds = Bounds(num_slots=args.slots, num_steps=args.steps, block_size=bs, max_blocks=args.max_blocks)
        for profile in args.profiles.split(","):
            for policy in args.policies.split(","):
                distinct = profile != "vllm-0.11" and policy == "priority"
                res = solve(bounds, profile, policy, distinct_keys=distinct, timeout_s=args.timeout)  # type: ignore[arg-type]
                print(
                    f"{profile} {policy} {bounds} distinct_keys={distinct}: {res.answer} in {res.seconds:.1f} s",
                    flush=True,
                )
                if res.found:
                    print(render_found(res.found))
                    print(f"  reference: {realise(res.found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
