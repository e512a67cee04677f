"""The golden trace corpus: a fixed, versioned set of traces per profile.

For implementations in other languages: every trace is self-describing (the
header carries the config, the profile and a description), and
``manifest.json`` lists them with the features each exercises, so a scheduler
that lacks a feature (say prefix caching) can select the traces it should
pass.

The corpus is built deterministically (seeded PRNG workloads, the built-in
examples, and the Z3 witnesses of ``vectors/witnesses/`` when present) and is
committed under ``conformance/traces/vectors/v2/``. ``schedconf vectors export DIR``
copies it; ``python -m schedconf.conformance.traces.vectors --rebuild`` regenerates it after a
deliberate model change (a test fails until then, and the corpus version must
be bumped when an existing trace changes).

Async scheduling (profiles ``vllm-0.33-async`` and ``vllm-0.32-async``: vLLM's
AsyncScheduler with steps in flight) has a corpus of its own too,
``conformance/traces/vectors/async/`` (:data:`ASYNC_CORPUS_VERSION`): ``python -m
schedconf.conformance.traces.vectors --rebuild-async``.

vLLM's legacy v0 scheduler (profile ``vllm-0.10``) has a corpus of its own,
``conformance/traces/vectors/v0/`` (its own version, :data:`V0_CORPUS_VERSION`, and
``manifest.json``), built the same way from the v0 model
(``conformance/workloads/workload_v0.py``): ``python -m schedconf.conformance.traces.vectors
--rebuild-v0``. :func:`iter_corpus` and ``schedconf vectors export`` serve both.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedconf.conformance.runs.campaign import features_of
from schedconf.conformance.traces.trace import Trace, read_trace, render_trace, write_atomic
from schedconf.conformance.workloads.workload import Workload, WorkloadError, run_workload

CORPUS_VERSION = 2
CORPUS_DIR = Path(__file__).with_name("vectors") / f"v{CORPUS_VERSION}"
WITNESS_DIR = Path(__file__).with_name("vectors") / "witnesses"
PROFILES = ("vllm-0.33", "vllm-0.32", "vllm-0.11")
NUM_RANDOM = {"vllm-0.33": 48, "vllm-0.32": 24, "vllm-0.11": 24}
ASYNC_CORPUS_VERSION = 2
"""2: spec decode under AsyncScheduler (random workloads keep their drawn num_spec_tokens)."""
ASYNC_CORPUS_DIR = Path(__file__).with_name("vectors") / "async"
ASYNC_PROFILES = ("vllm-0.33-async", "vllm-0.32-async")
ASYNC_NUM_RANDOM = {"vllm-0.33-async": 40, "vllm-0.32-async": 20}
V0_CORPUS_VERSION = 1
V0_CORPUS_DIR = Path(__file__).with_name("vectors") / "v0"
V0_PROFILES = ("vllm-0.10",)
V0_NUM_RANDOM = {"vllm-0.10": 40}


def make_random_traces(
    count: int,
    make: Callable[[int], Workload],
    describe: Callable[[int, Workload, str], str],
    keep: Callable[[Workload], bool] = lambda w: True,
) -> list[tuple[str, Trace]]:
    """``random-SEED`` traces from seeds 0, 1, ... until ``count`` are kept: workloads the
    reference does not finish (a livelock) and those ``keep`` refuses are passed over."""
    items: list[tuple[str, Trace]] = []
    seed = 0
    while len(items) < count:
        workload = make(seed).replace(origin="vectors")
        seed += 1
        if not keep(workload):
            continue
        try:
            trace = run_workload(workload)
        except WorkloadError:
            continue
        trace.header["description"] = describe(seed - 1, workload, ",".join(features_of(trace)) or "plain")
        items.append((f"random-{seed - 1:04d}", trace))
    return items


def build_corpus(profiles: tuple[str, ...] = PROFILES) -> dict[str, list[tuple[str, Trace]]]:
    """Build every corpus trace (deterministic)."""
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.workloads.config_limits import make_refused_config_traces
    from schedconf.conformance.workloads.generate import random_workload

    corpus: dict[str, list[tuple[str, Trace]]] = {}
    for profile in profiles:
        items: list[tuple[str, Trace]] = []
        for name, make in sorted(EXAMPLES.items()):
            workload = make().replace(profile=profile, origin="vectors")
            trace = run_workload(workload)
            trace.header["description"] = f"built-in example {name!r}: {workload.description}"
            items.append((f"example-{name}", trace))
        # 0.11's un-repaired priority victim makes outputs no scheduler should copy: no priority there.
        items += make_random_traces(
            NUM_RANDOM[profile],
            lambda seed: random_workload(seed, profile, in_flight_batches=False),
            lambda seed, w, feats: f"random workload, generator seed {seed}: {feats}",
            keep=lambda w: not (profile == "vllm-0.11" and w.config.policy == "priority"),
        )
        for rule, trace in make_refused_config_traces(profile):
            items.append((f"refused-{rule}", trace))
        if WITNESS_DIR.is_dir():
            for path in sorted(WITNESS_DIR.glob("*.jsonl")):
                witness = read_trace(path)
                if witness.profile == profile:
                    items.append((f"witness-{path.stem}", witness))
        corpus[profile] = items
    return corpus


def build_v0_corpus(profiles: tuple[str, ...] = V0_PROFILES) -> dict[str, list[tuple[str, Trace]]]:
    """Build every v0 corpus trace (deterministic): the v0 examples, seeded v0 workloads, refused configs."""
    from schedconf.conformance.workloads.config_limits import make_v0_refused_config_traces
    from schedconf.conformance.workloads.workload_v0 import V0_EXAMPLES, random_v0_workload

    corpus: dict[str, list[tuple[str, Trace]]] = {}
    for profile in profiles:
        items: list[tuple[str, Trace]] = []
        for name, make in sorted(V0_EXAMPLES.items()):
            workload = make().replace(profile=profile, origin="vectors")
            trace = run_workload(workload)
            trace.header["description"] = f"built-in v0 example {name!r}: {workload.description}"
            items.append((f"example-{name}", trace))
        items += make_random_traces(
            V0_NUM_RANDOM[profile],
            lambda seed: random_v0_workload(seed, profile),
            lambda seed, w, feats: f"random v0 workload ({w.description}), generator seed {seed}: {feats}",
        )
        for rule, trace in make_v0_refused_config_traces(profile):
            items.append((f"refused-{rule}", trace))
        corpus[profile] = items
    return corpus


def build_async_corpus(profiles: tuple[str, ...] = ASYNC_PROFILES) -> dict[str, list[tuple[str, Trace]]]:
    """Build every async corpus trace (deterministic): the built-in examples with two
    steps in flight, then seeded workloads (two, three or one step in flight)."""
    from dataclasses import replace

    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.workloads.generate import random_workload

    corpus: dict[str, list[tuple[str, Trace]]] = {}
    for profile in profiles:
        items: list[tuple[str, Trace]] = []
        for name, make in sorted(EXAMPLES.items()):
            workload = make().replace(profile=profile, origin="vectors")
            workload = workload.replace(config=replace(workload.config, max_concurrent_batches=2))
            trace = run_workload(workload)
            trace.header["description"] = f"built-in example {name!r}, two steps in flight: {workload.description}"
            items.append((f"example-{name}", trace))
        items += make_random_traces(
            ASYNC_NUM_RANDOM[profile],
            lambda seed: random_workload(seed, profile, multi_gpu_rules=False),
            lambda seed, w, feats: (
                f"random workload, generator seed {seed}, {w.config.max_concurrent_batches} step(s) in flight: {feats}"
            ),
        )
        corpus[profile] = items
    return corpus


def manifest_entry(name: str, trace: Trace) -> dict[str, Any]:
    cfg = trace.config
    if trace.scheduler == "v0":
        return {
            "file": f"{name}.jsonl",
            "description": trace.header.get("description", ""),
            "comparison": trace.header.get("comparison", "strict"),
            "features": features_of(trace),
            "prefix_caching": cfg["enable_prefix_caching"],
            "policy": cfg["policy"],
            "spec_decode": False,
            "chunked_prefill": cfg["enable_chunked_prefill"],
            "preemption_mode": cfg["preemption_mode"],
            "partial_prefills": cfg["max_num_partial_prefills"] > 1,
            "events": len(trace.events),
            "steps": trace.num_steps(),
        }
    return {
        "file": f"{name}.jsonl",
        "description": trace.header.get("description", ""),
        "comparison": trace.header.get("comparison", "strict"),
        "features": features_of(trace),
        "prefix_caching": cfg["enable_prefix_caching"],
        "policy": cfg["policy"],
        "spec_decode": cfg["num_spec_tokens"] > 0,
        "chunked_prefill": cfg["enable_chunked_prefill"],
        **({"max_concurrent_batches": cfg["max_concurrent_batches"]} if "max_concurrent_batches" in cfg else {}),
        "events": len(trace.events),
        "steps": trace.num_steps(),
    }


def write_corpus(
    root: Path, corpus: dict[str, list[tuple[str, Trace]]], version: int = CORPUS_VERSION
) -> dict[str, Any]:
    """Write traces and manifest.json under ``root``."""
    manifest: dict[str, Any] = {
        "corpus_version": version,
        "format": "schedconf-trace",
        "format_version": 1,
        "how_to_use": "replay each trace: feed add_request/abort/step/model_output in order and compare "
        "schedule() / update outputs with 'expect' (see FORMAT.md and PROTOCOL.md)",
        "profiles": {},
    }
    for profile, items in corpus.items():
        entries = []
        for name, trace in items:
            write_atomic(root / profile / f"{name}.jsonl", render_trace(trace))
            entries.append(manifest_entry(name, trace))
        manifest["profiles"][profile] = entries
    write_atomic(root / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def export_vectors(target: Path, profiles: list[str] | None = None) -> dict[str, Any]:
    """Copy the committed corpus (or the chosen profiles of it) to ``target``.

    The v0 profiles come from the v0 corpus; when one is exported the manifest
    also says ``v0_corpus_version``.
    """
    manifest = json.loads((CORPUS_DIR / "manifest.json").read_text())
    v0_manifest = json.loads((V0_CORPUS_DIR / "manifest.json").read_text())
    async_manifest = json.loads((ASYNC_CORPUS_DIR / "manifest.json").read_text())
    sources = {p: CORPUS_DIR for p in manifest["profiles"]}
    sources.update({p: V0_CORPUS_DIR for p in v0_manifest["profiles"]})
    sources.update({p: ASYNC_CORPUS_DIR for p in async_manifest["profiles"]})
    entries = {**manifest["profiles"], **v0_manifest["profiles"], **async_manifest["profiles"]}
    chosen = profiles or list(entries)
    unknown = [p for p in chosen if p not in entries]
    if unknown:
        raise ValueError(f"no vectors for profile(s) {', '.join(unknown)}; known: {', '.join(entries)}")
    out = dict(manifest, profiles={p: entries[p] for p in chosen})
    if any(sources[p] == V0_CORPUS_DIR for p in chosen):
        out["v0_corpus_version"] = v0_manifest["corpus_version"]
    if any(sources[p] == ASYNC_CORPUS_DIR for p in chosen):
        out["async_corpus_version"] = async_manifest["corpus_version"]
    for profile in chosen:
        (target / profile).mkdir(parents=True, exist_ok=True)
        for entry in entries[profile]:
            shutil.copyfile(sources[profile] / profile / entry["file"], target / profile / entry["file"])
    write_atomic(target / "manifest.json", json.dumps(out, indent=2, sort_keys=True) + "\n")
    return out


def iter_corpus(profile: str | None = None) -> list[tuple[str, Path, dict[str, Any]]]:
    """(profile, path, manifest entry) for every committed corpus trace (the v0 and async corpora's after the v1 ones)."""
    out = []
    for root in (CORPUS_DIR, V0_CORPUS_DIR, ASYNC_CORPUS_DIR):
        manifest = json.loads((root / "manifest.json").read_text())
        out += [
            (p, root / p / e["file"], e)
            for p, entries in manifest["profiles"].items()
            if profile in (None, p)
            for e in entries
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--rebuild-async"]:
        if ASYNC_CORPUS_DIR.exists():
            shutil.rmtree(ASYNC_CORPUS_DIR)
        manifest = write_corpus(ASYNC_CORPUS_DIR, build_async_corpus(), version=ASYNC_CORPUS_VERSION)
        print(f"rebuilt {sum(len(v) for v in manifest['profiles'].values())} async traces in {ASYNC_CORPUS_DIR}")
        return 0
    if args == ["--rebuild-v0"]:
        if V0_CORPUS_DIR.exists():
            for path in V0_CORPUS_DIR.glob("*/*.jsonl"):
                path.unlink()
        manifest = write_corpus(V0_CORPUS_DIR, build_v0_corpus(), version=V0_CORPUS_VERSION)
        print(f"rebuilt {sum(len(v) for v in manifest['profiles'].values())} v0 traces in {V0_CORPUS_DIR}")
        return 0
    if args != ["--rebuild"]:
        print(
            "usage: python -m schedconf.conformance.traces.vectors --rebuild      (regenerates conformance/traces/vectors/v2/)\n"
            "       python -m schedconf.conformance.traces.vectors --rebuild-v0   (regenerates conformance/traces/vectors/v0/)\n"
            "       python -m schedconf.conformance.traces.vectors --rebuild-async   (regenerates conformance/traces/vectors/async/)"
        )
        return 2
    if CORPUS_DIR.exists():
        shutil.rmtree(CORPUS_DIR)
    manifest = write_corpus(CORPUS_DIR, build_corpus())
    print(f"rebuilt {sum(len(v) for v in manifest['profiles'].values())} traces in {CORPUS_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
