"""GPU check of impl/'s engine: identical outputs on CUDA, then throughput and step latency.

Usage (on a machine with a CUDA GPU; finishes in well under 5 minutes on one H200)::

    python -m schedconf.gpu_checks.engine_gpu --out reports/gpu

Stages, each recorded in ``OUT/engine_gpu.json``:

1. ``conformance``: every workload of the corpus (``conformance/traces/vectors/**/*.jsonl``
   when present), the built-in examples and ``--seeds`` workloads of
   ``conformance/workloads/tight_workloads.py`` run
   through the engine on the GPU (``small`` model, float64) in lockstep with the
   reference scheduler fed the engine's own tokens: identical SchedulerOutputs
   (strict: block ids, free-queue order) and request outputs, and every
   request's tokens equal to the dense, cache-free greedy forward (also on the
   GPU). Near ties are listed with their margins.
2. ``replay``: the same corpus traces replayed against the teacher-forced
   engine adapter (``impl-engine``) on the GPU: scheduler outputs equal to the
   trace and the logits of every sampled position within 1e-8 of the dense
   forward.
3. ``throughput``: the ``bench-250m`` model (about 246 M parameters) in
   bfloat16: for each batch size, that many requests of 128 prompt + 128
   output tokens (EOS ignored); generated tokens/s over the whole run and the
   median / p90 latency of the decode steps, with the scheduler's share.

Exit status 0 when no check failed (verdict ``pass``, or ``partial`` when the
time budget cut some workloads, counted in ``skipped_for_time``), 1 otherwise. Without a CUDA device it
prints that it checked nothing, writes a report saying so, and exits 0.
``--allow-cpu --device cpu`` runs the same stages on the CPU with small sizes:
a dry run of this script's logic, labelled as such in the report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from schedconf.gpu_checks.device import get_check_device, get_device_info

REPORT_NAME = "engine_gpu.json"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stage_conformance(device: torch.device, seeds: range, corpus: Path, deadline: float) -> dict[str, Any]:
    """Engine vs reference scheduler in lockstep, and tokens vs the dense oracle, on ``device``."""
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.workloads.tight_workloads import make_tight_workload
    from schedconf.gpu_checks.engine_check import check_engine, corpus_workloads
    from schedconf.impl.model import SMALL, TINY, LlamaModel

    config = SMALL if device.type == "cuda" else TINY
    model = LlamaModel(config, device=device, dtype=torch.float64)
    workloads = corpus_workloads(corpus) if corpus.is_dir() else []
    workloads += [(f"example-{k}", f()) for k, f in sorted(EXAMPLES.items())]
    workloads += [(f"seed-{s}", make_tight_workload(s, vocab_size=config.vocab_size)) for s in seeds]
    results = []
    skipped = 0
    for name, workload in workloads:
        if time.monotonic() > deadline:
            skipped += 1
            continue
        report = check_engine(workload, model, name=name, record_trace=False)
        results.append(report.summary())
    failed = [r for r in results if not r["ok"]]
    return {
        "model": config.to_dict(),
        "dtype": "float64",
        "workloads": len(results),
        "failed": len(failed),
        "skipped_for_time": skipped,
        "steps": sum(r["steps"] for r in results),
        "generated_tokens": sum(r["num_generated_tokens"] for r in results),
        "preemptions": sum(r["num_preemptions"] for r in results),
        "drafts_accepted": sum(r["num_drafts_accepted"] for r in results),
        "drafts_proposed": sum(r["num_drafts_proposed"] for r in results),
        "repaired_tokens": sum(r["num_repaired_tokens"] for r in results),
        "near_ties": [t for r in results for t in r["near_ties"]],
        "failures": failed[:20],
        "ok": not failed,
    }


def stage_replay(device: torch.device, corpus: Path, seeds: range, deadline: float) -> dict[str, Any]:
    """Teacher-forced engine replay of traces (corpus, examples, campaign) on ``device``."""
    from schedconf.conformance.adapters.impl import ImplEngineSut
    from schedconf.conformance.checking.replay import replay
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.traces.trace import read_trace
    from schedconf.conformance.workloads.tight_workloads import make_tight_workload
    from schedconf.conformance.workloads.workload import run_workload

    traces = [read_trace(p) for p in sorted(corpus.rglob("*.jsonl"))] if corpus.is_dir() else []
    traces = [t for t in traces if t.profile in ("vllm-0.33", "vllm-0.32")]
    traces += [run_workload(f()) for _, f in sorted(EXAMPLES.items())]
    traces += [run_workload(make_tight_workload(s)) for s in seeds]
    sut = ImplEngineSut(model="small" if device.type == "cuda" else "tiny", device=str(device))
    verdicts: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    skipped = 0
    for trace in traces:
        if time.monotonic() > deadline:
            skipped += 1
            continue
        result = replay(trace, sut, "strict")
        sut.close()
        verdicts[result.verdict] = verdicts.get(result.verdict, 0) + 1
        if result.verdict == "fail" and len(failures) < 20:
            d = result.divergence
            failures.append({"trace": trace.path, "step": d.step if d else None, "message": d.message if d else ""})
    return {
        "traces": sum(verdicts.values()),
        "verdicts": verdicts,
        "skipped_for_time": skipped,
        "checked_positions": sut.num_checked_positions,
        "max_abs_logit_diff": sut.max_abs_diff,
        "near_ties": [t.__dict__ for t in sut.near_ties],
        "failures": failures + sut.failures,
        "ok": not failures and not sut.failures and verdicts.get("fail", 0) == 0,
    }


def stage_throughput(
    device: torch.device,
    batch_sizes: list[int],
    prompt_len: int,
    output_len: int,
    model_name: str,
    dtype: torch.dtype,
    deadline: float,
) -> dict[str, Any]:
    """Tokens/s and decode-step latency per batch size."""
    import random

    from schedconf.impl.engine import Engine
    from schedconf.impl.model import MODEL_CONFIGS, LlamaModel
    from schedconf.spec.v1.config import SchedulerConfig

    t0 = time.perf_counter()
    model = LlamaModel(MODEL_CONFIGS[model_name], device=device, dtype=dtype)
    load_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    for n in batch_sizes:
        if time.monotonic() > deadline:
            rows.append({"batch_size": n, "skipped_for_time": True})
            continue
        rng = random.Random(n)
        block_size = 16
        max_len = prompt_len + output_len + 1
        blocks = -(-max_len // block_size)
        config = SchedulerConfig(
            block_size=block_size,
            num_gpu_blocks=n * blocks + 1,
            max_num_batched_tokens=8192,
            max_num_seqs=n,
            max_model_len=max_len,
        )
        engine = Engine(config, model)
        for i in range(n):
            engine.add_request(
                f"r{i}",
                [rng.randrange(model.config.vocab_size) for _ in range(prompt_len)],
                output_len,
                ignore_eos=True,
            )
        _sync(device)
        start = time.perf_counter()
        decode_ms: list[float] = []
        sched_ms: list[float] = []
        while engine.has_requests():
            s0 = time.perf_counter()
            out = engine.schedule()
            s1 = time.perf_counter()
            result = engine.execute(out)
            s2 = time.perf_counter()
            engine.update(out, result)
            _sync(device)
            s3 = time.perf_counter()
            is_decode = out.entries and all(e[1] == 1 for e in out.entries)
            if is_decode:
                decode_ms.append((s3 - s0) * 1e3)
                sched_ms.append(((s1 - s0) + (s3 - s2)) * 1e3)
        total_s = time.perf_counter() - start
        generated = engine.stats.num_generated_tokens
        decode_sorted = sorted(decode_ms)
        rows.append(
            {
                "batch_size": n,
                "generated_tokens": generated,
                "seconds": round(total_s, 3),
                "tokens_per_s": round(generated / total_s, 1),
                "decode_steps": len(decode_ms),
                "decode_step_ms_median": round(statistics.median(decode_ms), 3) if decode_ms else None,
                "decode_step_ms_p90": round(decode_sorted[int(0.9 * (len(decode_sorted) - 1))], 3)
                if decode_ms
                else None,
                "decode_tokens_per_s": round(n * len(decode_ms) / (sum(decode_ms) / 1e3), 1) if decode_ms else None,
                "scheduler_ms_median": round(statistics.median(sched_ms), 3) if sched_ms else None,
            }
        )
    return {
        "model": model_name,
        "params_millions": round(model.config.num_params / 1e6, 1),
        "dtype": str(dtype),
        "prompt_len": prompt_len,
        "output_len": output_len,
        "model_load_s": round(load_s, 2),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for engine_gpu.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU with small sizes")
    parser.add_argument("--corpus", type=Path, default=Path("conformance/traces/vectors"))
    parser.add_argument("--seeds", type=int, default=40, help="campaign workloads per conformance stage")
    parser.add_argument("--batch-sizes", default="1,16,64,256")
    parser.add_argument("--budget-s", type=float, default=270.0, help="stop starting new work after this long")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.out / REPORT_NAME
    chosen = get_check_device(args.device, args.allow_cpu, report_path, "engine_gpu")
    if isinstance(chosen, int):
        return chosen
    device, dry_run = chosen
    began = time.monotonic()
    deadline = began + args.budget_s
    info = get_device_info(device, dry_run)
    print(f"engine_gpu on {info.get('gpu', 'the CPU (dry run)')}")
    seeds = range(args.seeds)
    report: dict[str, Any] = {"info": info}
    report["conformance"] = stage_conformance(device, seeds, args.corpus, began + 0.45 * args.budget_s)
    print(f"conformance: {report['conformance']['workloads']} workloads, {report['conformance']['failed']} failed")
    report["replay"] = stage_replay(device, args.corpus, seeds, began + 0.7 * args.budget_s)
    print(f"replay: {report['replay']['verdicts']}, max logit diff {report['replay']['max_abs_logit_diff']:.3g}")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if dry_run:
        report["throughput"] = stage_throughput(
            device, [b for b in batch_sizes if b <= 16] or [1], 16, 8, "tiny", torch.float64, deadline
        )
    else:
        report["throughput"] = stage_throughput(device, batch_sizes, 128, 128, "bench-250m", torch.bfloat16, deadline)
    for row in report["throughput"]["rows"]:
        print(f"throughput: {row}")
    ok = report["conformance"]["ok"] and report["replay"]["ok"]
    complete = not report["conformance"]["skipped_for_time"] and not report["replay"]["skipped_for_time"]
    # "partial": nothing failed, but the time budget cut some workloads (listed as skipped_for_time).
    report["verdict"] = ("pass" if complete else "partial") if ok else "fail"
    report["seconds"] = round(time.monotonic() - began, 1)
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"verdict {report['verdict']} in {report['seconds']} s; report: {report_path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
