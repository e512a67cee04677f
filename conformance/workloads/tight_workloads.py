"""Seeded random workloads with tight KV pools (no Hypothesis needed).

A second generator next to ``conformance/workloads/generate.py``, first written for the
campaigns of our engine (``impl/``; its traces keep the origin
``impl-campaign``) but free of any engine: it builds plain
:class:`~schedconf.conformance.workloads.workload.Workload` objects.

``make_tight_workload(seed)`` draws a scheduler config and a request mix built to
reach the hard cases: small pools (preemption), shared prompt prefixes (prefix
hits and the free-queue order), small budgets and thresholds (chunked
prefill), chunked prefill off, both policies, spec decode with lookahead and
padding, stop ids, EOS, ``ignore_eos``, aborts and invalid inputs. The same
seed always gives the same workload (``random.Random(seed)`` only).
"""

from __future__ import annotations

import random

from schedconf.conformance.workloads.workload import AbortSpec, HashOracle, InvalidInput, RequestSpec, Workload
from schedconf.spec.v1.config import SchedulerConfig, cdiv


def make_tight_config(rng: random.Random, *, profile: str) -> SchedulerConfig:
    """A valid SchedulerConfig that keeps the pool tight enough to preempt."""
    block_size = rng.choice([1, 2, 4, 4, 8, 16])
    max_model_len = rng.choice([16, 24, 32, 48, 64, 96])
    min_blocks = cdiv(max_model_len, block_size) + 1
    num_gpu_blocks = min_blocks + rng.choice([0, 1, 2, 4, 8, 16, 64])
    num_spec_tokens = rng.choice([0, 0, 0, 1, 2, 3])
    chunked = rng.random() < 0.8
    budget = rng.choice([4, 8, 16, 32, 64, 256])
    if not chunked:
        budget = max(budget, max_model_len)
    threshold = rng.choice([0, 0, 0, 4, 8, 16])
    if threshold and threshold <= num_spec_tokens:
        threshold = num_spec_tokens + 1
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=min(budget, rng.choice([1, 2, 3, 4, 8, 16])),  # vLLM wants budget >= seats
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=rng.random() < 0.75,
        policy=rng.choice(["fcfs", "fcfs", "priority"]),
        num_spec_tokens=num_spec_tokens,
        num_lookahead_tokens=rng.choice([0, 0, 0, 1, 2]),
        scheduler_reserve_full_isl=rng.choice([None, None, True, False]),
    )


def make_tight_workload(
    seed: int, *, profile: str | None = None, vocab_size: int = 24, max_requests: int = 10, invalid: bool = True
) -> Workload:
    """One workload drawn from ``seed`` (see the module docstring); ``vocab_size`` bounds the token ids."""
    rng = random.Random(seed)
    profile = profile or rng.choice(["vllm-0.33", "vllm-0.33", "vllm-0.33", "vllm-0.32"])
    config = make_tight_config(rng, profile=profile)
    mml = config.max_model_len
    # A few shared prefixes so that prompts hit each other's cached blocks.
    prefixes = [tuple(rng.randrange(vocab_size) for _ in range(rng.randrange(1, mml // 2 + 1))) for _ in range(3)]
    requests: list[RequestSpec] = []
    num_requests = rng.randint(1, max_requests)
    at = 0
    for i in range(num_requests):
        if rng.random() < 0.6:
            prompt = rng.choice(prefixes) + tuple(rng.randrange(vocab_size) for _ in range(rng.randrange(0, 8)))
        else:
            prompt = tuple(rng.randrange(vocab_size) for _ in range(rng.randrange(1, mml)))
        prompt = prompt[: mml - 1] or (0,)
        at += rng.choice([0, 0, 0, 1, 2, 5])
        stop_ids = tuple(rng.sample(range(vocab_size), rng.choice([0, 0, 1, 2])))
        max_tokens = rng.randint(1, 24)
        requests.append(
            RequestSpec(
                request_id=f"r{i}",
                prompt_token_ids=prompt,
                max_tokens=max_tokens,
                priority=rng.randrange(3) if config.policy == "priority" else 0,
                arrival_time=at + rng.randrange(2),
                eos_token_id=rng.choice([None, 1, 1]),
                stop_token_ids=stop_ids,
                ignore_eos=rng.random() < 0.15,
                min_tokens=rng.choice([0, 0, min(2, max_tokens)]),
                at_step=at,
            )
        )
    aborts: list[AbortSpec] = []
    for _ in range(rng.choice([0, 0, 1, 2])):
        victim = rng.choice(requests)
        aborts.append(AbortSpec(victim.request_id, victim.at_step + rng.randrange(0, 12)))
    invalid_inputs: list[InvalidInput] = []
    if invalid and rng.random() < 0.3:
        invalid_inputs.append(InvalidInput({"kind": "abort", "request_id": "never-added"}, rng.randrange(0, 4)))
    if invalid and rng.random() < 0.3:
        invalid_inputs.append(
            InvalidInput(
                {
                    "kind": "add_request",
                    "request_id": "bad",
                    "prompt_token_ids": [],
                    "max_tokens": 1,
                    "priority": 0,
                    "arrival_time": 0,
                    "eos_token_id": None,
                    "stop_token_ids": [],
                    "ignore_eos": False,
                    "min_tokens": 0,
                },
                rng.randrange(0, 4),
            )
        )
    oracle = HashOracle(
        seed=seed,
        vocab_size=vocab_size,
        eos_token_id=1,
        eos_per_mille=rng.choice([0, 20, 60]),
        draft_accuracy_per_mille=rng.choice([300, 600, 900]),
    )
    return Workload(
        config=config,
        profile=profile,
        requests=tuple(requests),
        aborts=tuple(aborts),
        invalid_inputs=tuple(invalid_inputs),
        oracle=oracle,
        seed=seed,
        origin="impl-campaign",
        description=f"impl campaign workload, seed {seed}",
    )
