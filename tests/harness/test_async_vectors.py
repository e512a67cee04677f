"""The async corpus (conformance/traces/vectors/async/) is what the model generates, covers the in-flight cases,
and replays on the reference (drift guard, like tests/harness/test_vectors.py)."""

import json

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import replay
from schedconf.conformance.traces.trace import read_trace, render_trace
from schedconf.conformance.traces.vectors import ASYNC_CORPUS_DIR, build_async_corpus, manifest_entry


def test_async_corpus_matches_the_model():
    manifest = json.loads((ASYNC_CORPUS_DIR / "manifest.json").read_text())
    built = build_async_corpus(tuple(manifest["profiles"]))
    for profile, items in built.items():
        assert [e["file"] for e in manifest["profiles"][profile]] == [f"{n}.jsonl" for n, _ in items], profile
        for (name, trace), entry in zip(items, manifest["profiles"][profile]):
            committed = (ASYNC_CORPUS_DIR / profile / f"{name}.jsonl").read_text()
            assert committed == render_trace(trace), (
                f"{profile}/{name} changed: if the model change is deliberate, run "
                "`python -m schedconf.conformance.traces.vectors --rebuild-async` and bump ASYNC_CORPUS_VERSION"
            )
            assert entry == manifest_entry(name, trace)


def test_async_corpus_covers_the_in_flight_cases():
    manifest = json.loads((ASYNC_CORPUS_DIR / "manifest.json").read_text())
    for profile in ("vllm-0.33-async", "vllm-0.32-async"):
        entries = manifest["profiles"][profile]
        feats = {f for e in entries for f in e["features"]}
        assert {
            "steps_in_flight",
            "scheduled_in_flight",
            "preempted_in_flight",
            "stale_output",
            "aborted_in_flight",
            "finished_in_flight",
            "preemption",
            "resume",
            "prefix_cache_reset",
            "prefix_cache_reset_running",
            "spec_decode",
            "drafts_in_flight",
            "drafts_rejected_in_flight",
        } <= feats, profile
        # Every depth of the batch queue the generator draws: 1, 2 and 3 steps in flight.
        assert {e.get("max_concurrent_batches", 1) for e in entries} == {1, 2, 3}, profile


def test_async_corpus_replays_on_the_reference():
    manifest = json.loads((ASYNC_CORPUS_DIR / "manifest.json").read_text())
    for profile, entries in manifest["profiles"].items():
        for entry in entries:
            trace = read_trace(ASYNC_CORPUS_DIR / profile / entry["file"])
            result = replay(trace, ReferenceSut())
            assert result.verdict == "pass", (profile, entry["file"], result.divergence)


def test_in_flight_traces_rebuild_from_themselves():
    """workload_from_trace (the shrinker's start) reproduces a trace with steps in flight exactly: inputs
    right after a step stay in flight of it, inputs after an output come before the next schedule()."""
    from schedconf.conformance.workloads.generate import random_workload
    from schedconf.conformance.workloads.workload import run_workload, workload_from_trace

    checked = resets = 0
    for profile in ("vllm-0.33-async", "vllm-0.32-async", "vllm-0.33"):
        for seed in range(80):
            trace = run_workload(random_workload(seed, profile))
            has_reset = any(e["kind"] == "reset_prefix_cache" for e in trace.events)
            if trace.config.get("max_concurrent_batches", 1) < 2 and not has_reset:
                continue
            # Dropped stale output (a reset's preemption) samples a position again: the rebuilt
            # oracle keeps tokens by position, so the resampled token is the one replayed.
            assert run_workload(workload_from_trace(trace)).events == trace.events, (profile, seed)
            checked += 1
            resets += has_reset
    assert checked >= 80 and resets >= 10, (checked, resets)


def test_wrong_scheduler_stats_fail_a_strict_replay():
    """Stats are compared when the trace has them and the scheduler reports them; a miscount fails."""
    from schedconf.conformance.workloads.generate import random_workload
    from schedconf.conformance.workloads.workload import run_workload

    class MiscountingSut(ReferenceSut):
        def get_scheduler_stats(self):
            stats = super().get_scheduler_stats()
            if stats is None or not stats["prefix_cache"]["requests"]:
                return stats
            return {**stats, "prefix_cache": {**stats["prefix_cache"], "hits": stats["prefix_cache"]["hits"] + 1}}

    class SilentSut(ReferenceSut):
        def get_scheduler_stats(self):
            return None  # reports no stats: nothing to compare

    trace = run_workload(random_workload(3, "vllm-0.33-async"))
    assert any("stats" in e.get("expect", {}) for e in trace.events)
    result = replay(trace, MiscountingSut())
    assert result.verdict == "fail" and result.divergence.kind == "scheduler_stats", result.divergence
    assert result.divergence.diffs[0].field == "stats.prefix_cache.hits"
    assert replay(trace, SilentSut()).verdict == "pass"
    assert replay(trace, ReferenceSut()).verdict == "pass"
