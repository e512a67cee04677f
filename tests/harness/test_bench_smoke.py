"""Every script in bench/ runs end to end at tiny sizes and prints every table it prints at full size.

A benchmark that nothing runs rots (``bench_harness.py`` crashed with a
KeyError on the first prefix-cache reset of a generated trace, and nothing
noticed). Each case runs one script as a user does, ``python bench/NAME.py
...`` from the repository root with this interpreter, with the smallest sizes
its options allow, and checks its exit status and one header and one row of
each table: the columns by name, the cells as figures. What the figures are
is not checked. ``SMOKES`` must name every script of bench/ (the first test).

The torch scripts run in this environment (the ``impl`` extra);
``bench_vllm_vs_spec.py`` is marked ``vllm`` and builds the vLLM 0.33.0
environment first if it is missing, as the tests of tests/vllm/ do.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from schedconf.conformance.engines.vllm_env import ensure_vllm_env
from schedconf.conformance.workloads.generate import random_workload
from schedconf.conformance.workloads.workload import WorkloadError, run_workload

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
TIMEOUT_S = 120
"""Per run; the slowest smoke run takes about 12 s under ``pytest -n 2`` on 2 cores, so reaching this means a hang."""

NUM = r"[\d,]+(?:\.\d+)?"
"""A printed figure: 12, 1,234, 0.57."""


def row(*cells: str) -> str:
    """A regex for one table line: ``cells`` (regexes) in order, ``|`` between them with any spacing.

    A markdown row's outer bars are optional and text may follow the last bar
    (the proof tables put their parameters there).
    """
    return r"^\|? *" + r" *\| *".join(cells) + r" *(?:\|.*)?$"


def header(*names: str) -> str:
    """``row`` of literal column names."""
    return row(*map(re.escape, names))


@dataclass(frozen=True)
class Run:
    """One invocation: its arguments (``{tmp}`` is the test's folder), the lines it must print, and must not."""

    args: tuple[str, ...]
    expect: tuple[str, ...]
    absent: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    """Written to ``{tmp}`` before the run."""


@dataclass(frozen=True)
class Smoke:
    runs: tuple[Run, ...]
    vllm: str | None = None
    """The vLLM release whose environment the script needs (built here first, outside the run's timeout)."""


HARNESS_TRACES = 20
"""``bench_harness.py --traces``: enough for every event kind it drives (the last test checks it)."""
HARNESS_EVENT_KINDS = {"add_request", "abort", "step", "model_output", "reset_prefix_cache"}

PROOF_TABLE = r"^\| transition \| fcfs \|  \(R=2, B=3, timeout 60 s, symmetric\)$"

SMOKES: dict[str, Smoke] = {
    "bench_async.py": Smoke(
        (
            Run(
                (
                    "--requests",
                    "2",
                    "--prompt",
                    "8",
                    "--output",
                    "4",
                    "--model",
                    "tiny",
                    "--repeats",
                    "1",
                    "--device",
                    "cpu",
                ),
                (
                    r"^2 requests x \(8 prompt \+ 4 output\) tokens, float64, .*identical tokens in both loops$",
                    header(
                        "model",
                        "device",
                        "sync tokens/s",
                        "overlapped tokens/s",
                        "overlapped / sync",
                        "host ms/step (sync)",
                        "forward ms/step (sync)",
                        "bound",
                        "CPU s sync/overlapped",
                        "steps sync/overlapped",
                        "placeholder inputs",
                        "spec k",
                        "drafts accepted sync/overlapped",
                    ),
                    row(
                        rf"tiny \({NUM} M\)",
                        "cpu",
                        NUM,
                        NUM,
                        NUM + "x",
                        NUM,
                        NUM,
                        NUM + "x",
                        f"{NUM}/{NUM}",
                        f"{NUM}/{NUM}",
                        NUM,
                        "0",
                        f"{NUM}/{NUM}",
                    ),
                ),
            ),
        )
    ),
    "bench_campaign.py": Smoke(
        (
            Run(
                ("--traces", "3"),
                (
                    r"^strict campaign, profile vllm-0\.33, seed 0: 3 traces \(0 discarded\), " + NUM + " steps; ",
                    header(
                        "SUT",
                        "verdicts",
                        "traces/s (generation + replay)",
                        "replay s",
                        "init s",
                        "engine s",
                        "comparison s",
                        "protocol and harness s",
                    ),
                    row("reference", "3 pass", NUM, NUM, NUM, "-", NUM, "-?" + NUM),
                    row(r"vLLM 0\.33\.0, one request per call", "3 pass", NUM, NUM, NUM, NUM, NUM, "-?" + NUM),
                    row(r"vLLM 0\.33\.0, a batch per trace", "3 pass", NUM, NUM, NUM, NUM, NUM, "-?" + NUM),
                    row(r"vLLM 0\.33\.0, as schedconf run drives it", "3 pass", NUM, NUM, NUM, NUM, NUM, "-?" + NUM),
                ),
            ),
        ),
        vllm="0.33.0",
    ),
    "bench_engine.py": Smoke(
        (
            Run(
                ("--requests", "2", "--prompt", "8", "--output", "4", "--dense-requests", "1"),
                (
                    r"^model tiny \(.*\), 2 requests x \(8 prompt \+ 4 output\) tokens, .*identical tokens in all three$",
                    header("loop", "tokens/s", "engine speedup", "tokens/CPU-s", "engine speedup (CPU)"),
                    row(r"engine \(paged, batched\)", NUM, NUM + "x", NUM, NUM + "x"),
                    row(r"kv loop \(contiguous KV, unbatched\)", NUM, NUM + "x", NUM, NUM + "x"),
                    row(r"dense loop \(no cache, unbatched; 1 requests\)", NUM, NUM + "x", NUM, NUM + "x"),
                ),
            ),
        )
    ),
    "bench_harness.py": Smoke(
        (
            Run(
                (
                    "--traces",
                    str(HARNESS_TRACES),
                    "--campaign",
                    "4",
                    "--mutants",
                    "--mutant-names",
                    "computed_not_reset_on_preempt",
                ),
                (
                    rf"^replay overhead \({HARNESS_TRACES} generated traces, \d+ steps, best of 3\)$",
                    header("run", "seconds", "per step", "vs reference"),
                    row(r"reference model alone", NUM, NUM + " us", r"1\.00x"),
                    row(r"harness replay \(strict\)", NUM, NUM + " us", NUM + r"x \(\+-?\d+%\)"),
                    r"^campaign throughput \(reference vs itself, 4 traces, generation included\)$",
                    header("jobs", "seconds", "traces/s"),
                    row("1", NUM, NUM),
                    row("2", NUM, NUM),
                    header(
                        "mutant", "real bug", "killed by", "time to kill", "traces to kill", "shrunk trace (events)"
                    ),
                    row("`computed_not_reset_on_preempt`", ".+", ".+", NUM + " s", r"\d+", r"\d+"),
                ),
            ),
        )
    ),
    "bench_impl.py": Smoke(
        (
            Run(
                ("--sizes", "4", "--steps", "2", "--repeats", "1", "--vllm-json", "{tmp}/bench_vllm.json"),
                (
                    header(
                        "requests",
                        "impl ms/step",
                        "spec ms/step",
                        "spec/impl",
                        "impl CPU ms",
                        "spec CPU ms",
                        "vLLM 0.33.0 (bench_vllm.json) ms/step",
                    ),
                    row("4", NUM, NUM, NUM + "x", NUM, NUM, r"1\.50"),
                ),
                files={
                    "bench_vllm.json": json.dumps(
                        {"vllm_version": "0.33.0", "results": [{"requests": 4, "ms_per_step": 1.5}]}
                    )
                },
            ),
        )
    ),
    "bench_impl_floor.py": Smoke(
        (
            Run(
                ("--sizes", "4", "--steps", "2", "--repeats", "1"),
                (
                    r"^steady decode, 128-token prompts, 2 timed steps, best of 1$",
                    header("requests", "impl step ms", "floor ms", "impl / floor"),
                    row("4", NUM, NUM, NUM + "x"),
                ),
            ),
        )
    ),
    "bench_module_sut.py": Smoke(
        (
            Run(
                ("--examples", "3"),
                (
                    r"^\d+ traces, \d+ events, --comparison strict, seed 0$",
                    r"^SUT +start s +traces/s +ms/trace +vs reference$",
                    rf"^reference +{NUM} +{NUM} +{NUM} +1\.00x$",
                    rf"^inprocess:schedconf\.conformance\.adapters\.reference:ReferenceSut +{NUM} +{NUM} +{NUM} +{NUM}x$",
                    rf"^module:schedconf\.conformance\.adapters\.reference:ReferenceSut +{NUM} +{NUM} +{NUM} +{NUM}x$",
                ),
            ),
        )
    ),
    "bench_proofs.py": Smoke(
        (
            Run(
                ("--bounds", "2,3", "--large", "2,3", "--policy", "fcfs", "--transitions", "touch"),
                (
                    r"^\| micro-step \| policy \| result \| time \|  \(all R, B; timeout 60 s\)$",
                    row("`begin_step`", "fcfs", "proved", NUM + " s"),
                    row("`add`", "fcfs", "proved", NUM + " s"),
                    PROOF_TABLE,
                    row("`touch`", NUM + " s"),  # proved: any other status follows the time, in brackets
                    rf"^total {NUM} s$",
                    rf"^wall {NUM} s; load average at end: ",
                ),
                absent=(r"^\| `\w+` \| fcfs \| (?!proved \|)",),
            ),  # an unbounded micro-step not proved
            Run(
                (
                    "--compare",
                    "--skip-unbounded",
                    "--skip-large",
                    "--bounds",
                    "2,3",
                    "--policy",
                    "fcfs",
                    "--transitions",
                    "touch",
                ),
                (
                    (
                        r"^\| transition \| policy \| plain \| symmetric \| plain / symmetric \| load \(1 min\) \|"
                        r"  \(R=2, B=3, timeout 60 s\)$"
                    ),
                    row("`touch`", "fcfs", NUM + " s", NUM + " s", f"(?:{NUM}|-)", NUM),
                    row("`theorem_symmetry`", "fcfs", "-", NUM + " s", "-", NUM),
                    row("total", "", NUM + " s", NUM + " s", NUM, ""),
                ),
                absent=(PROOF_TABLE,),
            ),
        )
    ),
    "bench_spec.py": Smoke(
        (
            Run(
                ("--sizes", "4", "--steps", "2", "--invariants"),
                (
                    header(
                        "requests",
                        "ms/step",
                        "steps/s",
                        "vLLM 0.32 ms/step (2-core, notes)",
                        "+invariants ms/step",
                        "ratio",
                    ),
                    row("4", NUM, NUM, "-", NUM, NUM + "x"),
                ),
            ),
        )
    ),
    "bench_swap.py": Smoke(
        (
            Run(
                ("--block-sizes", "16", "--blocks", "4", "--repeats", "1"),
                (
                    r"^model bench-250m \(bfloat16\), 4 blocks per swap, best of 1, 1 torch thread\(s\)$",
                    header(
                        "block size",
                        "KiB/block",
                        "out blocks/s",
                        "out GB/s",
                        "copy GB/s",
                        "out/copy",
                        "in blocks/s",
                        "in GB/s",
                        "copy GB/s",
                        "in/copy",
                        "exact",
                    ),
                    row("16", NUM, NUM, NUM, NUM, NUM, NUM, NUM, NUM, NUM, "yes"),
                ),
            ),
        )
    ),
    "bench_vllm_vs_spec.py": Smoke(
        (
            Run(
                ("--sizes", "2", "--steps", "2"),
                (
                    r"^steady decode, 128-token prompts, 2 timed steps per column after 1 untimed round\(s\); "
                    r"vLLM 0\.33\.0 timed inside its process; protocol columns: wall time in the harness over "
                    r"vLLM's own time$",
                    header(
                        "requests",
                        "reference ms/step",
                        "vLLM ms/step",
                        "ref/vLLM",
                        "per call ms/step",
                        "per call/vLLM",
                        "batch ms/step",
                        "batch/vLLM",
                    ),
                    row("2", NUM, NUM, NUM + "x", NUM, NUM + "x", NUM, NUM + "x"),
                ),
            ),
        ),
        vllm="0.33.0",
    ),
}


def test_every_bench_script_has_a_smoke_run():
    assert sorted(p.name for p in BENCH.glob("*.py")) == sorted(SMOKES)


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(name, id=name.removesuffix(".py"), marks=[pytest.mark.vllm] if smoke.vllm else [])
        for name, smoke in SMOKES.items()
    ],
)
def test_bench_script_runs_and_prints_its_tables(script: str, tmp_path: Path):
    smoke = SMOKES[script]
    if smoke.vllm:
        ensure_vllm_env(smoke.vllm)
    for run in smoke.runs:
        for name, text in run.files.items():
            (tmp_path / name).write_text(text)
        args = [a.replace("{tmp}", str(tmp_path)) for a in run.args]
        proc = subprocess.run(
            [sys.executable, str(BENCH / script), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        shown = f"$ python bench/{script} {' '.join(args)}\n{proc.stdout}\n--- stderr\n{proc.stderr[-3000:]}"
        assert proc.returncode == 0, shown
        missing = [p for p in run.expect if not re.search(p, proc.stdout, re.MULTILINE)]
        assert not missing, f"no line matches {missing}\n{shown}"
        present = [p for p in run.absent if re.search(p, proc.stdout, re.MULTILINE)]
        assert not present, f"a line matches {present}\n{shown}"


def test_the_harness_smoke_traces_hold_every_event_kind():
    """The traces ``bench_harness.py --traces 20`` replays (its loop) hold every kind of event it drives.

    Its KeyError came on the first prefix-cache reset, in the 15th trace: a smoke
    run over fewer traces would have passed.
    """
    kinds: set[str] = set()
    count = seed = 0
    while count < HARNESS_TRACES:
        try:
            kinds.update(e["kind"] for e in run_workload(random_workload(seed)).events)
            count += 1
        except WorkloadError:
            pass
        seed += 1
    assert HARNESS_EVENT_KINDS <= kinds, HARNESS_EVENT_KINDS - kinds
