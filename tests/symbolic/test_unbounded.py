"""Safety for every pool size: the skeleton's micro-steps (``spec/symbolic/unbounded.py``).

``-m symbolic`` proves every micro-step of both policies for all R and B, and
checks the proofs have teeth: a deliberately false rule and each mutant of
``conformance/checking/mutants.py`` whose broken rule lives in the skeleton make a
proof fail. The default run ties the skeleton to the model: every transition
of the drift guard's random programs (encoding checked against the model) must
be a sequence of enabled micro-steps reaching the abstraction of its result.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedconf.spec.symbolic.drive import python_evaluator
from schedconf.spec.symbolic.unbounded import (
    FAILED,
    FALSE_RULES,
    MUTANTS,
    POLICY_STEPS,
    PROVED,
    RefinementError,
    abstract,
    check_refinement,
    prove_all_steps,
    prove_step,
    refining,
)
from tests.symbolic.conftest import configs
from tests.symbolic.test_drift_guard import run_program

TIMEOUT_S = 60.0


@pytest.mark.symbolic
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_every_micro_step_preserves_the_rules_for_all_sizes(policy: str) -> None:
    """Inv and guard imply the frame conditions and Inv after, for every R and B, each micro-step."""
    results = prove_all_steps(policy, TIMEOUT_S, workers=2)
    assert [r.step for r in results] == POLICY_STEPS[policy]
    for r in results:
        bad = {g: s for g, s in r.goals.items() if s != PROVED and g != "satisfiable premises"}
        assert r.status in (PROVED,) or not bad, f"{r.step} ({policy}): {r.status} {bad}"


@pytest.mark.symbolic
@pytest.mark.parametrize(("rule", "step"), [("free_block_left", "pop_block"), ("seat_left", "admit")])
def test_false_rule_fails(rule: str, step: str) -> None:
    """A rule that does not hold (a free block always left; a seat always empty) is refuted by the step that breaks it."""
    res = prove_step(step, "fcfs", TIMEOUT_S, extra={rule: FALSE_RULES[rule]})
    assert res.goals.get(f"inv:{rule}") == FAILED, res.goals


MUTANT_STEPS = {
    "priority_victim_min": ("priority", "scan_end", "inv:victim_order"),
    "fcfs_victim_head": ("fcfs", "record_fcfs", "inv:victim_order"),
    "budget_not_restored": ("priority", "unschedule", "inv:token_budget"),
}
"""Where each mutant's broken rule lives: (policy, the micro-step it changes or that relies on it, the rule)."""


@pytest.mark.symbolic
@pytest.mark.parametrize("mutant", MUTANTS)
def test_mutant_fails(mutant: str) -> None:
    """Each mutant in the skeleton's reach breaks the proof of the rule it breaks in the model.

    (``priority_victim_min`` changes ``scan_next``; the scan invariant it breaks is a premise, so the
    proof that fails is that of ``scan_next``'s own lemma or ``scan_end``'s victim order.)
    """
    policy, step, rule = MUTANT_STEPS[mutant]
    results = {
        s: prove_step(s, policy, TIMEOUT_S, mutant=mutant) for s in (step, "scan_next") if s in POLICY_STEPS[policy]
    }
    failed = {s: g for s, r in results.items() for g, v in r.goals.items() if v == FAILED}
    assert failed, f"{mutant}: nothing fails: {[(s, r.status) for s, r in results.items()]}"
    if mutant != "priority_victim_min":
        assert results[step].goals.get(rule) == FAILED, results[step].goals


SEEN: dict[str, set[tuple[str, ...]]] = {}


@settings(max_examples=60)
@given(data=st.data(), config=configs())
def test_transitions_refine_the_skeleton(data: st.DataObject, config: Any) -> None:
    """Random programs (the drift guard's): every enabled transition is a sequence of enabled micro-steps."""
    run_program(data, config, refining(python_evaluator, SEEN), max_events=20)


def test_refinement_has_teeth() -> None:
    """A transition whose result breaks a skeleton rule (budget not given back) is refused."""
    from schedconf.spec.symbolic.state import from_scheduler, shape_of
    from schedconf.spec.v1.scheduler import Scheduler
    from tests.symbolic.conftest import NUM_SLOTS

    sched = Scheduler(_tight_config(), "vllm-0.33")
    sched.add_request("r0", [5, 6, 7], 4, priority=0, arrival_time=0)
    sched.schedule()
    shape = shape_of(sched, NUM_SLOTS)
    pre = from_scheduler(sched, shape).state
    assert abstract(pre).total > 0
    # "Give back" the tokens without restoring the budget: no micro-step sequence explains it.
    post = pre.replace(num_scheduled=[0] * shape.num_reqs)
    with pytest.raises(RefinementError):
        check_refinement("abort_pending", pre, post)


def _tight_config() -> Any:
    from schedconf.spec.v1.config import SchedulerConfig

    return SchedulerConfig(
        block_size=2,
        num_gpu_blocks=5,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=8,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=0,
        enable_prefix_caching=True,
        policy="fcfs",
        num_lookahead_tokens=0,
    )
