"""Random add / abort / step sequences on small v0 pools, every v0 invariant checked after each rule.

Pools, budgets and CPU pools are drawn close to the prompt sizes so that
preemption (recompute and swap), swap-in, ignored groups, chunked prefill,
partial prefills and prefix hits really happen; vLLM's own crash paths
(EngineCrash) end a run. The last test reports how often each case was
reached and fails if one became rare.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from schedconf.spec.errors import EngineCrash, InvalidEvent
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v0.config import V0SchedulerConfig
from schedconf.spec.v0.invariants import check_invariants
from schedconf.spec.v0.scheduler import Scheduler

EOS = 1
STOP = 2
TOKENS = st.integers(0, 15)
SHARES: Counter[str] = Counter()


@st.composite
def configs(draw):
    block_size = draw(st.sampled_from([1, 2, 4]))
    max_model_len = draw(st.integers(4, 20))
    chunked = draw(st.booleans())
    partial = draw(st.sampled_from([1, 1, 2, 3])) if chunked else 1
    budget = draw(
        st.integers(max(2, max_model_len // 3), max_model_len + 4)
        if chunked
        else st.integers(max_model_len, max_model_len + 4)
    )
    min_blocks = -(-max_model_len // block_size)
    return V0SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(min_blocks, min_blocks + min_blocks // 2 + 2)),
        num_cpu_blocks=draw(st.sampled_from([0, 8, 32, 64])),
        max_num_batched_tokens=budget,
        max_num_seqs=draw(st.integers(1, min(5, budget))),
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.booleans()),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        preemption_mode=draw(st.sampled_from([None, "swap", "swap", "swap", "recompute"])),
        max_num_partial_prefills=partial,
        max_long_partial_prefills=draw(st.integers(1, partial)),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 2, max_model_len // 2])),
    )


class V0SchedulerMachine(RuleBasedStateMachine):
    """Drive the v0 model with random inputs; every invariant after each rule."""

    @initialize(config=configs(), data=st.data())
    def init(self, config, data):
        self.sched = Scheduler(config)
        self.next_id = 0
        self.ids: list[str] = []
        self.prefix = list(range(10, 10 + config.max_model_len))
        self.saw: Counter[str] = Counter()
        for _ in range(data.draw(st.integers(2, 5), label="initial_requests")):
            self.add_request(data)

    def alive(self) -> bool:
        return hasattr(self, "sched") and self.sched.crashed is None

    @precondition(lambda self: self.alive())
    @rule(data=st.data())
    def add_request(self, data):
        cfg = self.sched.config
        length = data.draw(st.integers(1, cfg.max_model_len), label="prompt_len")
        shared = data.draw(st.integers(0, length), label="shared_len") if data.draw(st.booleans()) else 0
        prompt = self.prefix[:shared] + data.draw(st.lists(TOKENS, min_size=length - shared, max_size=length - shared))
        max_tokens = data.draw(st.integers(1, 8), label="max_tokens")
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.sched.add_request(
            rid,
            prompt,
            max_tokens,
            priority=data.draw(st.integers(0, 2), label="priority") if cfg.policy == "priority" else 0,
            arrival_time=self.next_id,
            eos_token_id=EOS,
            ignore_eos=data.draw(st.booleans(), label="ignore_eos"),
            stop_token_ids=[STOP] if data.draw(st.booleans(), label="has_stop") else [],
            min_tokens=data.draw(st.integers(0, max_tokens), label="min_tokens"),
        )
        self.ids.append(rid)

    @precondition(lambda self: self.alive() and bool(self.ids))
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(self.ids), label="abort_id")
        try:
            self.sched.abort(rid)
        except EngineCrash:
            self.saw["crash"] += 1

    @precondition(lambda self: self.alive())
    @rule()
    def abort_unknown(self):
        try:
            self.sched.abort("never-added")
        except InvalidEvent as e:
            assert e.code == "unknown_request_id"
        else:
            raise AssertionError("abort of an unknown id must be refused")

    @precondition(lambda self: self.alive() and self.sched.has_requests())
    @rule(data=st.data(), repeat=st.integers(1, 6))
    def step(self, data, repeat):
        for _ in range(repeat):
            if self.alive() and self.sched.has_requests():
                self._step(data)

    def _step(self, data):
        sched = self.sched
        try:
            out = sched.schedule()
        except EngineCrash:
            self.saw["crash"] += 1
            return
        check_invariants(sched)
        if out.preempted:
            self.saw["preemption"] += 1
        if out.blocks_to_swap_out:
            self.saw["swap_out"] += 1
        if out.blocks_to_swap_in:
            self.saw["swap_in"] += 1
        if out.ignored_seq_groups:
            self.saw["ignored"] += 1
        if any(not g.do_sample for g in out.scheduled_seq_groups):
            self.saw["chunked_prefill"] += 1
        if any(g.computed_block_nums and g.is_prompt for g in out.scheduled_seq_groups):
            self.saw["prefix_hit"] += 1
        sampled = {g.request_id: (data.draw(TOKENS, label="token"),) for g in out.scheduled_seq_groups if g.do_sample}
        if self.ids and data.draw(st.integers(0, 9), label="abort_mid") == 0:
            try:
                sched.abort(data.draw(st.sampled_from(self.ids), label="abort_mid_id"))
            except EngineCrash:
                self.saw["crash"] += 1
                return
        sched.update_from_output(out, ModelRunnerOutput(sampled))

    @precondition(lambda self: hasattr(self, "sched") and self.sched.crashed is not None)
    @rule()
    def dead_engine_refuses(self):
        for call in (self.sched.schedule, lambda: self.sched.abort("r0"), lambda: self.sched.add_request("x", [1], 1)):
            try:
                call()
            except EngineCrash as e:
                assert e.code == "engine_dead"
            else:
                raise AssertionError("a dead engine must refuse every call")

    @invariant()
    def all_invariants(self):
        if self.alive():
            check_invariants(self.sched)

    def teardown(self):
        if hasattr(self, "sched") and self.sched.current_step >= 5:
            SHARES["examples"] += 1
            for key in self.saw:
                SHARES[key] += 1


def test_stateful_v0_and_reachability_shares():
    """Run the machine (every invariant after each rule); then fail if a hard case is reached in
    under 5% of the runs of >= 5 steps. One run serves both, to keep CI time down."""
    SHARES.clear()
    run_state_machine_as_test(V0SchedulerMachine, settings=settings(stateful_step_count=30))
    n = SHARES["examples"]
    assert n >= 10, f"only {n} runs reached 5 steps"
    shares = {
        k: SHARES[k] / n
        for k in ("preemption", "swap_out", "swap_in", "ignored", "chunked_prefill", "prefix_hit", "crash")
    }
    print("\nv0 stateful runs of >= 5 steps:", n, " ".join(f"{k}={v:.0%}" for k, v in shares.items()))
    for key in ("preemption", "swap_out", "chunked_prefill", "prefix_hit"):
        assert shares[key] >= 0.05, (key, shares)
