"""v0 witnesses: Z3 finds states that reach named corner cases; each becomes a v0 golden trace.

For each corner case a query asks Z3 for a state that satisfies every v0
invariant and lemma, enables a transition, and makes it reach the corner (a
fact of its outcome). The state's configuration and requests then seed a
small deterministic search over v0 workloads (``schedconf.conformance.workloads.workload``,
profile ``vllm-0.10``), each run on the v0 model, until a detector that reads
only the model (not this package) sees the corner. The trace goes to
``conformance/traces/vectors/witnesses/v0/<name>.jsonl`` (header ``"scheduler":
"v0"``, ``origin`` ``symbolic-witness``, a description of what it shows).

Witnesses:

* ``swap_out_under_pressure``: preemption mode ``swap``; a decode cannot get
  its block, the tail of ``running`` is swapped out to the CPU
  (``running_preempt_swap``);
* ``never_prompt``: ``can_allocate`` says NEVER, so the prompt is finished as
  ignored (``prefill_ignore``). Under the model's config check
  ``max_model_len <= block_size * num_gpu_blocks`` this needs a watermark,
  i.e. at least 100 GPU blocks: the query runs at R=1, B=100;
* ``later_prompt_admitted_later``: ``can_allocate`` says LATER for the head
  of ``waiting`` (``prefill_stop``), which blocks the queue; the prompt is
  admitted in a later step once blocks are freed.

CLI: ``python -m schedconf.spec.symbolic.v0.witnesses [--write] [--only NAME]``.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import z3

from schedconf.conformance.traces.trace import Trace, write_trace
from schedconf.conformance.workloads.workload import HashOracle, RequestSpec, Workload, WorkloadError, run_workload
from schedconf.spec.errors import SpecError
from schedconf.spec.symbolic.v0.proofs import dense_tables, premises
from schedconf.spec.symbolic.v0.state import PROFILE, Shape, State, describe, evaluate, fresh_state
from schedconf.spec.symbolic.v0.transitions import TRANSITIONS
from schedconf.spec.symbolic.z3ops import is_z3
from schedconf.spec.v0.config import V0SchedulerConfig

VECTORS = Path(__file__).resolve().parents[3] / "conformance" / "traces" / "vectors" / "witnesses" / "v0"


# ------------------------------------------------------------------ detectors (read the model only)


def replay_on_model(trace: Trace, on_step: Callable[[Any, Any, dict[str, Any]], str | None]) -> str | None:
    """Re-drive a v0 trace's inputs into a fresh v0 model; ``on_step(sched, output, before)`` after each schedule().

    ``before`` is what the model showed just before the step: the head of
    ``waiting`` and ``can_allocate`` for it. Returns the first description
    ``on_step`` gives.
    """
    from schedconf.conformance.sut import add_request_kwargs
    from schedconf.spec.output import ModelRunnerOutput
    from schedconf.spec.schedulers import make_scheduler

    sched = make_scheduler(trace.config, trace.profile)
    for event in trace.events:
        if "expect_error" in event and event["kind"] != "step":
            continue
        kind = event["kind"]
        if kind == "add_request":
            sched.add_request(**add_request_kwargs(event))
        elif kind == "abort":
            sched.abort(event["request_id"])
        elif kind == "step":
            head = sched.waiting[0] if sched.waiting else None
            before = {
                "head": head.request_id if head else None,
                "head_status": sched.block_manager.can_allocate(head).name if head is not None else None,
                "num_free_gpu": sched.block_manager.get_num_free_gpu_blocks(),
            }
            if "expect_error" in event:
                return None
            note = on_step(sched, sched.schedule(), before)
            if note:
                return note
        else:
            sched.update_from_output(
                sched.pending.output,
                ModelRunnerOutput({k: tuple(v) for k, v in event["sampled_token_ids"].items()}, {}),
            )
    return None


def detect_swap_out(sched: Any, out: Any, before: dict[str, Any]) -> str | None:
    if out.blocks_to_swap_out and not out.blocks_to_swap_in:
        return (
            f"step {out.step}: a decode could not get a block; {out.preempted} group(s) swapped out to the CPU, "
            f"blocks (gpu, cpu) {[list(p) for p in out.blocks_to_swap_out]}"
        )
    return None


def detect_never(sched: Any, out: Any, before: dict[str, Any]) -> str | None:
    cfg = sched.config
    if out.ignored_seq_groups and before["head"] in out.ignored_seq_groups and before["head_status"] == "NEVER":
        return (
            f"step {out.step}: {before['head']} is ignored: can_allocate says NEVER (num_gpu_blocks "
            f"{cfg.num_gpu_blocks} minus the blocks it needs is below the watermark {cfg.watermark_blocks})"
        )
    return None


class LaterThenAdmitted:
    """Sees a head of ``waiting`` blocked by LATER in one step and admitted as a prompt in a later one."""

    def __init__(self) -> None:
        self.blocked: dict[str, int] = {}

    def __call__(self, sched: Any, out: Any, before: dict[str, Any]) -> str | None:
        head = before["head"]
        prompts = [g.request_id for g in out.scheduled_seq_groups if g.is_prompt]
        if head is not None and before["head_status"] == "LATER" and head not in prompts:
            self.blocked.setdefault(head, out.step)
        for rid in prompts:
            if rid in self.blocked:
                return (
                    f"step {self.blocked[rid]}: {rid} heads waiting but can_allocate says LATER (too few free GPU "
                    f"blocks), so nothing behind it is admitted; step {out.step}: blocks were freed and {rid} is "
                    f"admitted"
                )
        return None


# ------------------------------------------------------------------ witnesses


@dataclass(frozen=True)
class Witness:
    name: str
    transition: str
    fact: str | None
    shape: Shape
    description: str
    detector: Callable[[], Callable[[Any, Any, dict[str, Any]], str | None]]
    extra: Callable[[State], list[Any]] = field(default=lambda s: [])


def _swap_extra(s: State) -> list[Any]:
    return [s.swap_mode, s.max_model_len <= 8]


def _never_extra(s: State) -> list[Any]:
    return [s.max_model_len <= 120, s.num_running() == 0]


WITNESSES: dict[str, Witness] = {
    w.name: w
    for w in (
        Witness(
            "swap_out_under_pressure",
            "running_preempt_swap",
            None,
            Shape(3, 4, 4, 2),
            "Swap-out under memory pressure (preemption_mode swap): a decode needs a block, none is free, and the "
            "tail of running is swapped out to the CPU (blocks_to_swap_out) instead of being recomputed.",
            lambda: detect_swap_out,
            _swap_extra,
        ),
        Witness(
            "never_prompt",
            "prefill_ignore",
            "never",
            Shape(1, 100, 0, 1),
            "A NEVER prompt: with 100 GPU blocks the watermark is int(0.01 * 100) = 1 block, so a prompt needing "
            "all 100 blocks can never be allocated (num_gpu_blocks - required < watermark) and is finished as "
            "ignored (FINISHED_IGNORED, finish_reason length), although max_model_len = block_size * num_gpu_blocks "
            "admits it.",
            lambda: detect_never,
            _never_extra,
        ),
        Witness(
            "later_prompt_admitted_later",
            "prefill_stop",
            "later",
            Shape(3, 4, 4, 2),
            "A LATER prompt: the head of waiting needs more GPU blocks than are free, can_allocate says LATER and "
            "the prefill loop stops there (head-of-line blocking); once running requests finish and free their "
            "blocks, it is admitted.",
            lambda: LaterThenAdmitted(),
        ),
    )
}


def find_witness(w: Witness, timeout_s: float = 120.0) -> tuple[State, dict[str, Any]] | None:
    """A state (Python values) satisfying the invariants and lemmas where ``w.transition`` reaches ``w.fact``."""
    pre = fresh_state(w.shape, "w")
    out = TRANSITIONS[w.transition].apply(pre, {})
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(*premises(pre), *dense_tables(pre))
    solver.add(*[c if is_z3(c) else z3.BoolVal(bool(c)) for c in [out.guard, *out.premises, *w.extra(pre)]])
    if w.fact is not None:
        solver.add(out.facts[w.fact])
    if solver.check() != z3.sat:
        return None
    model = solver.model()
    facts = {k: model.eval(v, model_completion=True) if is_z3(v) else v for k, v in out.facts.items()}
    return evaluate(pre, model), facts


def _config_of(s: State, rng: random.Random | None) -> V0SchedulerConfig:
    sh = s.shape
    mml = s.max_model_len
    mnbt = s.max_num_batched_tokens if rng is None else max(mml, s.max_num_batched_tokens + rng.choice([0, 0, 2, 8]))
    seqs = s.max_num_seqs if rng is None else rng.randint(1, max(1, min(4, mnbt)))
    return V0SchedulerConfig(
        block_size=sh.block_size,
        num_gpu_blocks=sh.num_blocks,
        num_cpu_blocks=sh.num_cpu_blocks,
        max_num_batched_tokens=mnbt,
        max_num_seqs=seqs,
        max_model_len=mml,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        policy="fcfs",
        preemption_mode="swap" if s.swap_mode else None,
        max_num_partial_prefills=1,
        max_long_partial_prefills=1,
        long_prefill_token_threshold=0,
    )


def candidate_workloads(w: Witness, s: State, tries: int) -> Any:
    """Workloads seeded by the witness state: its config and live requests, then deterministic variations."""
    rng = random.Random(f"v0-witness:{w.name}")
    live = [r for r in s.shape.slots if s.live(r)]
    for attempt in range(tries):
        jitter = attempt > 0
        config = _config_of(s, rng if jitter else None)
        specs = []
        for i, r in enumerate(live):
            n = s.num_tokens[r]  # a recomputed group re-prefills all its tokens: one prompt of that length
            if jitter:
                n = max(1, min(config.max_model_len, n + rng.choice([-2, -1, 0, 0, 1, 2])))
            max_tokens = s.max_tokens[r] if not jitter else rng.randint(1, 2 * config.max_model_len)
            specs.append(
                RequestSpec(
                    f"r{i}",
                    tuple(10 + (7 * i + j) % 40 for j in range(n)),
                    max_tokens=max(1, max_tokens),
                    at_step=0 if not jitter else rng.choice([0, 0, 1, 2]),
                )
            )
        if jitter and rng.random() < 0.5:
            n = rng.randint(1, config.max_model_len)
            specs.append(
                RequestSpec(
                    f"r{len(specs)}",
                    tuple(50 + j % 10 for j in range(n)),
                    max_tokens=rng.randint(1, 2 * config.max_model_len),
                    at_step=rng.randint(0, 3),
                )
            )
        yield Workload(
            config=config,
            profile=PROFILE,
            requests=tuple(specs),
            oracle=HashOracle(seed=rng.randint(0, 10**6), eos_per_mille=0),
            seed=attempt,
            origin="symbolic-witness",
            description=w.description,
        )


def realise(w: Witness, s: State, tries: int = 300) -> tuple[Trace, str] | None:
    """The first candidate trace in which the model reaches the corner, with the detector's note."""
    for workload in candidate_workloads(w, s, tries):
        try:
            trace = run_workload(workload, max_steps=200, check=True)
        except (SpecError, WorkloadError, ValueError):
            continue
        note = replay_on_model(trace, w.detector())
        if note:
            trace.header["origin"] = "symbolic-witness"
            trace.header["description"] = f"{w.description} Here: {note}."
            return trace, note
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.spec.symbolic.v0.witnesses", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--out", default=str(VECTORS))
    args = parser.parse_args(argv)
    status = 0
    for name in [n for n in args.only.split(",") if n] or list(WITNESSES):
        w = WITNESSES[name]
        print(f"== {name}: {w.description}")
        found = find_witness(w)
        if found is None:
            print("   Z3 found no state")
            status = 1
            continue
        state, facts = found
        print("\n".join("     " + line for line in describe(state).splitlines()))
        realised = realise(w, state)
        if realised is None:
            print("   no workload reaching it was found")
            status = 1
            continue
        trace, note = realised
        print(f"   trace: {len(trace.events)} events; {note}")
        if args.write:
            path = Path(args.out) / f"{name}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_trace(path, trace)
            print(f"   written to {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
