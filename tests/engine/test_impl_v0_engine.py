"""The v0 engine on the CPU: real swapping, tokens equal to the dense greedy oracle.

Expected tokens come from ``impl/dense.py`` (full recompute, one request, no
cache; with v0's stop rules) and expected scheduler outputs from the v0
reference model (``schedconf.spec.schedulers.make_scheduler``) fed the engine's own
tokens; the engine's answers are never the oracle.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from schedconf.conformance.adapters.impl import ImplEngineSut
from schedconf.impl.dense import dense_generate
from schedconf.impl.v0_engine import V0Engine
from schedconf.spec.errors import EngineCrash
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.schedulers import make_config, make_scheduler

PROFILE = "vllm-0.10"


def v0_config(**fields):
    base = dict(
        block_size=4,
        num_gpu_blocks=4,
        num_cpu_blocks=8,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        max_model_len=16,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        policy="fcfs",
        preemption_mode="swap",
        max_num_partial_prefills=1,
        max_long_partial_prefills=1,
        long_prefill_token_threshold=0,
    )
    base.update(fields)
    return base


def dense_tokens(model, record, max_model_len):
    return dense_generate(
        model,
        record.prompt,
        record.max_tokens,
        max_model_len=max_model_len,
        eos_token_id=record.eos_token_id,
        ignore_eos=record.ignore_eos,
        stop_token_ids=record.stop_token_ids,
        min_tokens=record.min_tokens,
        defer_length_to_min_tokens=True,
    )


def swap_workload(model, **engine_kwargs) -> V0Engine:
    """Two 7-token prompts on a 4-block GPU pool (block_size 4, swap mode, watermark 0).

    Step 1 admits both: a gets blocks [0, 1], b gets [2, 3] (the free deque
    pops from the left). Step 2: both decode and each needs one touched block
    (``1 + ceil((1 - 1) / 4)``), none is free: a preempts the tail b, which is
    swapped out (its 1 full block + 1 touched fit the 8 CPU blocks): b's GPU
    blocks are freed in order (free deque [3, 2]) and CPU blocks 0, 1 taken:
    ``blocks_to_swap_out == [[2, 0], [3, 1]]``. a needs no new block (its tail
    has 1 empty slot). Step 3 gives a block 3; b cannot swap in while it would
    need 2 blocks and 1 is free (LATER), and no prefill runs while b is
    swapped. a finishes at step 6 (6 tokens) and frees [0, 1, 3] (free deque
    [3, 1, 0, 2]). Step 7 swaps b in: CPU blocks freed, GPU blocks 3 (full)
    and 1 (tail) taken: ``blocks_to_swap_in == [[0, 3], [1, 1]]``; b's decode
    at position 7 attends over positions 0..6 read from those swapped-in bytes.
    """
    engine = V0Engine(make_config(v0_config(), PROFILE), model, **engine_kwargs)
    engine.add_request("a", [11, 12, 13, 14, 15, 16, 17], 6, ignore_eos=True)
    engine.add_request("b", [21, 22, 23, 24, 25, 26, 27], 6, ignore_eos=True)
    return engine


def test_swapped_out_and_back_in_request_generates_the_dense_tokens(tiny_model):
    engine = swap_workload(tiny_model)
    steps = []
    while engine.has_requests():
        steps.append(engine.step().output.to_canonical())
    assert steps[1]["blocks_to_swap_out"] == [[2, 0], [3, 1]] and steps[1]["preempted"] == 1
    assert [g["request_id"] for g in steps[1]["scheduled_seq_groups"]] == ["a"]
    assert all(not s["blocks_to_swap_in"] for s in steps[2:6])
    assert steps[6]["blocks_to_swap_in"] == [[0, 3], [1, 1]] and steps[6]["finished_requests_ids"] == ["a"]
    assert steps[6]["scheduled_seq_groups"][0]["block_table"] == [3, 1]
    assert engine.num_swapped_out_blocks == 2 and engine.num_swapped_in_blocks == 2
    for record in engine.records:
        assert record.output_tokens == dense_tokens(tiny_model, record, 16).tokens, record.req_id
        assert record.finish_reason == "length"
    # nothing was recomputed: b's 7 prompt positions were computed once, in step 1
    assert engine.stats.num_forward_tokens == 7 + 7 + 5 + 5 and engine.stats.num_repaired_tokens == 0


def test_swap_moves_the_kv_bytes(tiny_model):
    """b's keys/values survive device -> host -> other device blocks bit for bit."""
    engine = swap_workload(tiny_model)
    runner = engine.runner
    engine.step()  # b's 7 positions now in device blocks 2 (full) and 3 (3 slots)
    before = [(k[[2, 3]].clone(), v[[2, 3]].clone()) for k, v in zip(runner.k_cache, runner.v_cache)]
    assert any(float(k.abs().sum()) > 0 for k, _ in before)
    engine.step()  # swap-out: host blocks 0, 1
    for (k, v), kh, vh in zip(before, runner.k_host, runner.v_host):
        assert torch.equal(kh[[0, 1]], k) and torch.equal(vh[[0, 1]], v)
    for _ in range(4):
        engine.step()
    # Before step 7, device block 3 belongs to a: b's bytes are only on the host.
    assert not torch.equal(runner.k_cache[0][3], before[0][0][0])
    engine.step()  # swap-in: device blocks 3 (b's full block) and 1 (b's tail)
    for (k, v), kd, vd in zip(before, runner.k_cache, runner.v_cache):
        assert torch.equal(kd[3], k[0]) and torch.equal(vd[3], v[0])
        assert torch.equal(kd[1][:3], k[1][:3]) and torch.equal(vd[1][:3], v[1][:3])


def test_corrupted_host_copy_changes_the_tokens(tiny_model):
    """The swapped-in request really reads the host bytes: zeroing them changes its generation."""
    engine = swap_workload(tiny_model)
    engine.step()
    engine.step()  # b swapped out to host blocks 0, 1
    for kh, vh in zip(engine.runner.k_host, engine.runner.v_host):
        kh[[0, 1]] = 0.0
        vh[[0, 1]] = 0.0
    engine.run()
    b = next(r for r in engine.records if r.req_id == "b")
    a = next(r for r in engine.records if r.req_id == "a")
    assert a.output_tokens == dense_tokens(tiny_model, a, 16).tokens
    assert b.output_tokens[0] == dense_tokens(tiny_model, b, 16).tokens[0]  # sampled in step 1, before the swap
    assert b.output_tokens != dense_tokens(tiny_model, b, 16).tokens


def _same_crash(engine_call, ref_call) -> str | None:
    """Run both calls; an engine crash on one side must be the same crash on the other (its code)."""
    codes = []
    results = []
    for call in (engine_call, ref_call):
        try:
            results.append(call())
            codes.append(None)
        except EngineCrash as exc:
            codes.append(exc.code)
    assert codes[0] == codes[1], codes
    if codes[0] is None and isinstance(results[0], list):
        assert results[0] == results[1]
    return codes[0]


def _engine_with_reference(model, config: dict, arrivals, seed: int) -> tuple[V0Engine, Counter]:
    """Run the engine; the reference model, fed the engine's tokens, must schedule identically."""
    rng = random.Random(seed)
    engine = V0Engine(make_config(config, PROFILE), model)
    ref = make_scheduler(config, PROFILE)
    seen: Counter = Counter()
    pending = sorted(arrivals, key=lambda a: a[0])
    step = 0
    while pending or engine.has_requests():
        while pending and pending[0][0] <= step:
            _, rid, prompt, kwargs = pending.pop(0)
            engine.add_request(rid, prompt, **kwargs)
            ref.add_request(rid, prompt, **kwargs)
        if engine.has_requests() and rng.random() < 0.03:
            rid = rng.choice([r.req_id for r in engine.records])
            crash = _same_crash(lambda: engine.abort(rid), lambda: ref.abort(rid))
            if crash:
                seen["crash:" + crash] += 1
                break
        if engine.has_requests():
            crash = _same_crash(engine.scheduler.schedule, ref.schedule)
            if crash:
                seen["crash:" + crash] += 1
                break
            out, ref_out = engine.scheduler.pending, ref.pending.output
            canon = out.to_canonical()
            assert canon == ref_out.to_canonical(), f"step {step}"
            result = engine.runner.execute(out)
            sampled = {e[0].req_id: (t,) for e, t in zip(out.entries, result.sampled) if t is not None}
            mine = engine.scheduler.update_from_output(out, result.sampled)
            theirs = ref.update_from_output(ref_out, ModelRunnerOutput(sampled, {}))
            assert [(o[0], list(o[1]), o[2], o[3]) for o in mine] == [
                (o.req_id, list(o.new_token_ids), o.finish_reason, o.stop_reason) for o in theirs
            ]
            for rid, _, reason, stop in mine:
                if reason is not None:
                    record = next(r for r in reversed(engine.records) if r.req_id == rid)
                    record.finish_reason, record.stop_reason = reason, stop
            seen["swap_out"] += len(canon["blocks_to_swap_out"])
            seen["swap_in"] += len(canon["blocks_to_swap_in"])
            seen["preempted"] += canon["preempted"]
            seen["hits"] += sum(bool(g["computed_block_nums"]) for g in canon["scheduled_seq_groups"])
            seen["repaired"] += result.num_repaired_tokens
        step += 1
    return engine, seen


@pytest.mark.parametrize("chunked,caching", [(False, False), (True, False), (False, True), (True, True)])
def test_random_v0_workloads_generate_the_dense_tokens(tiny_model, chunked, caching):
    seen: Counter = Counter()
    for seed in range(6):
        rng = random.Random(seed * 10 + chunked * 2 + caching)
        mode = rng.choice(["swap", "swap", None])
        # (priority preemption in swap mode crashes vLLM 0.10.2: the scheduler tests cover that)
        config = v0_config(
            block_size=rng.choice([2, 4]),
            num_gpu_blocks=12,
            num_cpu_blocks=64,
            max_num_batched_tokens=12 if chunked else 24,
            max_model_len=24,
            max_num_seqs=5,
            enable_chunked_prefill=chunked,
            enable_prefix_caching=caching,
            preemption_mode=mode,
            policy="priority" if not chunked and mode is None and seed % 2 == 0 else "fcfs",
            max_num_partial_prefills=2 if chunked and seed % 2 else 1,
        )
        system = [rng.randrange(512) for _ in range(8)]
        arrivals = []
        for i in range(7):
            prompt = system[: rng.choice([0, 4, 8])] + [rng.randrange(512) for _ in range(rng.randrange(1, 10))]
            arrivals.append(
                (
                    i // 2,
                    f"r{i}",
                    prompt,
                    {
                        "max_tokens": rng.randrange(4, 14),
                        "eos_token_id": 1,
                        "priority": rng.randrange(3) if config["policy"] == "priority" else 0,
                        "arrival_time": i,
                        "min_tokens": rng.choice([0, 2]),
                    },
                )
            )
        engine, s = _engine_with_reference(tiny_model, config, arrivals, seed)
        seen.update(s)
        for record in engine.records:
            dense = dense_tokens(tiny_model, record, config["max_model_len"])
            if record.finish_reason in ("abort", None):  # aborted, or cut by an engine crash
                assert record.output_tokens == dense.tokens[: len(record.output_tokens)], record.req_id
            else:
                assert record.output_tokens == dense.tokens, (seed, record.req_id)
                assert record.finish_reason == dense.finish_reason, (seed, record.req_id)
        assert not engine.stats.near_ties
    assert seen["swap_out"] > 0 and seen["swap_in"] > 0 and seen["preempted"] > 0, seen
    if caching:
        assert seen["hits"] > 0, seen


def test_impl_engine_adapter_replays_v0_traces_teacher_forced():
    """``--sut impl-engine --profile vllm-0.10``: reference traces pass, every sampled position checked."""
    from schedconf.conformance.checking.replay import replay
    from schedconf.conformance.workloads.workload import WorkloadError
    from schedconf.conformance.workloads.workload_v0 import random_v0_workload, run_v0_workload

    passed = checked = swapped = 0
    for seed in range(12):
        try:
            trace = run_v0_workload(random_v0_workload(seed), max_steps=2000)
        except WorkloadError:
            continue
        sut = ImplEngineSut()
        result = replay(trace, sut)
        assert result.verdict == "pass", (seed, result)
        assert not sut.failures
        passed += 1
        checked += sut.num_checked_positions
        swapped += sut.runner.num_swapped_in_blocks if sut.runner is not None else 0
    assert passed >= 6 and checked > 0


def _run_arrivals(engine: V0Engine, arrivals) -> None:
    pending = list(arrivals)
    step = 0
    while pending or engine.has_requests():
        while pending and pending[0][0] <= step:
            _, rid, prompt, kwargs = pending.pop(0)
            engine.add_request(rid, prompt, **kwargs)
        if engine.has_requests():
            engine.step()
        step += 1


def test_prefix_hits_on_blocks_whose_kv_was_never_written_are_repaired(tiny_model):
    """v0 registers a prompt's full blocks in the prefix cache when it *allocates* them and counts
    them as computed once that schedule() ends, although a chunked prefill writes their KV only
    chunk by chunk. Here r0 (19 tokens) is admitted in step 0 and computes 8 positions; r1 arrives
    in step 1 with the same 16-token prefix: its prefix hit (``computed_block_nums``) covers blocks
    r0 has not computed yet, and r0's own chunk in that step (4 positions: two partial prefills
    share the 8-token budget) does not reach them. A runner that skips the hit, as vLLM v0's does,
    reads KV never written (the control, ``repair=False``, generates wrong tokens for r1); the
    engine recomputes the invalid blocks of the context instead and matches the oracle.
    """
    rng = random.Random(16)
    config = v0_config(
        block_size=2,
        num_gpu_blocks=40,
        num_cpu_blocks=64,
        max_num_batched_tokens=8,
        max_model_len=32,
        max_num_seqs=4,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        preemption_mode=None,
        max_num_partial_prefills=2,
        max_long_partial_prefills=2,
        long_prefill_token_threshold=4,
    )
    for draw in ([1, 2], [6, 8, 10], [1, 2, 3], [0, 4], [1, 2]):  # advance the generator as the search that found it
        rng.choice(draw)
    system = [rng.randrange(512) for _ in range(20)]
    arrivals = []
    for i in range(5):
        prompt = system[: rng.choice([12, 16, 20])] + [rng.randrange(512) for _ in range(rng.randrange(1, 4))]
        arrivals.append((i, f"r{i}", prompt, {"max_tokens": 4, "ignore_eos": True, "arrival_time": i}))
    assert (len(arrivals[0][2]), len(arrivals[1][2])) == (19, 18)
    repaired = V0Engine(make_config(config, PROFILE), tiny_model)
    _run_arrivals(repaired, arrivals)
    assert repaired.stats.num_repaired_tokens > 0
    for record in repaired.records:
        assert record.output_tokens == dense_tokens(tiny_model, record, 32).tokens, record.req_id
    control = V0Engine(make_config(config, PROFILE), tiny_model, repair=False)
    _run_arrivals(control, arrivals)
    wrong = [r.req_id for r in control.records if r.output_tokens != dense_tokens(tiny_model, r, 32).tokens]
    assert wrong == ["r1"]


def test_swap_check_dry_run_on_the_cpu(tmp_path):
    """``gpu_checks/swap_check.py`` (the GPU session's script) runs end to end on the CPU."""
    import json

    from schedconf.gpu_checks import swap_check

    rc = swap_check.main(
        [
            "--device",
            "cpu",
            "--allow-cpu",
            "--out",
            str(tmp_path),
            "--model",
            "tiny",
            "--dtype",
            "float64",
            "--block-sizes",
            "2,8",
            "--blocks",
            "8",
            "--repeats",
            "1",
            "--tokens-model",
            "tiny",
            "--token-seeds",
            "2",
        ]
    )
    report = json.loads((tmp_path / "swap_check.json").read_text())
    assert rc == 0 and report["verdict"] == "pass"
    assert [r["block_size"] for r in report["rows"]] == [2, 8] and all(r["round_trip_exact"] for r in report["rows"])
    assert report["tokens"]["swapped_in_blocks"] > 0 and not report["tokens"]["mismatches"]


def test_engine_refuses_to_spin_in_the_v0_livelock(tiny_model):
    """The livelock of ``test_impl_v0.py`` (a self-preempting chunked prefill): ``run`` stops with an error."""
    config = v0_config(max_num_batched_tokens=4, enable_chunked_prefill=True)
    engine = V0Engine(make_config(config, PROFILE), tiny_model)
    engine.add_request("a", list(range(1, 14)), 3, ignore_eos=True)
    with pytest.raises(RuntimeError, match="no progress"):
        engine.run(max_idle_steps=5)
    assert engine.scheduler.observe()["cpu_block_tables"] == {"a": [0, 1, 2, 3]}
    assert engine.num_swapped_out_blocks == 4 and engine.num_swapped_in_blocks == 0


def test_copy_blocks_moves_device_bytes_and_validity(tiny_model):
    """``blocks_to_copy`` (copy-on-write; vLLM never emits it for single-sequence groups) copies every layer."""
    engine = swap_workload(tiny_model)
    engine.step()  # a in device blocks 0 (full) and 1 (3 slots), b in 2 and 3
    runner = engine.runner
    runner.copy_blocks([(0, 2)])
    for k, v in zip(runner.k_cache, runner.v_cache):
        assert torch.equal(k[2], k[0]) and torch.equal(v[2], v[0])
    assert runner._gpu_valid(2) == runner._gpu_valid(0) == 4


def test_impl_engine_passes_the_v0_corpus_and_300_generated_traces(tmp_path):
    """The issue's CI check: ``--sut impl-engine --profile vllm-0.10`` on the v0 corpus and 300 generated traces.

    Teacher-forced: the engine schedules, executes the swaps and the forward,
    and its greedy tokens are checked at every sampled position against the
    trace (whose tokens the dense oracle produced).
    """
    from pathlib import Path

    from schedconf.conformance.checking.replay import replay
    from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign
    from schedconf.conformance.traces.trace import read_trace

    corpus = sorted(
        (Path(__file__).parents[2] / "conformance" / "traces" / "vectors" / "v0" / "vllm-0.10").glob("*.jsonl")
    )
    assert len(corpus) >= 50
    for path in corpus:
        result = replay(read_trace(path), ImplEngineSut())
        assert result.verdict == "pass", (path.name, result)
    summary = run_campaign(
        CampaignSpec(
            sut="impl-engine",
            profile="vllm-0.10",
            examples=300,
            seed=11,
            jobs=1,
            out_dir=str(tmp_path),
            run_id="impl-v0",
            quiet=True,
        )
    )
    assert summary["failed"] == 0 and summary["unknown"] == 0, summary.get("failures")
    assert summary["passed"] >= 250 and summary["coverage"]["swap_in"] > 0, summary["coverage"]
