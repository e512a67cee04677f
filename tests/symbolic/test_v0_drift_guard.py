"""v0 drift guard: the symbolic v0 transitions and the v0 model agree, event by event.

Each model event (``add_request``, ``abort``, ``schedule()``,
``update_from_output()``) is applied to the v0 model (``spec/v0``) and, as
the corresponding sequence of encoded transitions, to the state read from
the model before it (``spec/symbolic/v0/drive.py``); the canonical forms of
the two results must be equal (both free deques in order, ref counts, the
three queues in order, per group: status, token counts, computed, seen
tokens, scheduled chunk, GPU and CPU tables; the step's prefill / preempted /
swap counts). After every event the v0 invariants and lemmas the proofs use
hold on the state read from the model (their concrete evaluation).

Scope: ``_schedule_default`` (chunked prefill off), FCFS or priority (recompute preemption), naive allocator,
``min_tokens = 0``, aborts between steps. Random programs reach every
transition but ``prefill_ignore`` and ``swapped_ignore``, which the proofs show
unreachable below 100 GPU blocks (``never_prompt`` witnesses the first at 100).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedconf.spec.ops import ConcreteOps
from schedconf.spec.symbolic.v0.bridge import from_scheduler, shape_of
from schedconf.spec.symbolic.v0.drive import (
    EncodingError,
    Evaluator,
    Z3Evaluator,
    abort_both,
    add_both,
    assert_same,
    python_evaluator,
    schedule_both,
    update_both,
)
from schedconf.spec.symbolic.v0.invariants import INVARIANTS
from schedconf.spec.symbolic.v0.state import LEMMAS, StateView
from schedconf.spec.v0.config import V0SchedulerConfig
from schedconf.spec.v0.scheduler import Scheduler

NUM_SLOTS = 4
EOS, STOP = 1, 2
SEEN: Counter[str] = Counter()


class ConcreteViolation(AssertionError):
    """A v0 invariant or lemma fails on the state read from the model."""


def check_concrete(sched: Any, what: str) -> None:
    """The v0 invariants and lemmas hold on the state read from the model."""
    state = from_scheduler(sched, shape_of(sched, NUM_SLOTS)).state
    view = StateView(state)
    broken = [name for name, fn in INVARIANTS.items() if not fn(view, ConcreteOps())]
    broken += [f"lemma {name}" for name, fn in LEMMAS.items() if not fn(state, ConcreteOps())]
    if broken:
        raise ConcreteViolation(f"{what}: {broken}")


def random_config(rng: random.Random, policy: str = "fcfs") -> V0SchedulerConfig:
    """A small, tight v0 config inside the encoding's scope (priority: recompute preemption only)."""
    bs = rng.choice([1, 2, 3])
    blocks = rng.randint(2, 6)
    mml = rng.randint(2, blocks * bs)
    budget = rng.randint(mml, mml + 4)
    return V0SchedulerConfig(
        block_size=bs,
        num_gpu_blocks=blocks,
        num_cpu_blocks=rng.choice([0, 2, 4, 8]),
        max_num_batched_tokens=budget,
        max_num_seqs=rng.randint(1, min(NUM_SLOTS, budget)),
        max_model_len=mml,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        policy=policy,
        preemption_mode=rng.choice([None, "swap", "recompute"] if policy == "fcfs" else [None, "recompute"]),
        max_num_partial_prefills=1,
        max_long_partial_prefills=1,
        long_prefill_token_threshold=0,
    )


def run_program(
    seed: int,
    ev: Evaluator,
    max_events: int = 25,
    scheduler_class: type = Scheduler,
    config: V0SchedulerConfig | None = None,
    policy: str = "fcfs",
) -> list[str]:
    """A seeded random program whose every event is compared with the encoding (deterministic per seed).

    Under policy priority each request draws a priority in 0..2 and an arrival time in 0..3 (ties on both
    happen, so the stable sorts are exercised).
    """
    rng = random.Random(f"v0-drift:{policy}:{seed}" if policy != "fcfs" else f"v0-drift:{seed}")
    config = config or random_config(rng, policy)
    sched = scheduler_class(config)
    shape = shape_of(sched, NUM_SLOTS)
    log: list[str] = [f"seed {seed} config {config.to_dict()}"]
    next_id = 0

    def count(name: str, *_: Any) -> None:
        SEEN[name] += 1

    for _ in range(rng.randint(1, max_events)):
        if sched.crashed is not None:
            break
        kind = rng.choice(["add", "add", "step", "step", "step", "abort"])
        live = sorted({g.request_id for q in (sched.waiting, sched.running, sched.swapped) for g in q})
        if kind == "add" and len(live) < NUM_SLOTS:
            rid = f"r{next_id}"
            next_id += 1
            n = rng.randint(1, config.max_model_len)
            extra = (
                {"priority": rng.randint(0, 2), "arrival_time": rng.randint(0, 3)}
                if config.policy == "priority"
                else {}
            )
            after, sym = add_both(
                sched,
                ev,
                shape,
                rid,
                [3 + i % 5 for i in range(n)],
                rng.randint(1, 2 * config.max_model_len),
                eos_token_id=EOS,
                stop_token_ids=[STOP],
                **extra,
            )
            assert_same(after, sym, f"add_request {rid} after {log}")
            log.append(f"add {rid} len={n}")
        elif kind == "abort" and live:
            rid = rng.choice(live)
            after, sym = abort_both(sched, ev, shape, rid)
            assert_same(after, sym, f"abort {rid} after {log}")
            log.append(f"abort {rid}")
        elif kind == "step" and live:
            after, sym, out = schedule_both(sched, ev, shape, on_transition=count)
            assert_same(after, sym, f"schedule() after {log}")
            log.append("schedule")
            if sched.crashed is not None:
                log.append(f"crash {sched.crashed}")
                break
            sampled = {
                g.request_id: (rng.choice([EOS, STOP] + [7] * 14),) for g in out.scheduled_seq_groups if g.do_sample
            }
            check_concrete(sched, f"after schedule() {log}")
            after, sym, _ = update_both(sched, ev, shape, sampled, on_transition=count)
            assert_same(after, sym, f"update_from_output() after {log}")
            log.append("update")
        check_concrete(sched, f"after {log}")
    return log


NUM_PROGRAMS = 300


def test_reachable_states_python() -> None:
    """Seeded random programs: every event agrees with the encoding on Python values, and every schedule
    transition is reached but the two the proofs show unreachable below 100 GPU blocks."""
    SEEN.clear()
    for seed in range(NUM_PROGRAMS):
        run_program(seed, python_evaluator)
    expected = {
        "begin_step",
        "prefill_admit",
        "prefill_stop",
        "end_prefill_loop",
        "running_append",
        "running_preempt_recompute",
        "running_preempt_swap",
        "running_swap_crash",
        "end_running_loop",
        "swapped_swap_in",
        "swapped_stop",
        "end_schedule",
        "update_append_token",
    }
    assert expected <= set(SEEN), f"not reached: {expected - set(SEEN)} (seen {dict(SEEN)})"


@settings(max_examples=40)
@given(seed=st.integers(0, 10**6))
def test_reachable_states_hypothesis(seed: int) -> None:
    """More seeds, drawn by Hypothesis (more under the dev and deep profiles)."""
    run_program(seed, python_evaluator)


NUM_PRIORITY_PROGRAMS = 150


def test_reachable_states_priority_python() -> None:
    """Policy priority (recompute preemption): seeded programs agree event by event, and the priority
    transitions are reached, the forced preemption included."""
    SEEN.clear()
    for seed in range(NUM_PRIORITY_PROGRAMS):
        run_program(seed, python_evaluator, policy="priority")
    expected = {
        "begin_step",
        "prefill_admit",
        "prefill_stop",
        "end_prefill_loop",
        "priority_sort_running",
        "priority_force_preempt",
        "priority_end",
        "running_append",
        "running_preempt_recompute",
        "end_running_loop",
        "end_schedule",
        "update_append_token",
    }
    assert expected <= set(SEEN), f"not reached: {expected - set(SEEN)} (seen {dict(SEEN)})"


@settings(max_examples=20)
@given(seed=st.integers(0, 10**6))
def test_reachable_states_priority_hypothesis(seed: int) -> None:
    """More priority seeds, drawn by Hypothesis."""
    run_program(seed, python_evaluator, policy="priority")


Z3_EVALUATOR = Z3Evaluator()


@pytest.mark.parametrize("swap", [False, True])
def test_reachable_states_z3(swap: bool) -> None:
    """Seeded programs on one pool shape: every event agrees with the encoding's Z3 formulas (those the proofs use)."""
    config = V0SchedulerConfig(
        block_size=2,
        num_gpu_blocks=3,
        num_cpu_blocks=4,
        max_num_batched_tokens=6,
        max_num_seqs=2,
        max_model_len=6,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        policy="fcfs",
        preemption_mode="swap" if swap else None,
        max_num_partial_prefills=1,
        max_long_partial_prefills=1,
        long_prefill_token_threshold=0,
    )
    for seed in range(2):
        run_program(seed, Z3_EVALUATOR, max_events=10, config=config)


def test_reachable_states_priority_z3() -> None:
    """Policy priority through the Z3 formulas, on a pool where priority preemption is forced."""
    config = V0SchedulerConfig(
        block_size=2,
        num_gpu_blocks=3,
        num_cpu_blocks=4,
        max_num_batched_tokens=6,
        max_num_seqs=2,
        max_model_len=6,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        policy="priority",
        preemption_mode=None,
        max_num_partial_prefills=1,
        max_long_partial_prefills=1,
        long_prefill_token_threshold=0,
    )
    SEEN.clear()
    for seed in (6, 17):  # the first two seeds whose programs force a priority preemption on this pool
        run_program(seed, Z3_EVALUATOR, max_events=12, config=config, policy="priority")
    assert all(SEEN[n] > 0 for n in ("priority_sort_running", "priority_force_preempt", "priority_end")), dict(SEEN)


def test_bridge_refuses_out_of_scope() -> None:
    """Priority with swap preemption, chunked prefill and non-integer arrival times are outside the encoding."""
    base = dict(
        block_size=2,
        num_gpu_blocks=3,
        num_cpu_blocks=4,
        max_num_batched_tokens=6,
        max_num_seqs=2,
        max_model_len=6,
        enable_prefix_caching=False,
        max_num_partial_prefills=1,
        max_long_partial_prefills=1,
        long_prefill_token_threshold=0,
    )
    for extra in (
        {"enable_chunked_prefill": False, "policy": "priority", "preemption_mode": "swap"},
        {"enable_chunked_prefill": True, "policy": "fcfs", "preemption_mode": None},
    ):
        sched = Scheduler(V0SchedulerConfig(**base, **extra))
        with pytest.raises(ValueError):
            from_scheduler(sched, shape_of(sched, NUM_SLOTS))
    sched = Scheduler(V0SchedulerConfig(**base, enable_chunked_prefill=False, policy="priority", preemption_mode=None))
    sched.add_request("r0", [3, 4], 2, arrival_time=0.5)
    with pytest.raises(ValueError):
        from_scheduler(sched, shape_of(sched, NUM_SLOTS))


class SkipsForcedPreemption(Scheduler):
    """A mutant: ``_schedule_priority_preemption`` re-sorts both queues but never preempts."""

    def _schedule_priority_preemption(self, budget: Any) -> int:
        from collections import deque

        self.running = deque(sorted(self.running, key=lambda sg: sg.get_priority()))
        self.waiting = deque(sorted(self.waiting, key=lambda sg: sg.get_priority()))
        return 0


class KeepsComputedOnRecompute(Scheduler):
    """A mutant: recompute preemption forgets ``reset_state_for_recompute`` (the group keeps its computed tokens)."""

    def _preempt_by_recompute(self, sg: Any) -> None:
        computed = sg.num_computed_tokens
        super()._preempt_by_recompute(sg)
        sg.num_computed_tokens = computed


class FreesToTheBack(Scheduler):
    """A mutant: frees a finished group's blocks to the back of the free deque (``append`` instead of ``appendleft``)."""

    def free_seq(self, seq: Any) -> None:
        table = self.block_manager.block_tables.get(seq.seq_id)
        ids = list(table.physical_block_ids) if table is not None else []
        super().free_seq(seq)
        gpu = self.block_manager.gpu_allocator
        for b in ids:
            if b in gpu.free_block_ids:
                gpu.free_block_ids.remove(b)
                gpu.free_block_ids.append(b)


@pytest.mark.parametrize(
    "mutant,policy", [(KeepsComputedOnRecompute, "fcfs"), (FreesToTheBack, "fcfs"), (SkipsForcedPreemption, "priority")]
)
def test_drift_guard_catches_mutant(mutant: type, policy: str) -> None:
    """A mutated model no longer matches the encoding (or breaks a proved invariant): the guard must say so."""
    for seed in range(NUM_PROGRAMS):
        try:
            run_program(seed, python_evaluator, scheduler_class=mutant, policy=policy)
        except (EncodingError, ConcreteViolation):
            return
    pytest.fail(f"{mutant.__name__} survived {NUM_PROGRAMS} programs")
