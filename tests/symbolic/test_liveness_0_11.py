"""Z3 finds the vllm-0.11 liveness counterexample (``spec/symbolic/liveness_0_11.py``, issue 14 part 2).

* Drift guard, step by step: seeded workloads of the encoding's fragment
  (prefix caching off, no drafts or lookahead, chunked prefill on) run on the
  reference scheduler and on the encoding evaluated on Python ints, under
  vllm-0.11, vllm-0.32 and vllm-0.33, FCFS and priority; the encoded state
  must equal the model's after every step.
* Z3 finds a lasso under the 0.11 rules (2 slots, 6 steps, block size 4,
  at most 2 usable blocks); the found workload loops on the reference
  scheduler (``lasso.find_lasso``): the encoding's lasso is a real one.
* The same query under the 0.33 rules with distinct keys is UNSAT.
* Mutants: the found workload finishes under the 0.11 rules with the
  full-sequence gate added or with 0.33's ``continue`` (encoding run on
  ints); ``deep``: the Z3 query under the gate mutant is UNSAT at the same
  bound, and bigger bounds.

CI cost: about 15-30 s of CPU (two Z3 queries of 5-15 s each on an idle
core; the drift guard 4 s).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from schedconf.conformance.workloads.workload import HashOracle, respond
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.symbolic import liveness_0_11 as L
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler

pytestmark = pytest.mark.symbolic

CI_BOUNDS = L.Bounds(num_slots=2, num_steps=6, block_size=4, max_blocks=2)
TIMEOUT_S = 120.0
WITNESS = (
    Path(__file__).resolve().parents[2]
    / "conformance"
    / "traces"
    / "vectors"
    / "witnesses"
    / "liveness_thrash_0_11.jsonl"
)


def draw_fragment_workload(seed: int, policy: str) -> tuple[SchedulerConfig, L.StepConfig, L.Requests]:
    """A tight workload of the encoding's fragment: 1-3 requests, few blocks, keys often tied."""
    rng = random.Random(seed)
    n = rng.randint(1, 3)
    bs = rng.choice([1, 2, 3, 4])
    mml = rng.randint(2, 10)
    blocks = -(-mml // bs) + rng.choice([0, 0, 1, 2])
    seqs = rng.randint(1, 3)
    budget = rng.randint(seqs, 12)
    threshold = rng.randint(0, mml)
    config = SchedulerConfig(
        block_size=bs,
        num_gpu_blocks=blocks + 1,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        max_model_len=mml,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=False,
        policy=policy,
        num_spec_tokens=0,
        num_lookahead_tokens=0,
    )
    reqs = L.Requests(
        [rng.randint(1, mml - 1) for _ in range(n)],
        [rng.randint(1, 2 * mml) for _ in range(n)],
        [rng.randint(0, 1) for _ in range(n)],
        [rng.randint(0, 1) for _ in range(n)],
    )
    cfg = L.StepConfig(bs, blocks, mml, budget, seqs, threshold, policy)  # type: ignore[arg-type]
    return config, cfg, reqs


def run_side_by_side(seed: int, profile: str, policy: str, max_steps: int = 30) -> dict[str, int]:
    """Step the reference and the encoding together; assert equal states; count the paths taken."""
    config, cfg, reqs = draw_fragment_workload(seed, policy)
    n = len(reqs.num_prompt_tokens)
    sched = Scheduler(config, profile)
    for i in range(n):
        sched.add_request(
            f"r{i}",
            [100 * (i + 1) + j for j in range(reqs.num_prompt_tokens[i])],
            reqs.max_tokens[i],
            priority=reqs.priority[i],
            arrival_time=reqs.arrival_time[i],
        )
    rules = L.get_rules(profile)
    s = L.get_initial_state(reqs, cfg.policy)
    oracle = HashOracle(seed=seed, eos_per_mille=0)
    seen = {"preemptions": 0, "self_preemptions": 0, "victim_scheduled_before": 0, "samples": 0}
    for k in range(max_steps):
        assert L.get_state_key(L.get_model_state(sched, n)) == L.get_state_key(s), (
            f"seed {seed} {profile} {policy} after {k} steps:\n model    {L.render_state(L.get_model_state(sched, n))}"
            f"\n encoding {L.render_state(s)}"
        )
        if not sched.has_unfinished_requests():
            break
        out = sched.schedule()
        assert sched.last_step is not None
        for p in sched.last_step.preemptions:
            seen["preemptions"] += 1
            seen["self_preemptions"] += p.victim_id == p.requester_id
            seen["victim_scheduled_before"] += p.victim_id in out.num_scheduled_tokens
        seen["samples"] += sum(sched.last_step.samples.values())
        sampled, drafts = respond(oracle, out, sched.last_step.samples, 0)
        sched.update_from_output(out, ModelRunnerOutput(sampled, drafts))
        s, flags = L.step(cfg, reqs, rules, s)
        assert not any(flags.values()), flags
    return seen


@pytest.mark.parametrize("profile", ["vllm-0.11", "vllm-0.32", "vllm-0.33"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_encoding_matches_reference(profile: str, policy: str) -> None:
    totals = {"preemptions": 0, "self_preemptions": 0, "victim_scheduled_before": 0, "samples": 0}
    for seed in range(150):
        for key, value in run_side_by_side(seed, profile, policy).items():
            totals[key] += value
    # The guard covers the paths the lasso takes: preemptions, self-preemptions, sampling.
    assert totals["preemptions"] > 20 and totals["self_preemptions"] > 5 and totals["samples"] > 100, totals
    if policy == "priority" and profile == "vllm-0.11":
        # 0.11's un-repaired victim: preempted after it was scheduled in the same step; its tokens stay counted.
        assert totals["victim_scheduled_before"] > 0, totals


def test_guard_catches_a_broken_encoding() -> None:
    """The 0.11 encoding with 0.33's ``continue`` disagrees with the 0.11 reference somewhere."""
    broken = L.get_rules("vllm-0.11", priority_self_preemption="continue")
    failures = 0
    for seed in range(150):
        config, cfg, reqs = draw_fragment_workload(seed, "priority")
        n = len(reqs.num_prompt_tokens)
        sched = Scheduler(config, "vllm-0.11")
        for i in range(n):
            sched.add_request(
                f"r{i}",
                [100 + j for j in range(reqs.num_prompt_tokens[i])],
                reqs.max_tokens[i],
                priority=reqs.priority[i],
                arrival_time=reqs.arrival_time[i],
            )
        s = L.get_initial_state(reqs, "priority")
        oracle = HashOracle(seed=seed, eos_per_mille=0)
        for _ in range(30):
            if L.get_state_key(L.get_model_state(sched, n)) != L.get_state_key(s):
                failures += 1
                break
            if not sched.has_unfinished_requests():
                break
            out = sched.schedule()
            assert sched.last_step is not None
            sampled, drafts = respond(oracle, out, sched.last_step.samples, 0)
            sched.update_from_output(out, ModelRunnerOutput(sampled, drafts))
            s, _ = L.step(cfg, reqs, broken, s)
    assert failures > 0


def test_encoding_reproduces_the_committed_witness() -> None:
    """The seeded witness (period 4 from step 6) is a lasso of the encoding too (Z3 needs k = 10 for it)."""
    lines = [json.loads(x) for x in WITNESS.read_text().splitlines()]
    c = lines[0]["config"]
    adds = [e for e in lines if e["kind"] == "add_request"]
    cfg = L.StepConfig(
        c["block_size"],
        c["num_gpu_blocks"] - 1,
        c["max_model_len"],
        c["max_num_batched_tokens"],
        c["max_num_seqs"],
        c["long_prefill_token_threshold"],
        c["policy"],
    )
    reqs = L.Requests(
        [len(e["prompt_token_ids"]) for e in adds],
        [e["max_tokens"] for e in adds],
        [e["priority"] for e in adds],
        [e["arrival_time"] for e in adds],
    )
    states = L.run_encoded(cfg, reqs, L.get_rules("vllm-0.11"), 10)
    keys = [L.get_state_key(s) for s in states]
    assert keys[6] == keys[10] and keys.index(keys[10]) == 6 and L.is_live(states[10])


@pytest.fixture(scope="module")
def found_0_11() -> L.Found:
    res = L.solve(CI_BOUNDS, "vllm-0.11", "priority", timeout_s=TIMEOUT_S)
    assert res.answer == "sat", res
    assert res.found is not None
    return res.found


def test_z3_finds_a_lasso_under_0_11(found_0_11: L.Found) -> None:
    f = found_0_11
    # The model is the encoding's: replaying it on Python ints gives the same states and the same repeat.
    cfg, reqs = L.get_concrete(f)
    states = L.run_encoded(cfg, reqs, L.get_rules("vllm-0.11"), CI_BOUNDS.num_steps)
    assert [L.get_state_key(s) for s in states] == [L.get_state_key(s) for s in f.states]
    assert L.get_state_key(states[f.start]) == L.get_state_key(states[-1]) and L.is_live(states[-1])
    # It needs a tie: the two requests share their (priority, arrival_time) key.
    assert (f.requests[0]["priority"], f.requests[0]["arrival_time"]) == (
        f.requests[1]["priority"],
        f.requests[1]["arrival_time"],
    )


def test_found_lasso_loops_on_the_reference(found_0_11: L.Found) -> None:
    lasso = L.realise(found_0_11)
    assert lasso is not None and lasso.live == ("r0", "r1")
    # Block ids may permute, so the model's period is a multiple of the encoding's.
    assert lasso.period % found_0_11.period == 0


def test_found_workload_finishes_under_0_33_and_the_mutants(found_0_11: L.Found) -> None:
    cfg, reqs = L.get_concrete(found_0_11)
    for rules in (
        L.get_rules("vllm-0.33"),
        L.get_rules("vllm-0.32"),
        L.get_rules("vllm-0.11", reserve_full_sequence_at_admission=True),
        L.get_rules("vllm-0.11", priority_self_preemption="continue"),
    ):
        states = L.run_encoded(cfg, reqs, rules, 60)
        assert not L.is_live(states[-1]), rules
    from schedconf.spec.symbolic.liveness_witnesses import get_steps_to_finish

    steps, bound = get_steps_to_finish(L.get_workload(found_0_11), "vllm-0.33")
    assert steps is not None and steps <= bound


def test_no_lasso_under_0_33_with_distinct_keys() -> None:
    res = L.solve(CI_BOUNDS, "vllm-0.33", "priority", distinct_keys=True, timeout_s=TIMEOUT_S)
    assert res.answer == "unsat", res


@pytest.mark.deep
def test_full_sequence_gate_mutant_has_no_lasso() -> None:
    """0.11 with the full-sequence gate added: the re-admission that closes the loop is refused."""
    rules = L.get_rules("vllm-0.11", reserve_full_sequence_at_admission=True)
    res = L.solve(CI_BOUNDS, "vllm-0.11", "priority", rules=rules, timeout_s=TIMEOUT_S)
    assert res.answer == "unsat", res


@pytest.mark.deep
@pytest.mark.parametrize(
    "slots,steps,max_blocks,profile,distinct,expected",
    [
        (2, 10, 3, "vllm-0.11", False, "sat"),
        (2, 10, 3, "vllm-0.33", True, "unsat"),
        (2, 10, 3, "vllm-0.32", True, "unsat"),
        (3, 6, 2, "vllm-0.11", False, "sat"),
        (3, 6, 2, "vllm-0.33", True, "unsat"),
    ],
)
def test_deep_bounds(slots: int, steps: int, max_blocks: int, profile: str, distinct: bool, expected: str) -> None:
    """Bigger bounds: 10 steps (the committed witness's k) with up to 3 blocks (80-100 s each), or 3 slots."""
    bounds = L.Bounds(num_slots=slots, num_steps=steps, block_size=4, max_blocks=max_blocks)
    res = L.solve(bounds, profile, "priority", distinct_keys=distinct, timeout_s=600)
    assert res.answer == expected, res
    if res.found:
        lasso = L.realise(res.found)
        assert lasso is not None and lasso.period % res.found.period == 0
