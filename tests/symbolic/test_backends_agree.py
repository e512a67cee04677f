"""The two backends of every invariant agree on concrete states.

Each invariant of ``spec/v1/invariants.py`` is evaluated twice on the same scheduler
state: with ``ConcreteOps`` on ``ConcreteView`` (what
``check_invariants`` does), and with ``Z3Ops`` on a ``SymbolicView`` over
fresh Z3 constants, whose formula is then evaluated with the constants bound
to the scheduler's values. Both must give the same truth value.

States come from random programs (``conftest.drive``), half of them with one
deliberate corruption (a wrong ref_cnt, a block missing from the free queue,
a status that disagrees with its queue...), so both outcomes are exercised;
``test_corruptions_are_detected`` checks that every corruption kind makes
some invariant false on both backends. The encoding's lemmas must hold on
every uncorrupted state (they are claimed for all reachable states).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from schedconf.spec.ops import ConcreteOps
from schedconf.spec.symbolic.state import LEMMAS, Shape, SymbolicView, bind, fresh_state, from_scheduler, shape_of
from schedconf.spec.symbolic.z3ops import Z3Ops, is_z3
from schedconf.spec.v1.invariants import INVARIANTS
from schedconf.spec.v1.scheduler import PreemptionRecord, Scheduler
from schedconf.spec.v1.view import ConcreteView
from tests.symbolic.conftest import NUM_SLOTS, configs, drive

SEEN: Counter[tuple[str, bool]] = Counter()


@cache
def symbolic_formulas(shape: Shape) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Fresh state of ``shape`` and the Z3 formula of every invariant and lemma on it."""
    s = fresh_state(shape, "agree")
    view = SymbolicView(s)
    invs = {name: fn(view, Z3Ops()) for name, fn in INVARIANTS.items()}
    lemmas = {name: fn(s, Z3Ops()) for name, fn in LEMMAS.items()}
    return s, invs, lemmas


def z3_truth(formulas: dict[str, object], sym, concrete) -> dict[str, bool]:  # noqa: ANN001
    """Evaluate each formula with the symbolic state bound to the concrete values."""
    solver = z3.Solver()
    solver.add(bind(sym, concrete))
    assert solver.check() == z3.sat
    model = solver.model()
    return {
        name: (z3.is_true(model.eval(f, model_completion=True)) if is_z3(f) else bool(f))
        for name, f in formulas.items()
    }


# --------------------------------------------------------------- corruptions


def _first(xs):  # noqa: ANN001, ANN202
    return next(iter(xs), None)


def corrupt_ref_cnt(s: Scheduler) -> bool:
    block = _first(b for b in s.block_pool.blocks[1:] if b.ref_cnt > 0) or s.block_pool.blocks[1]
    block.ref_cnt += 1
    return True


def corrupt_free_counter(s: Scheduler) -> bool:
    s.block_pool.free_block_queue.num_free_blocks += 1
    return True


def corrupt_unlink_free_block(s: Scheduler) -> bool:
    block = _first(s.block_pool.free_block_queue)
    if block is None:
        return False
    q = s.block_pool.free_block_queue
    q.remove(block)
    q.num_free_blocks += 1  # the counter still counts it
    return True


def corrupt_computed(s: Scheduler) -> bool:
    req = _first(s.requests.values())
    if req is None:
        return False
    req.num_computed_tokens = req.num_tokens + 1
    return True


def corrupt_status(s: Scheduler) -> bool:
    from schedconf.spec.v1.request import RequestStatus

    req = _first(r for r in s.requests.values() if r.status is RequestStatus.RUNNING)
    if req is None:
        return False
    req.status = RequestStatus.WAITING
    return True


def corrupt_drop_from_running(s: Scheduler) -> bool:
    if not s.running:
        return False
    s.running.pop()
    return True


def corrupt_hash(s: Scheduler) -> bool:
    block = _first(b for b in s.block_pool.blocks[1:] if b.block_hash is not None and b.ref_cnt > 0)
    if block is None:
        return False
    block.block_hash = b"\x00" * 32  # not where the map has it, nor the requests' hash
    return True


def corrupt_scheduled(s: Scheduler) -> bool:
    if s.pending_output is None or not s.requests:
        return False
    rid = _first(r for r in sorted(s.requests) if r not in s.pending_output.num_scheduled_tokens)
    if rid is None:
        s.pending_output.num_scheduled_tokens[_first(sorted(s.pending_output.num_scheduled_tokens))] += 1
    else:
        s.pending_output.num_scheduled_tokens[rid] = 1
    return True


def corrupt_victim(s: Scheduler) -> bool:
    if s.pending_output is None or s.last_step is None or not s.last_step.preemptions:
        return False
    p = s.last_step.preemptions[0]
    ids = [c[0] for c in p.candidates]
    if len(ids) < 2:
        return False
    wrong = ids[(ids.index(p.victim_id) + 1) % len(ids)]
    keys = {c[0]: (c[1], c[2]) for c in p.candidates}
    if p.policy == "priority" and keys[wrong] == keys[p.victim_id]:
        return False
    s.last_step = dataclasses.replace(
        s.last_step,
        preemptions=(PreemptionRecord(p.requester_id, wrong, p.policy, p.candidates), *s.last_step.preemptions[1:]),
    )
    return True


def corrupt_orphan(s: Scheduler) -> bool:
    rid = _first(sorted(s.requests))
    if rid is None:
        return False
    del s.requests[rid]
    return True


CORRUPTIONS: dict[str, Callable[[Scheduler], bool]] = {
    fn.__name__.removeprefix("corrupt_"): fn
    for fn in (
        corrupt_ref_cnt,
        corrupt_free_counter,
        corrupt_unlink_free_block,
        corrupt_computed,
        corrupt_status,
        corrupt_drop_from_running,
        corrupt_hash,
        corrupt_scheduled,
        corrupt_victim,
        corrupt_orphan,
    )
}


def both_backends(sched: Scheduler) -> tuple[dict[str, bool], dict[str, bool], dict[str, bool]]:
    """Truth of every invariant by both backends, and of every lemma by Z3 and in Python."""
    shape = shape_of(sched, NUM_SLOTS)
    snap = from_scheduler(sched, shape)
    sym, invs, lemmas = symbolic_formulas(shape)
    view = ConcreteView(sched)
    # in_flight_accounting is left out: the Z3 state is synchronous and derives a
    # request's in-flight tokens from the pending step, so it cannot see a
    # corrupted counter (spec/symbolic/in_flight.py proves the in-flight rules).
    concrete = {
        name: bool(fn(view, ConcreteOps())) for name, fn in INVARIANTS.items() if name != "in_flight_accounting"
    }
    symbolic = z3_truth({**invs, **{f"lemma:{k}": v for k, v in lemmas.items()}}, sym, snap.state)
    python_lemmas = {f"lemma:{name}": bool(fn(snap.state, ConcreteOps())) for name, fn in LEMMAS.items()}
    return concrete, symbolic, python_lemmas


@settings(max_examples=40)
@given(data=st.data(), config=configs(), corruption=st.one_of(st.none(), st.sampled_from(sorted(CORRUPTIONS))))
def test_backends_agree(data, config, corruption) -> None:
    """ConcreteOps on ConcreteView and Z3Ops on SymbolicView give the same verdicts; lemmas hold when uncorrupted."""
    d = drive(data, config)
    applied = corruption is not None and CORRUPTIONS[corruption](d.sched)
    concrete, symbolic, python_lemmas = both_backends(d.sched)
    for name, value in concrete.items():
        SEEN[(name, value)] += 1
        assert symbolic[name] == value, (
            f"invariant {name}: concrete {value}, Z3 {symbolic[name]} (corruption {corruption if applied else None}; "
            f"program {d.log})"
        )
    for name, value in python_lemmas.items():
        assert symbolic[name] == value, f"{name}: Python {value}, Z3 {symbolic[name]}"
        if not applied:
            assert value, f"{name} fails on a reachable state (program {d.log})"
    if not applied:
        assert all(concrete.values()), f"the model broke an invariant: {concrete} (program {d.log})"


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corruptions_are_detected(corruption: str) -> None:
    """Every corruption kind makes some invariant false, on both backends alike."""
    from schedconf.spec.output import ModelRunnerOutput
    from schedconf.spec.v1.config import SchedulerConfig

    cfg = SchedulerConfig(
        block_size=2,
        num_gpu_blocks=6,
        max_num_batched_tokens=8,
        max_num_seqs=3,
        max_model_len=9,
        policy="priority" if corruption == "victim" else "fcfs",
    )
    sched = Scheduler(cfg, "vllm-0.33")
    sched.add_request("r0", list(range(10, 16)), 8, priority=0, arrival_time=0)
    sched.add_request("r1", list(range(10, 14)), 8, priority=1, arrival_time=1)
    # Grow both until the pool is full, then one more step preempts under pressure.
    for _ in range(8):
        out = sched.schedule()
        if sched.last_step.preemptions:
            break
        sched.update_from_output(out, ModelRunnerOutput({r: (7,) for r, s in sched.last_step.samples.items() if s}))
    if sched.pending_output is None:
        sched.schedule()
    assert CORRUPTIONS[corruption](sched), f"corruption {corruption} could not be applied"
    concrete, symbolic, _ = both_backends(sched)
    assert not all(concrete.values()), f"corruption {corruption} broke no invariant"
    assert {k: symbolic[k] for k in concrete} == concrete
