"""The v0 witness traces: each replays against the v0 reference and really reaches its corner case.

``conformance/traces/vectors/witnesses/v0/<name>.jsonl`` were produced by
``python -m schedconf.spec.symbolic.v0.witnesses --write`` from Z3 witness states. Each
is (1) replayed against the reference adapter (the v0 model), which must
pass, and (2) re-driven into a fresh v0 model while checks written here
(reading only the model and the trace, not ``spec/symbolic``) look for the
corner case the trace claims. A ``symbolic`` test asks Z3 again for every
witness state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import PASS, replay
from schedconf.conformance.sut import add_request_kwargs
from schedconf.conformance.traces.trace import Trace, read_trace
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.schedulers import make_scheduler

WITNESS_DIR = Path(__file__).resolve().parents[2] / "conformance" / "traces" / "vectors" / "witnesses" / "v0"
NAMES = ("swap_out_under_pressure", "never_prompt", "later_prompt_admitted_later")


def drive(trace: Trace) -> list[tuple[dict[str, Any], Any, Any]]:
    """Re-drive the trace into a fresh v0 model: per step (what the model showed before, its output, the model)."""
    sched = make_scheduler(trace.config, trace.profile)
    steps = []
    for event in trace.events:
        kind = event["kind"]
        if kind == "add_request":
            sched.add_request(**add_request_kwargs(event))
        elif kind == "abort":
            sched.abort(event["request_id"])
        elif kind == "step":
            head = sched.waiting[0] if sched.waiting else None
            before = {
                "head": head.request_id if head else None,
                "head_len": head.get_len() if head else 0,
                "free": sched.block_manager.get_num_free_gpu_blocks(),
            }
            steps.append((before, sched.schedule(), sched))
        else:
            sched.update_from_output(
                sched.pending.output,
                ModelRunnerOutput({k: tuple(v) for k, v in event["sampled_token_ids"].items()}, {}),
            )
    return steps


def reaches(name: str, trace: Trace) -> bool:
    cfg = trace.config
    bs, blocks = cfg["block_size"], cfg["num_gpu_blocks"]
    watermark = int(0.01 * blocks)
    steps = drive(trace)
    if name == "swap_out_under_pressure":
        return cfg["preemption_mode"] == "swap" and any(out.blocks_to_swap_out and out.preempted for _, out, _ in steps)
    if name == "never_prompt":
        # Ignored although it fits max_model_len: the pool minus its blocks is below the watermark.
        return any(
            before["head"] in out.ignored_seq_groups
            and before["head_len"] <= cfg["max_model_len"]
            and blocks - -(-before["head_len"] // bs) < watermark
            for before, out, _ in steps
        )
    if name == "later_prompt_admitted_later":
        blocked: set[str] = set()
        for before, out, _ in steps:
            prompts = {g.request_id for g in out.scheduled_seq_groups if g.is_prompt}
            head = before["head"]
            needed = -(-before["head_len"] // bs)
            if head is not None and head not in prompts and before["free"] - needed < watermark <= blocks - needed:
                blocked.add(head)
            if blocked & prompts:
                return True
        return False
    raise KeyError(name)


@pytest.mark.parametrize("name", NAMES)
def test_v0_witness_replays_and_reaches_its_corner(name: str) -> None:
    """The witness trace is a v0 trace, passes against the v0 reference, and reaches the corner it describes."""
    path = WITNESS_DIR / f"{name}.jsonl"
    header = json.loads(path.read_text().splitlines()[0])
    assert header["scheduler"] == "v0" and header["profile"] == "vllm-0.10"
    trace = read_trace(path)
    assert trace.header["origin"] == "symbolic-witness" and trace.header["description"]
    result = replay(trace, ReferenceSut())
    assert result.verdict == PASS, result.divergence
    assert reaches(name, trace), f"{name}: the model never reaches the corner case in {path}"


def test_v0_witness_checks_stay_silent_on_a_plain_trace() -> None:
    """No check fires on a plain run: two short requests, a large pool and budget, swap mode on."""
    from schedconf.conformance.workloads.workload import HashOracle, RequestSpec, Workload, run_workload
    from schedconf.spec.v0.config import V0SchedulerConfig

    config = V0SchedulerConfig(
        block_size=2,
        num_gpu_blocks=16,
        num_cpu_blocks=4,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=16,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        policy="fcfs",
        preemption_mode="swap",
        max_num_partial_prefills=1,
        max_long_partial_prefills=1,
        long_prefill_token_threshold=0,
    )
    workload = Workload(
        config=config,
        profile="vllm-0.10",
        oracle=HashOracle(seed=1, eos_per_mille=0),
        requests=(RequestSpec("a", (11, 12, 13), max_tokens=3), RequestSpec("b", (21, 22, 23, 24, 25), max_tokens=2)),
    )
    trace = run_workload(workload)
    assert [name for name in NAMES if reaches(name, trace)] == []


@pytest.mark.symbolic
@pytest.mark.parametrize("name", NAMES)
def test_z3_still_finds_the_v0_witness(name: str) -> None:
    """Z3 still finds a state for the corner case, and it satisfies every v0 invariant and lemma concretely."""
    from schedconf.spec.ops import ConcreteOps
    from schedconf.spec.symbolic.v0.invariants import INVARIANTS
    from schedconf.spec.symbolic.v0.state import LEMMAS, StateView
    from schedconf.spec.symbolic.v0.witnesses import WITNESSES, find_witness

    found = find_witness(WITNESSES[name], timeout_s=120)
    assert found is not None, f"Z3 finds no state for {name}"
    state, _ = found
    assert all(fn(StateView(state), ConcreteOps()) for fn in INVARIANTS.values())
    assert all(fn(state, ConcreteOps()) for fn in LEMMAS.values())
