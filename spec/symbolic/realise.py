"""Turn a symbolic state into a trace: search small workloads seeded by it.

A state Z3 found (a witness or a counterexample) satisfies the invariants but
need not be reachable as it stands. To show the same behaviour from an empty
scheduler, its configuration and live requests (prompt lengths, which blocks
they share, keys, ``max_tokens``) seed a deterministic search over workloads:
first the requests as they are, all arriving at step 0, then variations
(arrival steps, lengths, ``max_tokens``, one request more, the token budget).
Each candidate runs through ``schedconf.conformance.workloads.workload.run_workload``; the first
whose trace an ``accept`` function approves wins.

Prompt tokens realise the state's shared blocks: block ``i`` of a request
gets tokens derived from its abstract hash, so requests whose hashes agree on
a block share that block's tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import replace

from schedconf.conformance.traces.trace import Trace
from schedconf.conformance.workloads.workload import (
    AbortSpec,
    HashOracle,
    RequestSpec,
    Workload,
    apply_trace_event,
    run_workload,
)
from schedconf.spec.errors import SpecError
from schedconf.spec.symbolic.state import State, config_of, slot_id

PROFILE = "vllm-0.33"


def requests_like(state: State, rng: random.Random, jitter: bool) -> list[RequestSpec]:
    """Requests like the state's live ones; with ``jitter``, lengths and ``max_tokens`` vary."""
    sh = state.shape
    bs = sh.block_size
    specs = []
    for r in sh.slots:
        if not state.live(r):
            continue
        n = state.num_tokens[r]
        if jitter:
            n = max(1, min(state.max_model_len - 1, n + rng.choice([-bs, -1, 0, 0, 1, bs])))
        prompt = []
        for i in range(n):
            block = i // bs
            if block < n // bs and block < sh.num_blocks:
                prompt.append(10 + (state.hashes[r][block] * 7 + i % bs) % 50)
            else:
                prompt.append(60 + r)
        max_tokens = state.max_tokens[r] if not jitter else rng.randint(1, 2 * state.max_model_len)
        specs.append(
            RequestSpec(
                slot_id(r),
                tuple(prompt),
                max_tokens=max(1, max_tokens),
                priority=state.priority[r],
                arrival_time=state.arrival_time[r],
            )
        )
    return specs


def candidate_workloads(
    state: State, label: str, description: str, seed: int = 0, tries: int = 400, with_abort: bool = False
) -> Iterator[Workload]:
    """Workloads seeded by ``state``: its config and requests, then deterministic variations.

    With ``with_abort`` every candidate also aborts one of its requests after a few steps.
    """
    rng = random.Random(f"{label}:{seed}")
    base_config = config_of(state)
    for attempt in range(tries):
        jitter = attempt > 0
        config = base_config
        specs = requests_like(state, rng, jitter)
        if not specs:
            return
        if jitter:
            specs = [replace(sp, at_step=rng.choice([0, 0, 0, 1, 2, 3])) for sp in specs]
            if config.policy == "priority" and rng.random() < 0.5:
                specs = [replace(sp, priority=rng.randint(0, 3), arrival_time=rng.randint(0, 6)) for sp in specs]
            if rng.random() < 0.3:
                extra = rng.choice(specs)
                specs.append(
                    replace(
                        extra,
                        request_id=f"{extra.request_id}b",
                        at_step=rng.randint(0, 4),
                        priority=rng.randint(0, 3),
                        arrival_time=rng.randint(0, 6),
                    )
                )
            low = config.max_model_len if not config.enable_chunked_prefill else config.max_num_seqs
            choice = rng.random()
            if choice < 0.2:
                config = replace(config, max_num_batched_tokens=rng.randint(low, max(low, 8)))
            elif choice < 0.4 and len(specs) >= 2:
                # A budget equal to the demand of some of the requests.
                demand = sum(len(sp.prompt_token_ids) for sp in rng.sample(specs, rng.randint(2, len(specs))))
                config = replace(config, max_num_batched_tokens=max(low, demand))
        oracle = HashOracle(seed=rng.randint(0, 10**6), eos_per_mille=0)
        aborts = (AbortSpec(rng.choice(specs).request_id, rng.randint(1, 4)),) if with_abort else ()
        yield Workload(
            config=config,
            profile=PROFILE,
            requests=tuple(specs),
            aborts=aborts,
            oracle=oracle,
            seed=seed,
            origin="symbolic",
            description=description,
        )


def search(
    state: State,
    label: str,
    description: str,
    accept: Callable[[Trace], str | None],
    tries: int = 400,
    with_abort: bool = False,
) -> tuple[Trace, str] | None:
    """The first candidate trace ``accept`` approves, with its note; None if none in ``tries``."""
    for workload in candidate_workloads(state, label, description, tries=tries, with_abort=with_abort):
        try:
            trace = run_workload(workload, max_steps=200, check=False)
        except (SpecError, ValueError):
            continue  # a variation the model refuses: try the next
        note = accept(trace)
        if note:
            return trace, note
    return None


def truncate_at_violation(trace: Trace, invariant: str, kinds: tuple[str, ...]) -> tuple[Trace, str] | None:
    """Replay ``trace`` on the model checking every invariant; cut it after the first event of one of
    ``kinds`` that violates ``invariant`` (None if that never happens)."""
    from schedconf.spec.ops import ConcreteOps
    from schedconf.spec.v1.config import SchedulerConfig
    from schedconf.spec.v1.invariants import INVARIANTS
    from schedconf.spec.v1.scheduler import Scheduler
    from schedconf.spec.v1.view import ConcreteView

    sched = Scheduler(SchedulerConfig.from_dict(trace.config), trace.profile)
    for index, event in enumerate(trace.events):
        kind = event["kind"]
        apply_trace_event(sched, event)
        view = ConcreteView(sched)
        broken = [name for name, fn in INVARIANTS.items() if not fn(view, ConcreteOps())]
        if broken:
            if invariant in broken and kind in kinds:
                ops = ConcreteOps()
                INVARIANTS[invariant](view, ops)
                subject = " / ".join(reversed(ops.failures)) or "the step as a whole"
                note = f"{invariant} is violated by {subject} after event {index + 1} ({kind})."
                return Trace(header=dict(trace.header), events=trace.events[: index + 1]), note
            return None
    return None
