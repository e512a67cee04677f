"""A strict campaign's throughput against the real vLLM scheduler and against the reference, with where the time goes.

Usage: python bench/bench_campaign.py [--traces 300] [--seed 0] [--version 0.33.0] [--profile vllm-0.33]

The traces are drawn as ``schedconf run --sut vllm-v1@VERSION`` draws them
(``campaign.fit_spec_to_sut``: the driver's forced config) and generated once
with the reference model (its expected outputs); then each SUT replays all of
them, strict, one after the other in this process:

* ``reference``: the model itself (``--sut reference``, in this process);
* ``vLLM``: the real scheduler in its environment over the protocol, three
  times: one request per call (the harness waits for each answer before the
  next call); each trace's calls as one ``batch`` request (PROTOCOL.md); and
  the campaign's own loop with one job (``campaign.run_one``), which also
  generates the next trace while vLLM runs the current batch. The first two
  rows count the generation above once and the replay apart; the third times
  generation and replay together (its ``replay s`` holds both, its last column
  is net of the generation measured apart). The ratios of the rows are what
  each step gains, measured in one run.

The vLLM driver's process is started (importing vLLM) before the replay and
its start is printed apart: a campaign pays it once. Per SUT: the verdicts,
traces per second of the whole campaign (generation plus replay), and the replay's seconds split into building the scheduler for
each trace (``init``, the round trip included), the engine's own time (read
back from the vLLM driver's ``stats``: seconds inside vLLM's ``schedule()`` and
``update_from_output()``), the comparison (the harness's ``Comparator``), and
the rest: the protocol (encoding, the pipe, decoding, validation) and the
harness's bookkeeping; for the reference, which runs in this process with no
protocol, the rest is the model's own time and the harness's. Wall time, one
run; the machine's other load counts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedconf.conformance.adapters import make_sut  # noqa: E402
from schedconf.conformance.checking import compare  # noqa: E402
from schedconf.conformance.checking.replay import replay  # noqa: E402
from schedconf.conformance.engines.vllm_env import ensure_vllm_env  # noqa: E402
from schedconf.conformance.runs import campaign  # noqa: E402
from schedconf.conformance.runs.campaign import CampaignSpec, fit_spec_to_sut, generate_workloads  # noqa: E402
from schedconf.conformance.traces.trace import Trace  # noqa: E402
from schedconf.conformance.workloads.workload import WorkloadError, run_workload  # noqa: E402

COMPARE_METHODS = ("compare_scheduler_output", "compare_observation", "compare_request_outputs")


class CompareClock:
    """Seconds spent in the harness's ``Comparator`` methods while installed (wraps the class's methods)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.originals = {name: getattr(compare.Comparator, name) for name in COMPARE_METHODS}
        for name, method in self.originals.items():
            setattr(compare.Comparator, name, self._timed(method))

    def _timed(self, method: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        return timed

    def close(self) -> None:
        for name, method in self.originals.items():
            setattr(compare.Comparator, name, method)


class StartClock:
    """Seconds spent in ``sut.start`` (a trace's init, round trip included) while installed."""

    def __init__(self, sut: Any) -> None:
        self.seconds = 0.0
        self.sut = sut
        self.start = sut.start

        def timed_start(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return self.start(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        sut.start = timed_start

    def close(self) -> None:
        self.sut.start = self.start


def generate(spec: CampaignSpec) -> tuple[list[Trace], int, float]:
    """The campaign's traces (the reference's), how many workloads were discarded, and the seconds it took."""
    started = time.perf_counter()
    traces, discarded = [], 0
    for workload in generate_workloads(spec):
        try:
            traces.append(run_workload(workload))
        except WorkloadError:
            discarded += 1
    return traces, discarded, time.perf_counter() - started


def run_sut(name: str, sut: Any, traces: list[Trace], engine_stats: bool) -> dict[str, Any]:
    """Replay every trace, strict; the verdicts and the split of the seconds."""
    clock = CompareClock()
    verdicts: dict[str, int] = {}
    replay_s = engine_s = 0.0
    starts = StartClock(sut)
    try:
        for trace in traces:
            started = time.perf_counter()
            result = replay(trace, sut, "strict")
            replay_s += time.perf_counter() - started
            verdicts[result.verdict] = verdicts.get(result.verdict, 0) + 1
            if engine_stats:
                engine_s += sut.stats()["scheduler_seconds"]  # since this trace's init: outside the timed replay
    finally:
        clock.close()
        starts.close()
    return {
        "name": name,
        "verdicts": verdicts,
        "replay_s": replay_s,
        "engine_s": engine_s if engine_stats else None,
        "compare_s": clock.seconds,
        "init_s": starts.seconds,
    }


def run_overlapped(name: str, sut: Any, spec: CampaignSpec) -> dict[str, Any]:
    """The campaign's own loop with one job (``campaign.run_one``): each trace is generated, the next one
    while the scheduler runs this one's batch; wall time of generation and replay together."""
    workloads = generate_workloads(spec)
    clock = CompareClock()
    verdicts: dict[str, int] = {}
    engine_s = 0.0
    starts = StartClock(sut)
    campaign._WORKER.update(spec=spec, sut=sut)
    started = time.perf_counter()
    try:
        for i, workload in enumerate(workloads):
            following = (i + 1, workloads[i + 1]) if i + 1 < len(workloads) else None
            outcome = campaign.run_one(i, workload, following)
            verdicts[outcome.verdict] = verdicts.get(outcome.verdict, 0) + 1
            if outcome.verdict != "discarded":
                engine_s += sut.stats()["scheduler_seconds"]
    finally:
        wall_s = time.perf_counter() - started
        clock.close()
        starts.close()
        campaign._WORKER.clear()
    return {
        "name": name,
        "verdicts": verdicts,
        "replay_s": wall_s,
        "engine_s": engine_s,
        "compare_s": clock.seconds,
        "init_s": starts.seconds,
        "overlapped": True,
    }


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 trace, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=_positive, default=300, help="traces in the campaign (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--version", default="0.33.0", help="the vLLM release (its environment is built if missing)")
    parser.add_argument("--profile", default="vllm-0.33")
    args = parser.parse_args()

    ensure_vllm_env(args.version)
    vllm = make_sut(f"vllm-v1@{args.version}")
    try:
        spec, _ = fit_spec_to_sut(
            CampaignSpec(sut=f"vllm-v1@{args.version}", profile=args.profile, examples=args.traces, seed=args.seed),
            vllm,
        )
        traces, discarded, generation_s = generate(spec)
        if not traces:
            parser.error(f"all {discarded} generated workloads were discarded; try another --seed")
        # The driver process starts (and imports vLLM) on the first init: once per campaign, not per trace.
        started = time.perf_counter()
        vllm.start(dict(traces[0].config), traces[0].profile)
        startup_s = time.perf_counter() - started
        reference = make_sut("reference")
        rows = [run_sut("reference", reference, traces, engine_stats=False)]
        vllm.use_batch = False
        rows.append(run_sut(f"vLLM {args.version}, one request per call", vllm, traces, engine_stats=True))
        vllm.use_batch = True
        rows.append(run_sut(f"vLLM {args.version}, a batch per trace", vllm, traces, engine_stats=True))
        rows.append(run_overlapped(f"vLLM {args.version}, as schedconf run drives it", vllm, spec))
        reference.close()
    finally:
        vllm.close()

    steps = sum(t.num_steps() for t in traces)
    print(
        f"strict campaign, profile {args.profile}, seed {args.seed}: {len(traces)} traces ({discarded} discarded), "
        f"{steps:,} steps; generation (the reference's expected outputs) {generation_s:.2f} s; "
        f"the vLLM driver's start (its process, importing vLLM) {startup_s:.2f} s, once, outside the table"
    )
    print()
    print(
        "| SUT | verdicts | traces/s (generation + replay) | replay s | init s | engine s | comparison s "
        "| protocol and harness s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(row["verdicts"].items()))
        overlapped = row.get("overlapped", False)
        total_s = row["replay_s"] if overlapped else generation_s + row["replay_s"]
        rate = len(traces) / total_s if traces else 0.0
        engine = row["engine_s"]
        # The overlapped row's replay seconds hold its generation: the rest is net of the generation run apart.
        rest = (
            row["replay_s"] - row["compare_s"] - row["init_s"] - (engine or 0.0) - (generation_s if overlapped else 0)
        )
        engine_text = f"{engine:.2f}" if engine is not None else "-"
        print(
            f"| {row['name']} | {verdicts} | {rate:.1f} | {row['replay_s']:.2f} | {row['init_s']:.2f} | {engine_text} "
            f"| {row['compare_s']:.2f} | {rest:.2f} |"
        )


if __name__ == "__main__":
    main()
