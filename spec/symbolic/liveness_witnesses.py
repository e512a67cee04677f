"""Liveness witnesses: workloads that never finish, shown by a lasso and written as golden traces.

Each witness is a small workload (found by :func:`search` over a seeded
generator of tight priority workloads with *tied* ``(priority,
arrival_time)`` keys) on which the reference scheduler reaches a state it has
been in before with requests still live (``spec/symbolic/lasso.py``): from
there the same steps repeat forever. The trace written to
``conformance/traces/vectors/witnesses/<name>.jsonl`` runs the workload until the
repeat has been shown twice (``start + 2 * period`` steps), and its header
says which steps repeat; it replays on the reference like any golden trace.

* ``liveness_thrash_0_11`` (vllm-0.11): the 0.11 rules thrash where 0.32 and
  0.33 finish (finding 8): two requests with one key, a two-block pool. The
  head of ``running`` needs a block; the victim is the *first* request with
  the largest key, itself; it preempts itself and the running loop breaks
  (0.11), so the other request gets nothing this step; next step the
  preempted request is re-admitted at once, because 0.11 has no
  full-sequence admission gate, and the roles swap.
* ``liveness_tie_livelock_0_33`` (vllm-0.33): tied keys defeat 0.33 too, in a
  rarer shape: the request later in ``running`` needs a block and the victim
  (first among the tied) is the request before it, which loses its work; the
  full-sequence gate lets the victim back in at once, and the two alternate,
  each preempted before its prefill completes. This is why the priority
  theorem assumes distinct keys (``LIVENESS.md``).

CLI: ``python -m schedconf.spec.symbolic.liveness_witnesses [--write] [--search PROFILE --seeds A,B]``.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from schedconf.conformance.traces.trace import Trace, write_trace
from schedconf.conformance.workloads.workload import HashOracle, RequestSpec, Workload, respond, run_workload
from schedconf.spec.output import ModelRunnerOutput, SchedulerOutput
from schedconf.spec.symbolic.lasso import Lasso, find_lasso
from schedconf.spec.symbolic.liveness_bound import compute_any_order_bound, compute_work, get_trace_tail
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler

VECTORS = Path(__file__).resolve().parents[2] / "conformance" / "traces" / "vectors" / "witnesses"
MAX_STEPS = 500


def draw_tied_workload(seed: int, profile: str) -> Workload:
    """A tight priority workload whose 2-3 requests all have key ``(0, 0)``, added at step 0 (seeded, deterministic).

    Small pools (the fewest blocks ``max_model_len`` allows, or one more), a
    low long-prefill threshold and no speculative decoding: the shapes where
    tied victims thrash.
    """
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    max_model_len = rng.randint(4, 12)
    blocks = -(-max_model_len // block_size) + rng.choice([0, 0, 1])
    chunked = rng.random() < 0.8
    budget = rng.randint(max_model_len if not chunked else 1, 2 * max_model_len)
    config = SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=blocks + 1,
        max_num_batched_tokens=budget,
        max_num_seqs=rng.randint(1, min(3, budget)),
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=min(rng.choice([0, 1, 2, 3]), max_model_len),
        enable_prefix_caching=rng.random() < 0.5,
        policy="priority",
        num_spec_tokens=0,
        num_lookahead_tokens=rng.choice([0, 0, 1]),
        scheduler_reserve_full_isl=None,
    )
    requests = []
    for i in range(rng.randint(2, 3)):
        length = rng.randint(1, max_model_len - 1)
        requests.append(
            RequestSpec(
                f"r{i}",
                tuple(100 * (i + 1) + j for j in range(length)),
                rng.randint(1, max_model_len),
                priority=0,
                arrival_time=0,
            )
        )
    return Workload(
        config=config,
        profile=profile,
        requests=tuple(requests),
        oracle=HashOracle(seed=seed, eos_per_mille=0),
        seed=seed,
        origin="symbolic-witness",
    )


def find_workload_lasso(workload: Workload, max_steps: int = MAX_STEPS) -> Lasso | None:
    """Add every request of ``workload`` (all at step 0) and look for a lasso (``lasso.find_lasso``)."""
    assert all(r.at_step == 0 and not r.in_flight for r in workload.requests) and not workload.aborts
    sched = Scheduler(workload.config, workload.profile)
    for r in workload.requests:
        sched.add_request(
            r.request_id,
            r.prompt_token_ids,
            r.max_tokens,
            priority=r.priority,
            arrival_time=r.arrival_time,
            eos_token_id=r.eos_token_id,
            ignore_eos=r.ignore_eos,
            stop_token_ids=r.stop_token_ids,
            min_tokens=r.min_tokens,
        )

    def model(output: SchedulerOutput, samples: dict[str, bool]) -> ModelRunnerOutput:
        # HashOracle: token ``pos`` of a request depends on (seed, request, pos) only (lasso.py's premise).
        sampled, drafts = respond(workload.oracle, output, samples, workload.config.num_spec_tokens)
        return ModelRunnerOutput(sampled, drafts)

    return find_lasso(sched, model, max_steps)


def get_steps_to_finish(workload: Workload, profile: str) -> tuple[int | None, int]:
    """Steps ``workload`` takes under ``profile`` after its last input (None: never) and its any-order bound."""
    works = [
        compute_work(len(r.prompt_token_ids), r.max_tokens, workload.config.max_model_len) for r in workload.requests
    ]
    bound = compute_any_order_bound(works)
    if find_workload_lasso(workload.replace(profile=profile)) is not None:
        return None, bound
    trace = run_workload(workload.replace(profile=profile), max_steps=MAX_STEPS)
    return get_trace_tail(trace.events).steps_to_finish, bound


def search(profile: str, seeds: range, contrast: tuple[str, ...] = ()) -> list[tuple[int, Lasso]]:
    """Seeds of :func:`draw_tied_workload` with a lasso under ``profile`` (and that finish under ``contrast``)."""
    found = []
    for seed in seeds:
        workload = draw_tied_workload(seed, profile)
        lasso = find_workload_lasso(workload)
        if lasso is None:
            continue
        if all(get_steps_to_finish(workload, other)[0] is not None for other in contrast):
            found.append((seed, lasso))
    return found


@dataclass(frozen=True)
class LivenessWitness:
    name: str
    profile: str
    seed: int
    """Of :func:`draw_tied_workload` (found by ``search``)."""
    contrast: tuple[str, ...]
    """Other profiles whose outcome on the same workload the description states (finishes in n steps, or loops)."""
    summary: str

    def workload(self) -> Workload:
        return draw_tied_workload(self.seed, self.profile)


WITNESSES: dict[str, LivenessWitness] = {
    w.name: w
    for w in (
        LivenessWitness(
            "liveness_thrash_0_11",
            "vllm-0.11",
            2645,
            ("vllm-0.33", "vllm-0.32"),
            "vllm-0.11 thrashes: two requests with the same (priority, arrival_time), a pool of two blocks. The head of "
            "running needs a block; the victim is the first request with the largest key, itself; it preempts itself "
            "and the running loop breaks, so the other request gets nothing; with no full-sequence admission gate the "
            "preempted request is re-admitted next step and the roles swap.",
        ),
        LivenessWitness(
            "liveness_tie_livelock_0_33",
            "vllm-0.33",
            211,
            ("vllm-0.32",),
            "vllm-0.33 livelocks on tied priority keys: two requests with the same (priority, arrival_time). The "
            "request later in running needs a block and the victim, the first of the tied, is the request before it, "
            "which loses its work; the full-sequence gate lets it back in at once and the two alternate, each "
            "preempted before its prefill completes (why the priority liveness theorem assumes distinct keys).",
        ),
    )
}


def realise(w: LivenessWitness) -> tuple[Trace, Lasso]:
    """Run the witness workload for ``start + 2 * period`` steps and describe the repeat (a golden trace)."""
    workload = w.workload()
    lasso = find_workload_lasso(workload)
    assert lasso is not None, f"{w.name}: no lasso under {w.profile}"
    cap = lasso.start + 2 * lasso.period

    class Capped(Scheduler):
        """Stops the run (reports no work) once ``cap`` steps have run."""

        def has_requests(self) -> bool:
            return self.current_step < cap and super().has_requests()

    trace = run_workload(workload, max_steps=cap, scheduler_class=Capped)
    contrast = []
    for other in w.contrast:
        steps, bound = get_steps_to_finish(workload, other)
        if steps is None:
            contrast.append(f"under {other} it loops as well")
        else:
            contrast.append(f"under {other} the same workload finishes in {steps} steps (liveness bound {bound})")
    trace.header["description"] = (
        f"{w.summary} The scheduler state at the start of step {lasso.start + 1} comes back at the start of step "
        f"{lasso.start + lasso.period + 1} (and {lasso.start + 2 * lasso.period + 1}) with "
        f"{', '.join(lasso.live)} live: steps {lasso.start + 1}-{lasso.start + lasso.period} repeat forever."
        + (" " + _sentence("; ".join(contrast)) if contrast else "")
    )
    return trace, lasso


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def main(argv: list[str] | None = None) -> int:
    """CLI: realise each witness (``--write``: into the corpus), or search for new ones."""
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.spec.symbolic.liveness_witnesses", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--out", default=str(VECTORS))
    parser.add_argument("--search", default="", help="a profile: search draw_tied_workload seeds for lassos")
    parser.add_argument("--seeds", default="0,3000")
    parser.add_argument("--contrast", default="", help="profiles under which a found workload must finish")
    args = parser.parse_args(argv)
    if args.search:
        lo, hi = (int(x) for x in args.seeds.split(","))
        contrast = tuple(p for p in args.contrast.split(",") if p)
        for seed, lasso in search(args.search, range(lo, hi), contrast):
            print(seed, lasso, flush=True)
        return 0
    for w in WITNESSES.values():
        trace, lasso = realise(w)
        print(f"== {w.name} ({w.profile}): {lasso}; {len(trace.events)} events")
        print("   " + trace.header["description"])
        if args.write:
            path = Path(args.out) / f"{w.name}.jsonl"
            write_trace(path, trace)
            print(f"   written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
