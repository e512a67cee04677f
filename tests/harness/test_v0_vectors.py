"""The committed v0 corpus (conformance/traces/vectors/v0/) is what the v0 model generates, and covers v0's hard cases."""

import json

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import PASS, replay
from schedconf.conformance.traces.trace import read_trace, render_trace
from schedconf.conformance.traces.vectors import V0_CORPUS_DIR, build_v0_corpus, iter_corpus, manifest_entry
from schedconf.conformance.workloads.config_limits import V0_PAST_THE_LIMIT, make_v0_refused_config_traces


def test_v0_corpus_matches_the_model():
    manifest = json.loads((V0_CORPUS_DIR / "manifest.json").read_text())
    built = build_v0_corpus(tuple(manifest["profiles"]))
    for profile, items in built.items():
        assert [e["file"] for e in manifest["profiles"][profile]] == [f"{n}.jsonl" for n, _ in items], profile
        for (name, trace), entry in zip(items, manifest["profiles"][profile]):
            committed = (V0_CORPUS_DIR / profile / f"{name}.jsonl").read_text()
            assert committed == render_trace(trace), (
                f"{profile}/{name} changed: if the change is deliberate, run "
                "`python -m schedconf.conformance.traces.vectors --rebuild-v0` and bump V0_CORPUS_VERSION"
            )
            assert entry == manifest_entry(name, trace)


def test_v0_corpus_covers_the_hard_cases():
    entries = [e for _, path, e in iter_corpus("vllm-0.10") if not path.stem.startswith("refused-")]
    feats = {f for e in entries for f in e["features"]}
    assert {
        "swap_out",
        "swap_in",
        "recompute",
        "ignored",
        "partial_prefills",
        "prefix_hit",
        "priority_preemption",
        "abort_waiting",
        "abort_running",
        "abort_swapped",
        "swap_space_exhausted",
        "invalid_input",
    } <= feats
    assert {e["preemption_mode"] for e in entries} == {None, "swap", "recompute"}
    assert {e["policy"] for e in entries} == {"fcfs", "priority"}


def test_every_v0_corpus_trace_replays_on_the_reference():
    sut = ReferenceSut()
    entries = iter_corpus("vllm-0.10")
    assert len(entries) >= 40
    for _, path, _ in entries:
        trace = read_trace(path)
        assert trace.scheduler == "v0"
        result = replay(trace, sut, "strict")
        assert result.verdict == PASS, (path, result.divergence)


def test_every_v0_config_limit_has_a_refused_config_trace():
    traces = dict(make_v0_refused_config_traces("vllm-0.10"))
    assert set(traces) == {rule for rule, _, _ in V0_PAST_THE_LIMIT}  # every rule is one the model enforces
    names = {path.stem for _, path, _ in iter_corpus("vllm-0.10") if path.stem.startswith("refused-")}
    assert names == {f"refused-{rule}" for rule in traces}
    # and the v1 corpus is served as before, without them
    assert all(p != "vllm-0.10" for p, _, _ in iter_corpus("vllm-0.33"))
