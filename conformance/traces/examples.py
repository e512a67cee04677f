"""Built-in example workloads: small stories that show the scheduler's hard cases."""

from __future__ import annotations

from schedconf.conformance.workloads.workload import AbortSpec, HashOracle, RequestSpec, Workload
from schedconf.spec.v1.config import SchedulerConfig


def example_mixed() -> Workload:
    """Six requests on a pool that holds about two of them.

    Shows chunked prefill (a budget of 24), prefix hits (three requests share a
    16-token system prompt), FCFS preemption of the tail when decodes grow into
    a full pool, an abort mid-prefill, and a stop on EOS.
    """
    system = tuple(range(100, 116))
    config = SchedulerConfig(
        block_size=4,
        num_gpu_blocks=17,
        max_num_batched_tokens=24,
        max_num_seqs=4,
        max_model_len=48,
    )
    requests = (
        RequestSpec("chat-a", system + (1001, 1002, 1003), max_tokens=12, eos_token_id=1, at_step=0),
        RequestSpec("chat-b", system + (2001, 2002), max_tokens=10, eos_token_id=1, at_step=0),
        RequestSpec("long", tuple(range(3000, 3030)), max_tokens=4, eos_token_id=1, at_step=1),
        RequestSpec("chat-c", system + (4001,), max_tokens=8, eos_token_id=1, at_step=2),
        RequestSpec("short", (5001, 5002, 5003), max_tokens=6, eos_token_id=1, at_step=3),
        RequestSpec("late", tuple(range(6000, 6020)), max_tokens=5, eos_token_id=1, at_step=4),
    )
    return Workload(
        config=config,
        profile="vllm-0.33",
        requests=requests,
        aborts=(AbortSpec("late", 5),),
        oracle=HashOracle(seed=7, eos_per_mille=40),
        seed=7,
        origin="example",
        description="built-in example: chunked prefill, prefix hits, preemption, abort mid-prefill",
    )


EXAMPLES = {"mixed": example_mixed}
