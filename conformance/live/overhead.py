"""Measure the recorder's overhead on a live engine's step time: ``python -m schedconf.conformance.live.overhead``.

Runs the same offline workload (``LLM.generate`` of fixed prompts with
``ignore_eos`` and a fixed ``max_tokens``, so every run takes the same steps)
in fresh engine processes, alternately with the recorder attached (free queue
observed) and without, and prints the median time per engine step of each and
the overhead. On two cores that difference is noisy (a few percent either way
between rounds), so the recorder also measures itself: the time its wrapper
spends in the scheduler's calls (``SCHEDCONF_RECORD_TIMING=1``), printed per
step and as a share of the step time without it. The worker (``--worker``)
runs in ``.venvs/live-vllm-VERSION``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def worker(model: str, reps: int, prompts: int, max_tokens: int) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=8,
        block_size=32,
        num_gpu_blocks_override=40,
        seed=0,
    )
    texts = [" ".join(f"w{(i * 7 + j) % 500}" for j in range(16 + i * 3)) for i in range(prompts)]
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1, ignore_eos=True)
    llm.generate(texts, params, use_tqdm=False)  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        llm.generate(texts, params, use_tqdm=False)
        times.append(time.perf_counter() - t0)
    print("RESULT " + json.dumps({"seconds": times}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.conformance.live.overhead", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--release", default="0.32.0")
    parser.add_argument("--rounds", type=int, default=2, help="engine processes per mode (alternating)")
    parser.add_argument("--reps", type=int, default=3, help="timed generate() calls per process")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.model, args.reps, args.prompts, args.max_tokens)
        return 0
    from schedconf.conformance.engines import engine_env
    from schedconf.conformance.live.env import LIVE_FAMILY
    from schedconf.conformance.live.serve import get_recorder_env

    python = engine_env.ensure_env(LIVE_FAMILY, args.release)
    base = {**os.environ, **engine_env.driver_env(LIVE_FAMILY, args.release)}
    results: dict[str, list[float]] = {"off": [], "on": []}
    own: list[float] = []  # the recorder's own seconds per step, per engine process
    steps = None
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run(
            [str(python), "-m", "schedconf.conformance.live.model", model],
            env=base,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for round_ in range(args.rounds):
            for mode in ("off", "on"):
                env = dict(base)
                if mode == "on":
                    env.update(get_recorder_env(os.path.join(tmp, f"rec-{round_}"), observe=True))
                    env["SCHEDCONF_RECORD_TIMING"] = "1"
                proc = subprocess.run(
                    [
                        str(python),
                        "-m",
                        "schedconf.conformance.live.overhead",
                        "--worker",
                        "--model",
                        model,
                        "--reps",
                        str(args.reps),
                        "--prompts",
                        str(args.prompts),
                        "--max-tokens",
                        str(args.max_tokens),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
                if line is None:
                    print(proc.stdout[-2000:], proc.stderr[-3000:], file=sys.stderr)
                    return 2
                results[mode] += json.loads(line[7:])["seconds"]
                for timing in proc.stderr.splitlines():
                    if timing.startswith("schedconf-recorder-timing "):
                        counted = json.loads(timing.split(" ", 1)[1])
                        if counted["steps"]:
                            own.append(counted["seconds"] / counted["steps"])
                if mode == "on" and steps is None:
                    rec_dir = os.path.join(tmp, f"rec-{round_}")
                    path = os.path.join(rec_dir, sorted(os.listdir(rec_dir))[0])
                    with open(path, encoding="utf-8") as handle:
                        total = sum(1 for ln in handle if '"call":"schedule"' in ln)
                    steps = total // (1 + args.reps)  # the warm-up and each rep run the same steps
                print(f"round {round_} {mode}: {json.loads(line[7:])['seconds']}", file=sys.stderr, flush=True)
    off, on = statistics.median(results["off"]), statistics.median(results["on"])
    per_step = {m: (statistics.median(v) / steps * 1e3 if steps else None) for m, v in results.items()}
    print(
        json.dumps(
            {
                "steps_per_generate": steps,
                "median_generate_s": {"off": round(off, 4), "on": round(on, 4)},
                "median_ms_per_step": {m: round(v, 3) if v else None for m, v in per_step.items()},
                "overhead_percent": round((on - off) / off * 100, 2),
                "recorder_own_ms_per_step": round(statistics.median(own) * 1e3, 4) if own else None,
                "recorder_own_percent_of_step": (
                    round(statistics.median(own) * 1e3 / per_step["off"] * 100, 2) if own and per_step["off"] else None
                ),
                "samples": results,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
