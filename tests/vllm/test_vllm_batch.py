"""vLLM 0.33.0 behind the protocol: a corpus replayed with each trace's calls in one ``batch`` request and
the replies' lists of requests in column form, and one request per call with lists of objects, gives the
same outcome for every trace (PROTOCOL.md, "A trace in one request" and "Column form").

The corpus is what campaigns against vLLM 0.33.0 draw: synchronous traces (with the generator's
throttled steps and prefix-cache resets), and async ones with steps in flight. Every trace passes
(vLLM agrees with the model on them), so the second test breaks one expected output per trace: the
divergence must then be found at the same event, with the same fields, either way, though in a batch
vLLM has run the rest of the trace by the time the harness reads the broken step.
"""

from __future__ import annotations

import copy

import pytest
from vllm_drivers import vllm_sut

from schedconf.conformance.checking.replay import replay
from schedconf.conformance.traces.trace import Trace
from tests.harness.test_batch_protocol import get_corpus, get_outcome

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def corpus() -> list[Trace]:
    sut = vllm_sut("0.33.0")
    traces = get_corpus("vllm-0.33", 60, seed=11, sut=sut) + get_corpus("vllm-0.33-async", 30, seed=12, sut=sut)
    assert len(traces) > 80
    return traces


def replay_both_ways(traces: list[Trace]) -> list[tuple]:
    """One request per call with lists of objects, then a batch per trace with the column form."""
    sut = vllm_sut("0.33.0")
    outcomes = {}
    for batch in (False, True):
        sut.use_batch = sut.use_columns = batch
        try:
            outcomes[batch] = [get_outcome(replay(trace, sut, "strict")) for trace in traces]
            assert sut.columns is batch, "the driver did not agree to the column form at init"
        finally:
            sut.use_batch = sut.use_columns = True
    for index, (per_call, batched) in enumerate(zip(outcomes[False], outcomes[True])):
        assert per_call == batched, f"trace {index}: per call {per_call}, batched {batched}"
    return outcomes[True]


def test_every_trace_passes_both_ways(corpus):
    sut = vllm_sut("0.33.0")
    outcomes = replay_both_ways(corpus)
    assert sut.supports_batch, "the vLLM driver does not list the batch capability"
    assert all(o[0] == "pass" for o in outcomes), [o for o in outcomes if o[0] != "pass"][:3]


def with_broken_step(trace: Trace) -> Trace | None:
    """``trace`` with the middle step's expected token count raised by one (None: no step schedules)."""
    steps = [
        i for i, e in enumerate(trace.events) if e["kind"] == "step" and e.get("expect", {}).get("num_scheduled_tokens")
    ]
    if not steps:
        return None
    broken = copy.deepcopy(trace)
    event = broken.events[steps[len(steps) // 2]]
    rid = sorted(event["expect"]["num_scheduled_tokens"])[0]
    event["expect"]["num_scheduled_tokens"][rid] += 1
    return broken


def test_a_broken_expectation_is_found_at_the_same_event_both_ways(corpus):
    broken = [t for t in map(with_broken_step, corpus) if t is not None]
    assert len(broken) > 60
    outcomes = replay_both_ways(broken)
    assert all(o[0] == "fail" and o[1][3] == "scheduler_output" for o in outcomes), outcomes[:3]


MODEL_CONFIG_CHECK = """
import json, sys
from schedconf.conformance.engines.vllm_driver import VllmSchedulerSut, _Vllm, _model_dir

api = _Vllm()
sut = VllmSchedulerSut(api)
hashes = []
for max_model_len in (64, 96, 64):
    copied = sut._model_config(max_model_len)
    fresh = api.ModelConfig(
        model=_model_dir(), skip_tokenizer_init=True, max_model_len=max_model_len, dtype="float32", seed=0
    )
    differing = [name for name in vars(fresh) if getattr(copied, name) != getattr(fresh, name)]
    hashes.append(
        [copied.compute_hash(), fresh.compute_hash(), copied.max_model_len, copied is not sut._model_config(max_model_len), differing, copied == fresh]
    )
print(json.dumps({"rows": hashes, "hf_configs_parsed": len(sut._hf_configs)}))
"""


def test_the_drivers_kept_model_configs_are_copies_equal_to_a_fresh_build():
    """The driver builds vLLM's ModelConfig once per max_model_len and hands out deep copies, and parses
    the model's HF config once for all lengths (a trace's start in a campaign was half those builds); each
    copy must equal a fresh build with vLLM's own parse, field by field, and be its own object."""
    import json
    import subprocess

    from schedconf.conformance.engines.vllm_env import driver_env, vllm_python

    vllm_sut("0.33.0")  # the environment is built
    done = subprocess.run(
        [str(vllm_python("0.33.0")), "-c", MODEL_CONFIG_CHECK],
        env=driver_env("0.33.0"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    rows = answer["rows"]
    # Two lengths, one parse of the HF config: the second ModelConfig got a copy of the first's.
    assert answer["hf_configs_parsed"] == 1
    for copied_hash, fresh_hash, _, distinct, differing, equal in rows:
        assert copied_hash == fresh_hash
        assert differing == [] and equal  # every field, the parsed HF config included
        assert distinct
    assert [row[2] for row in rows] == [64, 96, 64]
