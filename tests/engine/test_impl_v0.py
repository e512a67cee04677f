"""The fast v0 scheduler (``impl/v0_scheduler.py``) against the v0 reference model, in lockstep.

The reference is ``schedconf.spec.schedulers.make_scheduler(config, "vllm-0.10")``; the
fast scheduler is driven through its harness adapter (``--sut impl`` with the
``vllm-0.10`` profile). Both get the same inputs: requests with shared
prefixes, aborts (also of queued, swapped and in-flight requests, and of ids
never added), invalid requests, model outputs with EOS and stop tokens; every
schedule() output, request output, refusal code, engine crash and observation
(free GPU/CPU blocks, block tables) must be equal. Configs are drawn small so
that swapping, recompute, prefix hits, partial prefills and priority
preemption happen often (the test checks that they did).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedconf.conformance.adapters.impl import ImplSchedulerSut, get_scheduler_kind
from schedconf.spec.errors import InvalidConfig, SpecError
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.schedulers import make_config, make_scheduler

PROFILE = "vllm-0.10"
EOS, STOP = 2, 5


def draw_config(rng: random.Random) -> dict[str, Any]:
    """A small v0 config the model accepts, biased to tight pools and swapping."""
    while True:
        bs = rng.choice([1, 2, 4, 4, 8])
        mml = rng.choice([8, 12, 16, 24, 32])
        chunked = rng.random() < 0.5
        mnbt = rng.choice([4, 8, 16, 32]) if chunked else max(mml, rng.choice([8, 16, 32, 64]))
        min_gpu = -(-mml // bs)
        ngpu = rng.randint(min_gpu, min_gpu * 3)
        mpp = rng.choice([1, 1, 2, 3]) if chunked else 1
        cfg = {
            "block_size": bs,
            "num_gpu_blocks": ngpu,
            "num_cpu_blocks": rng.choice([0, ngpu // 2, ngpu, ngpu * 4]),
            "max_num_batched_tokens": mnbt,
            "max_num_seqs": rng.randint(1, min(6, mnbt)),
            "max_model_len": mml,
            "enable_chunked_prefill": chunked,
            "enable_prefix_caching": rng.random() < 0.5,
            "policy": "fcfs" if chunked or rng.random() < 0.5 else "priority",
            "preemption_mode": rng.choice([None, "swap", "swap", "recompute"]),
            "max_num_partial_prefills": mpp,
            "max_long_partial_prefills": rng.randint(1, mpp),
            "long_prefill_token_threshold": rng.choice([0, 2, 4, 8]),
        }
        try:
            make_config(cfg, PROFILE)
        except InvalidConfig:
            continue
        return cfg


def _code(call) -> tuple[str, Any]:
    """``("ok", result)`` or ``("error", code)`` of a call (typed spec errors or the adapter's SutInputError)."""
    try:
        return "ok", call()
    except SpecError as exc:
        return "error", exc.code
    except Exception as exc:  # the adapter's SutInputError
        code = getattr(exc, "code", None)
        if code is None:
            raise
        return "error", code


class Lockstep:
    """One reference model and one fast scheduler (through its adapter), fed the same inputs."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.ref = make_scheduler(config, PROFILE)
        self.sut = ImplSchedulerSut()
        self.sut.start(config, PROFILE)
        self.seen: Counter = Counter()
        self.dead = False

    def same(self, ref_call, sut_call, what: str) -> Any:
        a, b = _code(ref_call), _code(sut_call)
        if a[0] == "error" or b[0] == "error":
            assert a == b, f"{what}: reference {a}, impl {b}"
            if a[1].startswith("engine_"):
                self.seen["crash:" + a[1]] += 1
                self.dead = True
            return None
        return a[1], b[1]

    def add(self, kwargs: dict[str, Any]) -> None:
        self.same(lambda: self.ref.add_request(**kwargs), lambda: self.sut.add_request(kwargs), "add_request")

    def abort(self, rid: str) -> None:
        self.same(lambda: self.ref.abort(rid), lambda: self.sut.abort(rid), f"abort {rid}")

    def step(self, rng: random.Random, abort_in_flight: str | None) -> None:
        got = self.same(self.ref.schedule, self.sut.schedule, "schedule")
        if got is None:
            return
        ref_out, sut_canon = got
        ref_canon = ref_out.to_canonical()
        assert sut_canon == ref_canon, f"schedule step {ref_out.step}"
        s = self.seen
        s["swap_out"] += bool(ref_canon["blocks_to_swap_out"])
        s["swap_in"] += bool(ref_canon["blocks_to_swap_in"])
        s["preempted"] += ref_canon["preempted"]
        s["ignored"] += len(ref_canon["ignored_seq_groups"])
        s["prefix_hits"] += sum(bool(g["computed_block_nums"]) for g in ref_canon["scheduled_seq_groups"])
        s["chunks"] += sum(not g["do_sample"] for g in ref_canon["scheduled_seq_groups"])
        if abort_in_flight is not None:
            self.abort(abort_in_flight)
            if self.dead:
                return
        sampled: dict[str, list[int]] = {}
        for g in ref_canon["scheduled_seq_groups"]:
            if g["do_sample"] and g["request_id"] != abort_in_flight:
                sampled[g["request_id"]] = [rng.choice([EOS, STOP, 7, rng.randrange(40), rng.randrange(40)])]
        if rng.random() < 0.03 and sampled:  # a refused model output changes nothing
            bad = dict(sampled)
            bad[next(iter(bad))] = []
            self.same(
                lambda: self.ref.update_from_output(
                    ref_out, ModelRunnerOutput({k: tuple(v) for k, v in bad.items()}, {})
                ),
                lambda: self.sut.update_from_output(bad, {}),
                "bad update",
            )
        got = self.same(
            lambda: self.ref.update_from_output(
                ref_out, ModelRunnerOutput({k: tuple(v) for k, v in sampled.items()}, {})
            ),
            lambda: self.sut.update_from_output(sampled, {}),
            "update",
        )
        if got is not None:
            ref_outputs, sut_outputs = got
            assert sut_outputs == [o.to_canonical() for o in ref_outputs], f"request outputs step {ref_out.step}"
        assert self.sut.observe() == self.ref.observe(), f"observation after step {ref_out.step}"


def run_lockstep(rng: random.Random, num_steps: int = 40) -> Counter:
    """A random workload on both schedulers; returns what happened (swaps, preemptions, ...)."""
    config = draw_config(rng)
    ls = Lockstep(config)
    prefix = [rng.randrange(40) for _ in range(16)]
    mml = config["max_model_len"]
    next_id = 0
    for _ in range(num_steps):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            n = rng.randint(1, mml + 2)
            prompt = (prefix[: rng.randint(0, 16)] + [rng.randrange(40) for _ in range(n)])[:n]
            max_tokens = rng.randint(1, 12)
            kwargs = {
                "request_id": f"r{next_id}",
                "prompt_token_ids": prompt,
                "max_tokens": max_tokens,
                "priority": rng.randint(0, 3) if config["policy"] == "priority" or rng.random() < 0.03 else 0,
                "arrival_time": next_id,
                "eos_token_id": rng.choice([None, EOS]),
                "ignore_eos": rng.random() < 0.2,
                "stop_token_ids": rng.choice([[], [STOP]]),
                "min_tokens": rng.choice([0, 0, min(2, max_tokens)]),
            }
            if rng.random() < 0.03:
                kwargs["max_tokens"] = 0  # refused (invalid_max_tokens)
            next_id += 1
            ls.add(kwargs)
            if ls.dead:
                return ls.seen
        if rng.random() < 0.1:
            ls.abort(f"r{rng.randrange(next_id + 2)}")  # sometimes an id never added
            if ls.dead:
                return ls.seen
        in_flight = f"r{rng.randrange(next_id)}" if next_id and rng.random() < 0.05 else None
        ls.step(rng, in_flight)
        if ls.dead:
            # after a crash both refuse everything with engine_dead
            ls.same(ls.ref.schedule, ls.sut.schedule, "schedule after crash")
            return ls.seen
    return ls.seen


def test_profile_selects_the_v0_scheduler():
    assert get_scheduler_kind("vllm-0.10") == "v0"
    assert get_scheduler_kind("vllm-0.33") == "v1"
    sut = ImplSchedulerSut()
    sut.start(draw_config(random.Random(0)), PROFILE)
    assert sut.v0 and type(sut.scheduler).__name__ == "FastV0Scheduler"


def test_invalid_v0_config_is_refused_with_the_model_code():
    cfg = draw_config(random.Random(1))
    cfg["num_gpu_blocks"] = 0
    with pytest.raises(Exception) as info:
        ImplSchedulerSut().start(cfg, PROFILE)
    assert getattr(info.value, "code", None) == "invalid_num_gpu_blocks"


def test_fast_v0_scheduler_equals_the_reference_on_seeded_workloads():
    seen: Counter = Counter()
    for seed in range(150):
        seen.update(run_lockstep(random.Random(seed)))
    # the workloads reach v0's hard cases (counts from this fixed seed range)
    for key in ("swap_out", "swap_in", "preempted", "ignored", "prefix_hits", "chunks"):
        assert seen[key] > 0, (key, seen)
    assert any(k.startswith("crash:engine_swap_space_exhausted") for k in seen), seen


@given(st.randoms(use_true_random=False))
def test_fast_v0_scheduler_equals_the_reference_hypothesis(rng):
    run_lockstep(rng, num_steps=30)


@pytest.mark.deep
def test_fast_v0_scheduler_equals_the_reference_deep():
    for seed in range(1000, 4000):
        run_lockstep(random.Random(seed), num_steps=60)


def test_fast_v0_scheduler_replays_reference_traces_of_the_v0_generator():
    """Traces the reference records on ``conformance/workloads/workload_v0.py``'s workloads replay strictly."""
    from schedconf.conformance.checking.replay import replay
    from schedconf.conformance.workloads.workload import WorkloadError
    from schedconf.conformance.workloads.workload_v0 import random_v0_workload, run_v0_workload

    verdicts: Counter = Counter()
    for seed in range(60):
        try:
            trace = run_v0_workload(random_v0_workload(seed), max_steps=2000)
        except WorkloadError:
            continue  # the generator could not finish this one; nothing to replay
        result = replay(trace, ImplSchedulerSut())
        assert result.verdict == "pass", (seed, result)
        verdicts[result.verdict] += 1
    assert verdicts["pass"] >= 40, verdicts


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_prefill_that_cannot_append_a_slot_is_preempted_forever(mode):
    """A vLLM 0.10.2 livelock both schedulers reproduce (checked on vLLM itself during development).

    One 13-token prompt, block size 4, 4 GPU blocks, chunked prefill with a 4-token budget. Step 1
    admits it (4 blocks: can_allocate needs cdiv(13, 4) = 4 <= 4 free) and computes a 4-token chunk.
    Step 2: ``can_append_slots`` of the running prefill counts ``1 + ceil((0 - 3) / 4) = 1`` touched
    block (its last block is partly filled, nothing is unseen) against 0 free blocks, so it preempts
    itself. Swap mode: swapped out (4 blocks), and its swap-in is never chunked: 9 uncomputed
    tokens never fit the 4-token budget, so nothing is ever scheduled again. Recompute mode: it is
    re-admitted in step 3 and preempted again in step 4, forever.
    """
    config = {
        "block_size": 4,
        "num_gpu_blocks": 4,
        "num_cpu_blocks": 8,
        "max_num_batched_tokens": 4,
        "max_num_seqs": 4,
        "max_model_len": 16,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": False,
        "policy": "fcfs",
        "preemption_mode": mode,
        "max_num_partial_prefills": 1,
        "max_long_partial_prefills": 1,
        "long_prefill_token_threshold": 0,
    }
    ls = Lockstep(config)
    ls.add(
        {
            "request_id": "a",
            "prompt_token_ids": list(range(1, 14)),
            "max_tokens": 3,
            "priority": 0,
            "arrival_time": 0,
            "eos_token_id": None,
            "ignore_eos": True,
            "stop_token_ids": [],
            "min_tokens": 0,
        }
    )
    outputs = []
    for _ in range(8):
        out = ls.ref.schedule()
        assert ls.sut.schedule() == out.to_canonical()
        outputs.append(out.to_canonical())
        ls.ref.update_from_output(out, ModelRunnerOutput({}, {}))
        ls.sut.update_from_output({}, {})
    chunks = [[g["token_chunk_size"] for g in o["scheduled_seq_groups"]] for o in outputs]
    if mode == "swap":
        assert outputs[1]["blocks_to_swap_out"] == [[0, 0], [1, 1], [2, 2], [3, 3]]
        assert chunks == [[4]] + [[]] * 7 and ls.sut.observe()["cpu_block_tables"] == {"a": [0, 1, 2, 3]}
    else:
        assert chunks == [[4], []] * 4 and [o["preempted"] for o in outputs] == [0, 1] * 4
