"""The committed corpus is exactly what the current model generates (drift guard)."""

import json

from schedconf.conformance.traces.trace import render_trace
from schedconf.conformance.traces.vectors import CORPUS_DIR, build_corpus, manifest_entry


def test_corpus_matches_the_model():
    manifest = json.loads((CORPUS_DIR / "manifest.json").read_text())
    built = build_corpus(tuple(manifest["profiles"]))
    for profile, items in built.items():
        names = [e["file"] for e in manifest["profiles"][profile]]
        assert names == [f"{n}.jsonl" for n, _ in items], profile
        for (name, trace), entry in zip(items, manifest["profiles"][profile]):
            committed = (CORPUS_DIR / profile / f"{name}.jsonl").read_text()
            assert committed == render_trace(trace), (
                f"{profile}/{name} changed: if the model change is deliberate, run "
                "`python -m schedconf.conformance.traces.vectors --rebuild` and bump CORPUS_VERSION"
            )
            assert entry == manifest_entry(name, trace)


def test_corpus_covers_the_hard_cases():
    manifest = json.loads((CORPUS_DIR / "manifest.json").read_text())
    feats = {f for e in manifest["profiles"]["vllm-0.33"] for f in e["features"]}
    assert {"preemption", "prefix_hit", "spec_decode", "resume", "abort", "invalid_input", "budget_exhausted"} <= feats
    no_cache = [e for e in manifest["profiles"]["vllm-0.33"] if not e["prefix_caching"]]
    assert len(no_cache) >= 5
