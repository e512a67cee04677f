"""Whole-engine conformance: the engine's own tokens drive the reference scheduler in lockstep.

The harness side of our engine (``impl/``), kept out of ``impl/`` so that the
engine does not know it is being checked; it lives in ``gpu_checks/`` because
it drives the torch engine (on the CPU or a GPU: ``--device``) and
``gpu_checks/engine_gpu.py`` runs it as its first stage.

``check_engine(workload, model)`` runs the workload's requests, aborts and
invalid inputs through :class:`schedconf.impl.engine.Engine` (the real model produces
the tokens and the n-gram drafter the drafts) and, step by step, through the
reference ``schedconf.spec.v1.scheduler.Scheduler``, which is fed exactly the tokens and
drafts the engine produced. It checks:

1. every SchedulerOutput is equal in the strict canonical form (block ids and
   list orders), and so is the free queue after every ``schedule()``;
2. every step's request outputs are equal (tokens kept, finish and stop
   reasons, order); invalid inputs are refused by both with the same code;
3. at the end, every request's tokens equal the dense, unbatched, cache-free
   greedy generation of the same model (``impl/dense.py``): all of them for a
   request that stopped (same finish reason), the generated prefix for an
   aborted one.

Greedy choices whose top-2 margin is below the tie threshold are reported as
near ties, on either side; a token mismatch at a near tie is reported as
such, never hidden. The run is also recorded as a trace (the reference's
outputs as the expectations), which any scheduler can replay.

Command line::

    python -m schedconf.gpu_checks.engine_check [--seeds 0:20] [--corpus DIR] [--examples]
                                      [--model tiny] [--device cpu] [--dtype float64] [--traces OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from schedconf.conformance.adapters.impl import canonical_request_outputs
from schedconf.conformance.sut import add_request_kwargs
from schedconf.conformance.traces.trace import Trace, make_header, read_trace, write_trace
from schedconf.conformance.workloads.workload import AbortSpec, InvalidInput, RequestSpec, Workload, workload_from_trace
from schedconf.impl.dense import dense_generate
from schedconf.impl.engine import Engine
from schedconf.impl.model import DTYPES, MODEL_CONFIGS, LlamaModel
from schedconf.impl.sampling import NearTie
from schedconf.spec.errors import EngineCrash, InvalidEvent
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.scheduler import Scheduler


@dataclass
class EngineCheckReport:
    """The outcome of one workload."""

    name: str
    steps: int = 0
    divergence: str | None = None
    token_mismatches: list[str] = field(default_factory=list)
    near_ties: list[NearTie] = field(default_factory=list)
    num_requests: int = 0
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_drafts_proposed: int = 0
    num_drafts_accepted: int = 0
    num_repaired_tokens: int = 0
    min_margin: float = float("inf")
    """The smallest top-2 logit margin of any greedy choice of the dense oracle."""
    seconds: float = 0.0
    trace: Trace | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None and not self.token_mismatches

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "steps": self.steps,
            "divergence": self.divergence,
            "token_mismatches": self.token_mismatches,
            "near_ties": [t.__dict__ for t in self.near_ties],
            "num_requests": self.num_requests,
            "num_generated_tokens": self.num_generated_tokens,
            "num_preemptions": self.num_preemptions,
            "num_drafts_proposed": self.num_drafts_proposed,
            "num_drafts_accepted": self.num_drafts_accepted,
            "num_repaired_tokens": self.num_repaired_tokens,
            "min_margin": self.min_margin if self.min_margin != float("inf") else None,
            "seconds": round(self.seconds, 3),
        }


def _timed_inputs(workload: Workload) -> list[tuple[int, int, object]]:
    """Every input as (at_step, order, input); at one step: arrivals, invalid inputs, aborts
    (the order ``schedconf.conformance.workloads.workload.run_workload`` applies them in)."""
    items: list[tuple[int, int, object]] = [(r.at_step, i, r) for i, r in enumerate(workload.requests)]
    base = len(items)
    items += [(v.at_step, base + i, v) for i, v in enumerate(workload.invalid_inputs)]
    base = len(items)
    items += [(a.at_step, base + i, a) for i, a in enumerate(workload.aborts)]
    items.sort(key=lambda t: (t[0], t[1]))
    return items


def _apply(engine: Engine, ref: Scheduler, item: object) -> tuple[dict[str, Any], str | None]:
    """Apply one input to both; return its trace event and a divergence message, if any."""
    if isinstance(item, RequestSpec):
        for target in (ref, engine):
            target.add_request(
                item.request_id,
                item.prompt_token_ids,
                item.max_tokens,
                priority=item.priority,
                arrival_time=item.arrival_time,
                eos_token_id=item.eos_token_id,
                ignore_eos=item.ignore_eos,
                stop_token_ids=item.stop_token_ids,
                min_tokens=item.min_tokens,
            )
        return item.to_event(), None
    if isinstance(item, AbortSpec):
        ref.abort(item.request_id)
        engine.abort(item.request_id)
        return {"kind": "abort", "request_id": item.request_id}, None
    assert isinstance(item, InvalidInput)
    event = dict(item.event)
    codes: list[str | None] = []
    for target in (ref, engine):
        try:
            if event["kind"] == "add_request":
                target.add_request(**add_request_kwargs(event))
            else:
                target.abort(event["request_id"])
            codes.append(None)
        except InvalidEvent as exc:
            codes.append(exc.code)
    if codes[0] is not None:
        event["expect_error"] = codes[0]
    # An "invalid" input the reference accepts (e.g. a duplicate of a request
    # that already finished) is a valid input; the engine must agree either way.
    if codes[1] != codes[0]:
        return event, f"input {event['kind']}: reference answered {codes[0] or 'ok'}, engine {codes[1] or 'ok'}"
    return event, None


def check_engine(
    workload: Workload, model: LlamaModel, *, name: str = "", max_steps: int = 10_000, record_trace: bool = True
) -> EngineCheckReport:
    """Run ``workload`` on the engine and the reference in lockstep (see the module docstring)."""
    t0 = time.perf_counter()
    report = EngineCheckReport(name=name or workload.description or f"seed {workload.seed}")
    engine = Engine(workload.config, model, profile=workload.profile)
    ref = Scheduler(workload.config, workload.profile)
    events: list[dict[str, Any]] = []
    inputs = _timed_inputs(workload)
    next_input = 0
    now = 0  # steps done plus idle time skipped
    while report.divergence is None:
        if not ref.has_requests() and next_input < len(inputs):
            now = max(now, inputs[next_input][0])  # nothing to do: skip to the next input
        while next_input < len(inputs) and inputs[next_input][0] <= now:
            event, problem = _apply(engine, ref, inputs[next_input][2])
            events.append(event)
            next_input += 1
            if problem:
                report.divergence = problem
                break
        if report.divergence is not None:
            break
        if not ref.has_requests():
            if next_input < len(inputs):
                continue
            break
        if engine.has_requests() != ref.has_requests():
            report.divergence = "has_requests() differs"
            break
        if report.steps >= max_steps:
            report.divergence = f"still running after {max_steps} steps"
            break
        crashes = []
        throttle = workload.is_throttled(ref.current_step + 1)  # the data-parallel coordinator's word
        try:
            out = engine.schedule(throttle)
        except EngineCrash as exc:  # the modelled release's engine core dies here (e.g. vLLM 0.32/0.33)
            crashes.append(exc.code)
        try:
            ref_out = ref.schedule(throttle)
        except EngineCrash as exc:
            crashes.insert(0, exc.code)
        if crashes:
            if len(crashes) != 2 or crashes[0] != crashes[1]:
                report.divergence = f"step {ref.current_step}: only one side crashed: {crashes}"
            else:  # both died at this step: the trace ends with the crash, as run_workload's do
                events.append({"kind": "step", "step": ref.current_step, "expect_error": crashes[0]})
                next_input = len(inputs)
            break
        expect = ref_out.to_canonical()
        actual = out.to_canonical()
        obs = ref.observe()
        expect_obs = {"free_block_queue": obs["free_block_queue"], "num_free_blocks": obs["num_free_blocks"]}
        events.append({"kind": "step", "step": ref_out.step, "expect": expect, "observe": expect_obs})
        report.steps += 1
        if actual != expect:
            report.divergence = f"step {ref_out.step}: SchedulerOutput differs: expected {expect}, engine {actual}"
            break
        if engine.scheduler.observe() != expect_obs:
            report.divergence = f"step {ref_out.step}: free queue differs"
            break
        result = engine.execute(out)
        sampled = {e[0].req_id: tuple(toks) for e, toks in zip(out.entries, result.sampled) if toks}
        drafts = {rid: tuple(d) for rid, d in result.drafts.items()}
        try:
            ref_outputs = ref.update_from_output(ref_out, ModelRunnerOutput(sampled, drafts))
        except InvalidEvent as exc:
            report.divergence = f"step {ref_out.step}: the reference refused the engine's model output: {exc}"
            break
        eng_outputs = canonical_request_outputs(engine.update(out, result))
        expect_outputs = [o.to_canonical() for o in ref_outputs]
        events.append(
            {
                "kind": "model_output",
                "step": ref_out.step,
                "sampled_token_ids": {k: list(v) for k, v in sorted(sampled.items())},
                "draft_token_ids": {k: list(v) for k, v in sorted(drafts.items())},
                "expect": {"outputs": expect_outputs},
            }
        )
        if eng_outputs != expect_outputs:
            report.divergence = (
                f"step {ref_out.step}: request outputs differ: expected {expect_outputs}, engine {eng_outputs}"
            )
        now += 1
    if report.divergence is None and next_input < len(inputs):
        report.divergence = "inputs left over"
    report.near_ties.extend(engine.stats.near_ties)
    _check_dense(engine, model, workload.config.max_model_len, report)
    stats = engine.stats
    report.num_requests = len(engine.records)
    report.num_generated_tokens = stats.num_generated_tokens
    report.num_preemptions = engine.scheduler.num_preemptions
    report.num_drafts_proposed = stats.num_drafts_proposed
    report.num_drafts_accepted = stats.num_drafts_accepted
    report.num_repaired_tokens = stats.num_repaired_tokens
    if record_trace:
        extra = {"description": f"engine lockstep run of {report.name}"}
        header = make_header(workload.config.to_dict(), workload.profile, workload.seed, "impl-engine", **extra)
        report.trace = Trace(header=header, events=events)
    report.seconds = time.perf_counter() - t0
    return report


def _check_dense(engine: Engine, model: LlamaModel, max_model_len: int, report: EngineCheckReport) -> None:
    """Every request's tokens against the dense greedy oracle."""
    for record in engine.records:
        tokens = record.output_tokens
        finished = record.finish_reason in ("stop", "length")
        dense = dense_generate(
            model,
            record.prompt,
            record.max_tokens,
            max_model_len=max_model_len,
            eos_token_id=record.eos_token_id,
            ignore_eos=record.ignore_eos,
            stop_token_ids=record.stop_token_ids,
            min_tokens=record.min_tokens,
            limit=None if finished else len(tokens),
            req_id=record.req_id,
        )
        report.near_ties.extend(dense.near_ties)
        report.min_margin = min([report.min_margin, *dense.margins])
        if dense.tokens != tokens or (finished and dense.finish_reason != record.finish_reason):
            i = next(
                (i for i, (a, b) in enumerate(zip(tokens, dense.tokens)) if a != b), min(len(tokens), len(dense.tokens))
            )
            tie = any(t.req_id == record.req_id and t.output_index == i for t in report.near_ties)
            report.token_mismatches.append(
                f"{record.req_id}: first difference at output {i}: engine {tokens[i : i + 4]}, dense {dense.tokens[i : i + 4]}"
                f" (finish {record.finish_reason} vs {dense.finish_reason})"
                + (
                    " at a near tie"
                    if tie
                    else f"; dense margin there {dense.margins[i] if i < len(dense.margins) else None}"
                )
            )


def corpus_workloads(corpus: Path) -> list[tuple[str, Workload]]:
    """Workloads rebuilt from every trace under ``corpus`` (inputs and timing; tokens come from the engine)."""
    out: list[tuple[str, Workload]] = []
    for path in sorted(corpus.rglob("*.jsonl")):
        trace = read_trace(path)
        if trace.profile not in ("vllm-0.33", "vllm-0.32") or "expect_error" in trace.header:
            continue  # other releases; a config refused at start has no workload to run
        out.append((str(path.relative_to(corpus)), workload_from_trace(trace)))
    return out


def _parse_seeds(text: str) -> range:
    lo, _, hi = text.partition(":")
    return range(int(lo), int(hi)) if hi else range(int(lo), int(lo) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0:20", help="generated workloads, seeds LO:HI; '' for none")
    parser.add_argument(
        "--generator",
        choices=("conformance", "tight"),
        default="conformance",
        help="conformance/workloads/generate.py (default) or conformance/workloads/tight_workloads.py",
    )
    parser.add_argument(
        "--corpus", type=Path, default=None, help="a folder of JSONL traces (e.g. conformance/traces/vectors)"
    )
    parser.add_argument(
        "--examples", action="store_true", help="also the built-in examples (conformance/traces/examples.py)"
    )
    parser.add_argument("--model", default="tiny", choices=sorted(MODEL_CONFIGS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float64", choices=sorted(DTYPES))
    parser.add_argument("--traces", type=Path, default=None, help="write each lockstep trace here")
    parser.add_argument("--json", type=Path, default=None, help="write the reports as JSON here")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (the tiny model gains nothing from more)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.workloads.tight_workloads import make_tight_workload

    model = LlamaModel(MODEL_CONFIGS[args.model], device=args.device, dtype=DTYPES[args.dtype])
    workloads: list[tuple[str, Workload]] = []
    if args.corpus:
        workloads += corpus_workloads(args.corpus)
    if args.examples:
        workloads += [(f"example-{k}", f()) for k, f in sorted(EXAMPLES.items())]
    if args.seeds and args.generator == "tight":
        workloads += [
            (f"tight-seed-{s}", make_tight_workload(s, vocab_size=model.config.vocab_size))
            for s in _parse_seeds(args.seeds)
        ]
    elif args.seeds:
        from schedconf.conformance.workloads.generate import random_workload as generate_workload

        workloads += [
            (f"seed-{s}-{p}", generate_workload(s, p))
            for s in _parse_seeds(args.seeds)
            for p in ("vllm-0.33", "vllm-0.32")
        ]
    reports = []
    for name, workload in workloads:
        report = check_engine(workload, model, name=name)
        reports.append(report)
        status = "ok" if report.ok else "FAIL"
        print(
            f"{status:4} {name}: {report.steps} steps, {report.num_generated_tokens} tokens, "
            f"{report.num_preemptions} preemptions, drafts {report.num_drafts_accepted}/{report.num_drafts_proposed}, "
            f"{report.num_repaired_tokens} repaired, {len(report.near_ties)} near ties, {report.seconds:.2f} s"
        )
        for line in ([report.divergence] if report.divergence else []) + report.token_mismatches:
            print("     " + line[:400])
        if args.traces and report.trace is not None:
            write_trace(args.traces / (name.replace("/", "_").removesuffix(".jsonl") + ".jsonl"), report.trace)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.summary() for r in reports], indent=1))
    bad = sum(not r.ok for r in reports)
    margins = [r.min_margin for r in reports if r.min_margin != float("inf")]
    print(
        f"totals: {sum(r.steps for r in reports)} steps, {sum(r.num_generated_tokens for r in reports)} tokens, "
        f"{sum(r.num_preemptions for r in reports)} preemptions, "
        f"drafts {sum(r.num_drafts_accepted for r in reports)}/{sum(r.num_drafts_proposed for r in reports)}, "
        f"{sum(r.num_repaired_tokens for r in reports)} repaired, {sum(len(r.near_ties) for r in reports)} near ties, "
        f"smallest greedy margin {min(margins) if margins else float('nan'):.3g}"
    )
    print(f"{len(reports) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
