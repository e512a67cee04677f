"""The golden trace corpus: a fixed, versioned set of traces per profile.

For implementations in other languages: every trace is self-describing (the
header carries the config, the profile and a description), and
``manifest.json`` lists them with the features each exercises, so a scheduler
that lacks a feature (say prefix caching) can select the traces it should
pass.

The corpus is built deterministically (seeded PRNG workloads, the built-in
examples, and the Z3 witnesses of ``vectors/witnesses/`` when present) and is
committed under ``conformance/vectors/v2/``. ``schedconf vectors export DIR``
copies it; ``python -m conformance.vectors --rebuild`` regenerates it after a
deliberate model change (a test fails until then, and the corpus version must
be bumped when an existing trace changes).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from conformance.campaign import features_of
from conformance.trace import Trace, read_trace, render_trace, write_atomic
from conformance.workload import WorkloadError, run_workload

CORPUS_VERSION = 2
CORPUS_DIR = Path(__file__).with_name("vectors") / f"v{CORPUS_VERSION}"
WITNESS_DIR = Path(__file__).with_name("vectors") / "witnesses"
PROFILES = ("vllm-0.33", "vllm-0.32", "vllm-0.11")
NUM_RANDOM = {"vllm-0.33": 48, "vllm-0.32": 24, "vllm-0.11": 24}


def build_corpus(profiles: tuple[str, ...] = PROFILES) -> dict[str, list[tuple[str, Trace]]]:
    """Build every corpus trace (deterministic)."""
    from conformance.config_limits import make_refused_config_traces
    from conformance.examples import EXAMPLES
    from conformance.generate import random_workload

    corpus: dict[str, list[tuple[str, Trace]]] = {}
    for profile in profiles:
        items: list[tuple[str, Trace]] = []
        for name, make in sorted(EXAMPLES.items()):
            workload = make().replace(profile=profile, origin="vectors")
            trace = run_workload(workload)
            trace.header["description"] = f"built-in example {name!r}: {workload.description}"
            items.append((f"example-{name}", trace))
        seed = 0
        while sum(1 for n, _ in items if n.startswith("random-")) < NUM_RANDOM[profile]:
            workload = random_workload(seed, profile).replace(origin="vectors")
            seed += 1
            try:
                trace = run_workload(workload)
            except WorkloadError:
                continue  # e.g. a vllm-0.11 livelock: not a corpus trace
            if profile == "vllm-0.11" and workload.config.policy == "priority":
                continue  # 0.11's un-repaired priority victim makes outputs no scheduler should copy
            feats = ",".join(features_of(trace)) or "plain"
            trace.header["description"] = f"random workload, generator seed {seed - 1}: {feats}"
            items.append((f"random-{seed - 1:04d}", trace))
        for rule, trace in make_refused_config_traces(profile):
            items.append((f"refused-{rule}", trace))
        if WITNESS_DIR.is_dir():
            for path in sorted(WITNESS_DIR.glob("*.jsonl")):
                witness = read_trace(path)
                if witness.profile == profile:
                    items.append((f"witness-{path.stem}", witness))
        corpus[profile] = items
    return corpus


def manifest_entry(name: str, trace: Trace) -> dict[str, Any]:
    cfg = trace.config
    return {
        "file": f"{name}.jsonl",
        "description": trace.header.get("description", ""),
        "comparison": trace.header.get("comparison", "strict"),
        "features": features_of(trace),
        "prefix_caching": cfg["enable_prefix_caching"],
        "policy": cfg["policy"],
        "spec_decode": cfg["num_spec_tokens"] > 0,
        "chunked_prefill": cfg["enable_chunked_prefill"],
        "events": len(trace.events),
        "steps": trace.num_steps(),
    }


def write_corpus(root: Path, corpus: dict[str, list[tuple[str, Trace]]]) -> dict[str, Any]:
    """Write traces and manifest.json under ``root``."""
    manifest: dict[str, Any] = {
        "corpus_version": CORPUS_VERSION,
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
    """Copy the committed corpus (or the chosen profiles of it) to ``target``."""
    manifest = json.loads((CORPUS_DIR / "manifest.json").read_text())
    chosen = profiles or list(manifest["profiles"])
    unknown = [p for p in chosen if p not in manifest["profiles"]]
    if unknown:
        raise ValueError(f"no vectors for profile(s) {', '.join(unknown)}; known: {', '.join(manifest['profiles'])}")
    out = dict(manifest, profiles={p: manifest["profiles"][p] for p in chosen})
    for profile in chosen:
        (target / profile).mkdir(parents=True, exist_ok=True)
        for entry in manifest["profiles"][profile]:
            shutil.copyfile(CORPUS_DIR / profile / entry["file"], target / profile / entry["file"])
    write_atomic(target / "manifest.json", json.dumps(out, indent=2, sort_keys=True) + "\n")
    return out


def iter_corpus(profile: str | None = None) -> list[tuple[str, Path, dict[str, Any]]]:
    """(profile, path, manifest entry) for every committed corpus trace."""
    manifest = json.loads((CORPUS_DIR / "manifest.json").read_text())
    return [(p, CORPUS_DIR / p / e["file"], e) for p, entries in manifest["profiles"].items()
            if profile in (None, p) for e in entries]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--rebuild"]:
        print("usage: python -m conformance.vectors --rebuild   (regenerates conformance/vectors/v2/)")
        return 2
    if CORPUS_DIR.exists():
        shutil.rmtree(CORPUS_DIR)
    manifest = write_corpus(CORPUS_DIR, build_corpus())
    print(f"rebuilt {sum(len(v) for v in manifest['profiles'].values())} traces in {CORPUS_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
