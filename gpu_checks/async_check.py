"""GPU check of impl/'s overlapped (async) engine: tokens equal to the dense oracle, then throughput.

Usage (on a machine with a CUDA GPU; about 2 minutes on one H200, never more
than ``--budget-s``)::

    python -m schedconf.gpu_checks.async_check --out reports/gpu

Stages, each recorded in ``OUT/async_check.json``:

1. ``tokens``: ``--seeds`` small random workloads (tight pools, so preemption
   with steps in flight; shared prefixes; EOS stops) through the engine on the
   GPU (``small`` model, float64) with the overlapped loop
   (``Engine.step_overlapped``: the forward pass on a worker thread while the
   next step is scheduled) under ``vllm-0.33-async`` and ``vllm-0.32-async``
   with 2 and 3 steps in flight, and a plain profile with a batch queue of 2;
   and both async profiles with spec decode (n-gram drafts in place of
   AsyncScheduler's ``-1`` placeholders, positions moved back over rejections).
   Every request's tokens must equal the dense, cache-free greedy forward
   (``impl/dense.py``, also on the GPU); a difference where the oracle saw a
   near tie is reported, not failed.
2. ``replay``: async traces of ``conformance/workloads/generate.py`` replayed against the
   teacher-forced engine adapter (``impl-engine``) on the GPU: scheduler
   outputs equal to the trace and the logits of every sampled position within
   1e-8 of the dense forward (async profiles also with spec decode).
3. ``throughput``: ``bench/bench_async.py``'s two loops (synchronous
   ``Engine.step()`` under ``vllm-0.33``; overlapped, two steps in flight, under
   ``vllm-0.33-async``) on the ``bench-250m`` model in bfloat16, per batch size:
   tokens/s of each, the ratio, the host and forward time per step. Whether the
   two loops' bfloat16 tokens agree is recorded, not required.

Exit status 0 when no check failed (verdict ``pass``, or ``partial`` when the
time budget cut some workloads), 1 otherwise. Without a CUDA device it prints
that it checked nothing, writes ``{"verdict": "skipped", ...}`` and exits 0.
``--device cpu --allow-cpu`` runs the same stages on the CPU with the tiny model
and small sizes (a dry run of this script, labelled as such).

It has not been run on a GPU yet: none was available while it was written.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from schedconf.gpu_checks.device import get_check_device, get_device_info

REPORT_NAME = "async_check.json"

VARIANTS: tuple[tuple[str, int], ...] = (
    ("vllm-0.33-async", 2),
    ("vllm-0.32-async", 2),
    ("vllm-0.33-async", 3),
    ("vllm-0.33", 2),
)
"""(profile, max_concurrent_batches) of the token stage, each run with the overlapped loop (the
first also once more with a ``reset_prefix_cache(True)`` midway)."""

SPEC_VARIANTS: tuple[tuple[str, int, int], ...] = (("vllm-0.33-async", 2, 2), ("vllm-0.32-async", 3, 3))
"""(profile, max_concurrent_batches, num_spec_tokens): async scheduling with spec decode in the token stage."""

REPLAY_PROFILES: tuple[tuple[str, int], ...] = (
    ("vllm-0.33-async", 0),
    ("vllm-0.33", 0),
    ("vllm-0.33-async", 2),
    ("vllm-0.32-async", 3),
)
"""(profile, num_spec_tokens forced; 0: as generated) of the replay stage."""

MAX_MODEL_LEN = 40

Arrival = tuple[int, str, list[int], dict[str, Any]]
"""``(engine call at which it is added, request id, prompt, add_request keyword arguments)``."""


def random_async_workload(seed: int) -> tuple[dict[str, Any], list[Arrival]]:
    """A small workload: a config (without ``max_concurrent_batches``) and ``(at_call, id, prompt, kwargs)`` arrivals.

    Tight pools (preemption with steps in flight), prompts sharing a prefix
    (prefix hits), EOS 5 on some requests, priorities for the priority policy.
    """
    rng = random.Random(seed)
    config = dict(
        block_size=4,
        num_gpu_blocks=rng.choice([11, 12, 14, 20]),
        max_num_batched_tokens=rng.choice([8, 16, 64]),
        max_num_seqs=rng.choice([2, 4, 8]),
        max_model_len=MAX_MODEL_LEN,
        enable_prefix_caching=True,
        long_prefill_token_threshold=rng.choice([0, 6]),
        policy=rng.choice(["fcfs", "priority"]),
    )
    base = [rng.randrange(200) for _ in range(8)]
    arrivals = []
    for i in range(rng.randint(3, 7)):
        prompt = base[: rng.randint(0, 8)] + [rng.randrange(200) for _ in range(rng.randint(1, 14))]
        arrivals.append(
            (
                rng.randint(0, 6),
                f"r{i}",
                prompt,
                dict(
                    max_tokens=rng.randint(1, 12),
                    eos_token_id=rng.choice([None, 5]),
                    priority=rng.randint(0, 2),
                    arrival_time=i,
                ),
            )
        )
    return config, sorted(arrivals, key=lambda a: a[0])


def run_overlapped_workload(
    model: Any,
    config: dict[str, Any],
    arrivals: list[Arrival],
    profile: str,
    overlap: bool = True,
    reset_at: int | None = None,
    drafter: Any = None,
) -> Any:
    """Drive an Engine through ``arrivals`` (added at their loop call) until done; returns the engine.

    ``reset_at``: at that loop call, ``reset_prefix_cache(reset_running_requests=True)``
    (steps in flight lose their output; the running requests recompute). ``drafter``:
    the engine's drafter (default: n-gram, with ``num_spec_tokens > 0``).
    """
    from schedconf.impl.engine import Engine
    from schedconf.spec.v1.config import SchedulerConfig

    engine = Engine(SchedulerConfig(**config), model, profile=profile, drafter=drafter)
    pending = list(arrivals)
    calls = 0
    try:
        while pending or engine.has_requests() or engine.batch_queue:
            while pending and pending[0][0] <= calls:
                _, rid, prompt, kwargs = pending.pop(0)
                engine.add_request(rid, prompt, **kwargs)
            if calls == reset_at:
                engine.reset_prefix_cache(True)
            if overlap:
                if engine.has_requests() or engine.batch_queue:
                    engine.step_overlapped()
            elif engine.has_requests():
                engine.step()
            calls += 1
            if calls > 10_000:
                raise RuntimeError("workload still running after 10,000 engine calls")
    finally:
        engine.close()
    return engine


def stage_tokens(device: torch.device, seeds: range, model_name: str, deadline: float) -> dict[str, Any]:
    """Overlapped engine tokens against the dense oracle on ``device``."""
    from schedconf.impl.dense import dense_generate
    from schedconf.impl.model import MODEL_CONFIGS, LlamaModel

    model = LlamaModel(MODEL_CONFIGS[model_name], device=device, dtype=torch.float64)
    failures: list[str] = []
    counts = {
        "workloads": 0,
        "requests": 0,
        "generated_tokens": 0,
        "preemptions": 0,
        "stale_outputs": 0,
        "placeholder_inputs_from_runner": 0,
        "near_tie_mismatches": 0,
        "spec_workloads": 0,
        "drafts_accepted": 0,
        "segments_moved_back": 0,
    }
    near_ties: list[dict[str, Any]] = []
    skipped = 0
    for seed in seeds:
        if time.monotonic() > deadline:
            skipped += 1
            continue
        config, arrivals = random_async_workload(seed)
        runs = (
            [(profile, batches, None, 0) for profile, batches in VARIANTS]
            + [("vllm-0.33-async", 2, 5, 0)]
            + [(profile, batches, None, k) for profile, batches, k in SPEC_VARIANTS]
        )
        for profile, batches, reset_at, k in runs:
            engine = run_overlapped_workload(
                model,
                {**config, "max_concurrent_batches": batches, "num_spec_tokens": k},
                arrivals,
                profile,
                reset_at=reset_at,
            )
            counts["workloads"] += 1
            counts["spec_workloads"] += k > 0
            counts["drafts_accepted"] += engine.stats.num_drafts_accepted
            counts["segments_moved_back"] += engine.runner.num_shifted_segments
            counts["preemptions"] += engine.scheduler.num_preemptions
            counts["stale_outputs"] += engine.scheduler.num_stale_outputs
            counts["placeholder_inputs_from_runner"] += engine.runner.num_holes_from_runner
            for record in engine.records:
                dense = dense_generate(
                    model,
                    record.prompt,
                    record.max_tokens,
                    max_model_len=MAX_MODEL_LEN,
                    eos_token_id=record.eos_token_id,
                    req_id=record.req_id,
                )
                counts["requests"] += 1
                counts["generated_tokens"] += len(record.output_tokens)
                near_ties.extend(vars(t) for t in dense.near_ties)
                if record.output_tokens != dense.tokens:
                    if dense.near_ties:
                        counts["near_tie_mismatches"] += 1
                    elif len(failures) < 20:
                        failures.append(
                            f"seed {seed} {profile} x{batches} {record.req_id}: engine "
                            f"{record.output_tokens} != dense {dense.tokens}"
                        )
    return {
        **counts,
        "model": model_name,
        "failed": len(failures),
        "failures": failures,
        "near_ties": near_ties[:20],
        "skipped_for_time": skipped,
        "ok": not failures,
    }


def stage_replay(device: torch.device, seeds: range, model_name: str, deadline: float) -> dict[str, Any]:
    """Async traces against the teacher-forced engine adapter on ``device``."""
    from schedconf.conformance.adapters.impl import ImplEngineSut
    from schedconf.conformance.checking.replay import render_divergence, replay
    from schedconf.conformance.workloads.generate import random_workload
    from schedconf.conformance.workloads.workload import run_workload

    verdicts: dict[str, int] = {}
    failures: list[str] = []
    checked = 0
    max_diff = 0.0
    skipped = 0
    for seed in seeds:
        for profile, k in REPLAY_PROFILES:
            if time.monotonic() > deadline:
                skipped += 1
                continue
            workload = random_workload(seed, profile)
            if k:
                workload = _with_spec_tokens(workload, profile, k)
                if workload is None:
                    continue
            trace = run_workload(workload)
            sut = ImplEngineSut(model=model_name, device=str(device), dtype="float64", cpu_threads=None)
            result = replay(trace, sut, "strict")
            verdicts[result.verdict] = verdicts.get(result.verdict, 0) + 1
            if (result.verdict == "fail" or sut.failures) and len(failures) < 20:
                failures.append(
                    render_divergence(trace, result)[:2000] if result.verdict == "fail" else sut.failures[0]
                )
            checked += sut.num_checked_positions
            max_diff = max(max_diff, sut.max_abs_diff)
    return {
        "traces": sum(verdicts.values()),
        "verdicts": verdicts,
        "checked_positions": checked,
        "max_abs_logit_diff": max_diff,
        "failures": failures,
        "skipped_for_time": skipped,
        "ok": not failures and verdicts.get("fail", 0) == 0,
    }


def _with_spec_tokens(workload: Any, profile: str, k: int) -> Any:
    """The workload with ``num_spec_tokens = k``, or None when its profile refuses that config."""
    from dataclasses import replace

    from schedconf.spec.errors import InvalidConfig
    from schedconf.spec.v1.profiles import PROFILES, check_config_for_profile

    config = replace(workload.config, num_spec_tokens=k)
    try:
        check_config_for_profile(config, PROFILES[profile])
    except InvalidConfig:
        return None
    return workload.replace(config=config)


def stage_throughput(
    device: torch.device,
    batch_sizes: list[int],
    prompt_len: int,
    output_len: int,
    model_name: str,
    dtype: str,
    repeats: int,
    deadline: float,
) -> dict[str, Any]:
    """``bench/bench_async.py``'s sync and overlapped loops per batch size."""
    from bench.bench_async import bench, render_table

    rows = []
    skipped = []
    for batch in batch_sizes:
        if time.monotonic() > deadline:
            skipped.append(batch)
            continue
        rows.append(bench(model_name, str(device), dtype, batch, prompt_len, output_len, repeats, require_equal=False))
    return {
        "model": model_name,
        "dtype": dtype,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "rows": rows,
        "table": render_table(rows) if rows else "",
        "skipped_for_time": skipped,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for async_check.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU with small sizes")
    parser.add_argument("--seeds", type=int, default=24, help="workloads per correctness stage")
    parser.add_argument("--batch-sizes", default="16,64,256")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop starting new work after this long")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.out / REPORT_NAME
    chosen = get_check_device(args.device, args.allow_cpu, report_path, "async_check")
    if isinstance(chosen, int):
        return chosen
    device, dry_run = chosen
    began = time.monotonic()
    info = get_device_info(device, dry_run)
    print(f"async_check on {info.get('gpu', 'the CPU (dry run)')}")
    model_name = "tiny" if dry_run else "small"
    seeds = range(args.seeds)
    report: dict[str, Any] = {"info": info}
    report["tokens"] = stage_tokens(device, seeds, model_name, began + 0.4 * args.budget_s)
    t = report["tokens"]
    print(
        f"tokens: {t['workloads']} workload runs, {t['requests']} requests, {t['failed']} failed, "
        f"{t['preemptions']} preemptions, {t['stale_outputs']} stale outputs, "
        f"{t['placeholder_inputs_from_runner']} placeholder inputs from the runner"
    )
    report["replay"] = stage_replay(device, seeds, model_name, began + 0.6 * args.budget_s)
    print(f"replay: {report['replay']['verdicts']}, max logit diff {report['replay']['max_abs_logit_diff']:.3g}")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if dry_run:
        report["throughput"] = stage_throughput(
            device, [b for b in batch_sizes if b <= 16] or [4], 16, 8, "tiny", "float64", 1, began + args.budget_s
        )
    else:
        report["throughput"] = stage_throughput(
            device, batch_sizes, 128, 128, "bench-250m", "bfloat16", args.repeats, began + args.budget_s
        )
    print(report["throughput"]["table"])
    ok = report["tokens"]["ok"] and report["replay"]["ok"]
    complete = not (
        report["tokens"]["skipped_for_time"]
        or report["replay"]["skipped_for_time"]
        or report["throughput"]["skipped_for_time"]
    )
    report["verdict"] = ("pass" if complete else "partial") if ok else "fail"
    report["seconds"] = round(time.monotonic() - began, 1)
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"verdict {report['verdict']} in {report['seconds']} s; report: {report_path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
