"""The kill campaign: every mutant must be caught, and its failure shrunk small.

For each mutant, generated workloads (the seeded generator of the mutant's
profile, ``schedconf.conformance.workloads.workload_v0.make_random_workload``, as ``schedconf run``
draws them: the same workloads on every machine and Hypothesis version) are
tried in order until one kills it, by either check:

* ``differential``: the trace made by the reference, replayed on the mutant
  (strict comparison), diverges;
* ``invariant <name>``: the mutant, run on the workload by itself, breaks an
  invariant of spec/v1/invariants.py (a v0 mutant: of spec/v0/invariants.py).

A v0 mutant (profile ``vllm-0.10``) is tried on v0 workloads, differentially
against the v0 reference and on its own under the v0 invariants
(:func:`run_model`).

The first few failures are shrunk and the smallest is kept. Reported per
mutant: which check killed it, seconds to the first kill, traces tried, and
the event count of the minimal trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedconf.conformance.checking.compare import Divergence
from schedconf.conformance.checking.mutants import MUTANTS, Mutant, MutantSut
from schedconf.conformance.checking.replay import PASS, replay
from schedconf.conformance.checking.shrink import ShrinkResult, shrink_trace, shrink_workload
from schedconf.conformance.traces.trace import Trace
from schedconf.conformance.workloads.workload import Workload, WorkloadError, is_v0_profile, run_workload
from schedconf.spec.errors import InvariantViolation
from schedconf.spec.v1.scheduler import Scheduler


def run_model(
    workload: Workload, scheduler_class: type[Any] | None = None, check: bool = False, max_steps: int = 10_000
) -> Trace:
    """Run the workload on one model, the reference (None) or a mutant's class, and record the trace.

    With ``check`` every invariant of the model's kind is checked after each
    call. Both kinds go through :func:`schedconf.conformance.workloads.workload.run_workload`;
    its v0 loop builds the model with ``schedconf.spec.schedulers.make_scheduler`` and
    checks the model's own ``check_invariants()``: for this run that factory
    builds ``scheduler_class`` and gives the model a ``check_invariants``
    running spec/v0/invariants.py.
    """
    if not is_v0_profile(workload.profile):
        return run_workload(workload, max_steps=max_steps, check=check, scheduler_class=scheduler_class or Scheduler)
    import schedconf.spec.schedulers as schedulers
    from schedconf.spec.v0.invariants import check_invariants
    from schedconf.spec.v0.scheduler import Scheduler as V0Scheduler

    model_class: type[Any] = scheduler_class or V0Scheduler  # a mutant subclass, or the v0 model
    factory = schedulers.make_scheduler

    def make_model(config_dict: dict[str, Any], profile: str) -> Any:
        sched = model_class(schedulers.make_config(config_dict, profile), profile)
        if check:
            sched.check_invariants = lambda: check_invariants(sched)
        return sched

    schedulers.make_scheduler = make_model  # type: ignore[assignment]
    try:
        return run_workload(workload, max_steps=max_steps, check=check)
    finally:
        schedulers.make_scheduler = factory


@dataclass
class KillRow:
    mutant: str
    bug: str
    killed: bool
    killed_by: str = "-"
    seconds_to_kill: float | None = None
    traces_tried: int = 0
    traces_to_kill: int | None = None
    shrunk_events: int | None = None
    minimal_trace: Trace | None = None


def get_campaign_workload(seed: int, profile: str) -> Workload:
    """The campaign's workload ``seed`` for ``profile`` (v0's generator for a v0 profile, as ``schedconf run``)."""
    from schedconf.conformance.workloads.workload_v0 import make_random_workload

    return make_random_workload(seed, profile)


def invariant_probe(mutant: Mutant, invariant: str):  # noqa: ANN201
    """A shrink probe: the mutant run by itself breaks ``invariant``."""

    def probe(workload: Workload) -> tuple[Trace, Divergence] | None:
        try:
            run_model(workload, mutant.scheduler_class, check=True, max_steps=2_000)
        except InvariantViolation as exc:
            if exc.invariant != invariant:
                return None
            try:
                trace = run_model(workload, max_steps=2_000)
            except Exception:  # noqa: BLE001
                return None
            # The violation shows at the mutant's step ``exc.step``: keep the
            # reference trace up to the end of that step.
            events, steps = [], 0
            for e in trace.events:
                events.append(e)
                if e["kind"] == "step":
                    steps += 1
                if steps >= exc.step and e["kind"] == "step":
                    break
            div = Divergence(
                event_index=len(events) - 1, line=len(events) + 1, step=exc.step, kind="invariant", message=exc.message
            )
            return Trace(header=dict(trace.header), events=events), div
        except Exception:  # noqa: BLE001 - any other crash is not this kill
            return None
        return None

    return probe


def kill_one(mutant: Mutant, examples: int, shrink_budget_s: float, seed: int = 0, max_failures: int = 5) -> KillRow:
    """Try workloads until the mutant is killed; shrink up to ``max_failures`` of its failures."""
    sut = MutantSut(mutant)
    row = KillRow(mutant=mutant.name, bug=mutant.bug, killed=False)
    t0 = time.monotonic()
    failures: list[tuple[str, Trace | Workload]] = []

    def visit(workload: Workload) -> bool:
        row.traces_tried += 1
        try:
            trace = run_workload(workload)
        except WorkloadError:
            return False
        result = replay(trace, sut, "strict")
        if result.verdict != PASS and result.divergence is not None:
            failures.append(("differential " + result.divergence.section(), trace))
        elif _reference_keeps_invariants(workload):
            # Only a violation the reference itself does not commit counts
            # (vllm-0.11 breaks some invariants by design).
            try:
                run_model(workload, mutant.scheduler_class, check=True)
            except InvariantViolation as exc:
                failures.append((f"invariant {exc.invariant}", workload))
            except Exception as exc:  # noqa: BLE001
                failures.append((f"crash {type(exc).__name__}", workload))
        if failures and row.seconds_to_kill is None:
            row.seconds_to_kill = round(time.monotonic() - t0, 3)
            row.traces_to_kill = row.traces_tried
            row.killed = True
            row.killed_by = failures[0][0]
        return len(failures) >= max_failures

    for i in range(examples):
        if visit(get_campaign_workload(seed * 1_000_003 + i, mutant.profile)):
            break
    best: ShrinkResult | None = None
    deadline = time.monotonic() + shrink_budget_s

    def size(item: Trace | Workload) -> int:
        if isinstance(item, Trace):
            return len(item.events)
        return sum(len(r.prompt_token_ids) + r.max_tokens for r in item.requests)

    # Smallest failures first; stop once one shrinks to the 10-event target.
    queue = sorted(failures, key=lambda f: size(f[1]))
    for kind, item in queue:
        left = deadline - time.monotonic()
        if left <= 0.5:
            break
        share = left
        try:
            if isinstance(item, Trace):
                res = shrink_trace(item, sut, "strict", time_budget_s=share)
            elif kind.startswith("invariant "):
                res = shrink_workload(item, invariant_probe(mutant, kind.split()[1]), time_budget_s=share)
            else:
                continue
        except ValueError:
            continue
        if best is None or res.num_events < best.num_events:
            best = res
        if best.num_events <= 10:
            break  # small enough: the target of the project
    if best is not None:
        row.shrunk_events = best.num_events
        row.minimal_trace = best.trace
    return row


def _reference_keeps_invariants(workload: Workload) -> bool:
    try:
        run_model(workload, check=True)
    except InvariantViolation:
        return False
    except Exception:  # noqa: BLE001
        return False
    return True


def kill_all(
    examples: int = 2000,
    shrink_budget_s: float = 20.0,
    names: list[str] | None = None,
    seed: int = 0,
    on_progress: Callable[[str], None] | None = None,
) -> list[KillRow]:
    """Run :func:`kill_one` on each mutant (all, or ``names``), saying each result through ``on_progress``."""
    chosen = names or list(MUTANTS)
    rows = []
    for number, name in enumerate(chosen, 1):
        if on_progress:
            on_progress(f"[{number}/{len(chosen)}] {name} ({MUTANTS[name].profile}) ...")
        row = kill_one(MUTANTS[name], examples, shrink_budget_s, seed)
        if on_progress:
            on_progress(f"[{number}/{len(chosen)}] {name}: {'killed' if row.killed else 'SURVIVED'}")
        rows.append(row)
    return rows


def render_mutant_list(names: list[str] | None = None) -> str:
    """One line per mutant: its name, the profile its campaigns run, the bug it stands for."""
    chosen = names or list(MUTANTS)
    width = max(len(n) for n in chosen)
    profile_width = max(len(MUTANTS[n].profile) for n in chosen)
    return "\n".join(f"{n.ljust(width)}  {MUTANTS[n].profile.ljust(profile_width)}  {MUTANTS[n].bug}" for n in chosen)


def render_kill_table(rows: list[KillRow]) -> str:
    lines = [
        "| mutant | real bug | killed by | time to kill | traces to kill | shrunk trace (events) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = f"{r.seconds_to_kill:.2f} s" if r.seconds_to_kill is not None else "SURVIVED"
        lines.append(
            f"| `{r.mutant}` | {r.bug} | {r.killed_by} | {t} | {r.traces_to_kill or r.traces_tried} "
            f"| {r.shrunk_events or '-'} |"
        )
    return "\n".join(lines)
