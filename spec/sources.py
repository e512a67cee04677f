"""Where each rule of the models was read: the vLLM file and line, and the function here that states it.

One row per rule: what the rule says, the model's function that states it (``module:qualname``),
and the place in the pinned vLLM release it was read from (path inside the ``vllm`` package, line,
and a fragment of that line). The manual's rules page is generated from this table
(``conformance/docs_reference.py``); a test in the pinned environments checks that each fragment
still sits at its line, so a row cannot point at the wrong code, and another that each model
function exists.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuleSource:
    rule: str
    model: str
    """``module:qualname`` of the function in ``spec/`` that states the rule."""
    release: str
    path: str
    """Path of the file inside the installed release, from the ``vllm`` package's parent."""
    line: int
    fragment: str
    """Text that line contains (the drift check)."""


V1 = "0.33.0"
V0 = "0.10.2"
SCHED = "vllm/v1/core/sched/scheduler.py"
V0_SCHED = "vllm/core/scheduler.py"
V0_BLOCKS = "vllm/core/block_manager.py"

V1_RULES: tuple[RuleSource, ...] = (
    RuleSource(
        "A waiting request is admitted in queue order: FCFS by arrival, priority by (priority, arrival time)",
        "schedconf.spec.v1.queues:create_request_queue",
        V1,
        "vllm/v1/core/sched/request_queue.py",
        131,
        "class PriorityRequestQueue",
    ),
    RuleSource(
        "Requests order by (priority, arrival time, id) in the priority queue",
        "schedconf.spec.v1.request:Request.sort_key",
        V1,
        "vllm/v1/request.py",
        357,
        "def __lt__(",
    ),
    RuleSource(
        "The long-prefill threshold is ignored when running + waiting hold a single request",
        "schedconf.spec.v1.scheduler:Scheduler.get_long_prefill_token_threshold",
        V1,
        SCHED,
        761,
        "if num_eligible_reqs > 1",
    ),
    RuleSource(
        "The adaptive threshold is floored at the budget divided by the number of requests",
        "schedconf.spec.v1.scheduler:Scheduler.get_long_prefill_token_threshold",
        V1,
        SCHED,
        768,
        "long_prefill_token_threshold, input_budget // num_eligible_reqs",
    ),
    RuleSource(
        "The running loop walks `running` in order while token budget is left",
        "schedconf.spec.v1.scheduler:Scheduler._schedule_running",
        V1,
        SCHED,
        795,
        "while req_index < len(self.running) and token_budget > 0:",
    ),
    RuleSource(
        "With steps in flight, a request whose in-flight tokens reach max_tokens is skipped",
        "schedconf.spec.v1.scheduler:Scheduler._is_sure_to_reach_max_tokens",
        V1,
        SCHED,
        802,
        "This is (num_computed_tokens + 1) - (num_output_placeholders - 1).",
    ),
    RuleSource(
        "A running request gets at most the long-prefill threshold",
        "schedconf.spec.v1.scheduler:Scheduler._schedule_running",
        V1,
        SCHED,
        844,
        "if 0 < long_prefill_token_threshold < num_new_tokens:",
    ),
    RuleSource(
        "No input position reaches max_model_len (room is kept for the sampled tokens)",
        "schedconf.spec.v1.scheduler:Scheduler._schedule_running",
        V1,
        SCHED,
        856,
        "- self.num_sampled_tokens_per_step,",
    ),
    RuleSource(
        "Priority victim: the running request with the largest (priority, arrival time)",
        "schedconf.spec.v1.scheduler:Scheduler.select_victim",
        V1,
        SCHED,
        935,
        "key=lambda r: (r.priority, r.arrival_time),",
    ),
    RuleSource(
        "A priority victim before the cursor moves the cursor back",
        "schedconf.spec.v1.scheduler:Scheduler._remove_priority_victim",
        V1,
        SCHED,
        947,
        "if victim_index < req_index:",
    ),
    RuleSource(
        "A priority victim scheduled earlier in the step gives its tokens back to the budget",
        "schedconf.spec.v1.scheduler:Scheduler._remove_priority_victim",
        V1,
        SCHED,
        954,
        "token_budget += restored",
    ),
    RuleSource(
        "FCFS victim: the tail of `running`",
        "schedconf.spec.v1.scheduler:Scheduler.select_victim",
        V1,
        SCHED,
        970,
        "preempted_req = self.running.pop()",
    ),
    RuleSource(
        "A priority request that preempts itself lets the running loop go on (0.33)",
        "schedconf.spec.v1.scheduler:Scheduler._schedule_running",
        V1,
        SCHED,
        988,
        "# preempted itself. The requests after it have higher",
    ),
    RuleSource(
        "The waiting loop runs only if the running loop preempted nobody",
        "schedconf.spec.v1.scheduler:Scheduler.schedule",
        V1,
        SCHED,
        1050,
        "if not preempted_reqs and self._pause_state",
    ),
    RuleSource(
        "Under spec decode a one-token admission is padded to 1 + num_spec_tokens",
        "schedconf.spec.v1.scheduler:Scheduler._should_pad_to_spec_size",
        V1,
        SCHED,
        1318,
        "padded_num_tokens = 1 + self.num_spec_tokens",
    ),
    RuleSource(
        "The threshold applies to an admission after the padding",
        "schedconf.spec.v1.scheduler:Scheduler._schedule_waiting",
        V1,
        SCHED,
        1332,
        "if 0 < long_prefill_token_threshold < num_new_tokens:",
    ),
    RuleSource(
        "Admission needs free blocks for the whole current sequence (scheduler_reserve_full_isl)",
        "schedconf.spec.v1.kv_cache:KVCacheManager.allocate_slots",
        V1,
        SCHED,
        1449,
        "full_sequence_must_fit=self.scheduler_reserve_full_isl,",
    ),
    RuleSource(
        "A padded admission must get exactly 1 + num_spec_tokens tokens, or the engine core dies",
        "schedconf.spec.v1.scheduler:Scheduler._check_padded_admission",
        V1,
        SCHED,
        1579,
        "assert num_new_tokens == 1 + self.num_spec_tokens",
    ),
    RuleSource(
        "Requests skipped by the waiting loop go back to its head in their order",
        "schedconf.spec.v1.scheduler:Scheduler._schedule_waiting",
        V1,
        SCHED,
        1610,
        "self.waiting.prepend_requests(step_skipped_waiting)",
    ),
    RuleSource(
        "Preemption is by recompute: the victim's computed tokens are reset",
        "schedconf.spec.v1.scheduler:Scheduler._preempt_request",
        V1,
        SCHED,
        1822,
        "request.num_computed_tokens = 0",
    ),
    RuleSource(
        "A resumed or running request is listed with its new blocks and counters",
        "schedconf.spec.v1.scheduler:Scheduler._make_output",
        V1,
        SCHED,
        1922,
        "def _make_cached_request_data(",
    ),
    RuleSource(
        "The model output: draft rejection, tokens appended one by one with the stop check, freeing",
        "schedconf.spec.v1.scheduler:Scheduler.update_from_output",
        V1,
        SCHED,
        2259,
        "def update_from_output(",
    ),
    RuleSource(
        "Tokens after a stop are dropped",
        "schedconf.spec.v1.scheduler:Scheduler._append_output_tokens",
        V1,
        SCHED,
        2744,
        "def _update_request_with_output(",
    ),
    RuleSource(
        "Drafts proposed after a step are stored for the next one (none after a prefill chunk)",
        "schedconf.spec.v1.scheduler:Scheduler._update_draft_token_ids",
        V1,
        SCHED,
        2862,
        "def update_draft_token_ids(self",
    ),
    RuleSource(
        "A new request is queued WAITING at the tail",
        "schedconf.spec.v1.scheduler:Scheduler.add_request",
        V1,
        SCHED,
        2931,
        "def add_request(self, request: Request)",
    ),
    RuleSource(
        "Finishing from outside: dequeue, set the status, free the blocks",
        "schedconf.spec.v1.scheduler:Scheduler.finish_requests",
        V1,
        SCHED,
        2964,
        "def finish_requests(",
    ),
    RuleSource(
        "A prefix-cache reset succeeds only when no block is in use (or running requests are reset)",
        "schedconf.spec.v1.scheduler:Scheduler.reset_prefix_cache",
        V1,
        SCHED,
        3184,
        "def reset_prefix_cache(",
    ),
    RuleSource(
        "AsyncScheduler: each scheduled sampling step adds output placeholders",
        "schedconf.spec.v1.scheduler:Scheduler._update_after_schedule",
        V1,
        "vllm/v1/core/sched/async_scheduler.py",
        24,
        "def _update_after_schedule(",
    ),
    RuleSource(
        "Stop order: EOS, stop token ids, length, min_tokens",
        "schedconf.spec.v1.stop:compute_stop_status",
        V1,
        "vllm/v1/core/sched/utils.py",
        98,
        "def check_stop(",
    ),
    RuleSource(
        "A prefix hit is capped below num_tokens, in whole blocks",
        "schedconf.spec.v1.kv_cache:KVCacheManager.get_computed_blocks",
        V1,
        "vllm/v1/core/kv_cache_manager.py",
        302,
        "max_cache_hit_length = request.num_tokens - 1",
    ),
    RuleSource(
        "Slots are allocated with lookahead; hit blocks in the free queue count against capacity",
        "schedconf.spec.v1.kv_cache:KVCacheManager.allocate_slots",
        V1,
        "vllm/v1/core/kv_cache_manager.py",
        380,
        "def allocate_slots(",
    ),
    RuleSource(
        "A finished or preempted request's blocks are freed tail first",
        "schedconf.spec.v1.kv_cache:KVCacheManager.free",
        V1,
        "vllm/v1/core/kv_cache_manager.py",
        629,
        "def free(self, request: Request)",
    ),
    RuleSource(
        "New blocks come from the head of the free queue",
        "schedconf.spec.v1.block_pool:BlockPool.get_new_blocks",
        V1,
        "vllm/v1/core/block_pool.py",
        706,
        "def get_new_blocks(self, num_blocks: int)",
    ),
    RuleSource(
        "A reused cached block is evicted from the hash map",
        "schedconf.spec.v1.block_pool:BlockPool._maybe_evict_cached_block",
        V1,
        "vllm/v1/core/block_pool.py",
        769,
        "def _maybe_evict_cached_block(",
    ),
    RuleSource(
        "A prefix hit takes its blocks out of the free queue",
        "schedconf.spec.v1.block_pool:BlockPool.touch",
        V1,
        "vllm/v1/core/block_pool.py",
        792,
        "def touch(self, blocks",
    ),
    RuleSource(
        "Freed blocks return to the free queue: uncached ones to the front, hashed ones to the back",
        "schedconf.spec.v1.block_pool:BlockPool.free_blocks",
        V1,
        "vllm/v1/core/block_pool.py",
        816,
        "def free_blocks(self, ordered_blocks",
    ),
    RuleSource(
        "Full blocks are hashed and cached when they are scheduled",
        "schedconf.spec.v1.block_pool:BlockPool.cache_full_blocks",
        V1,
        "vllm/v1/core/block_pool.py",
        230,
        "def cache_full_blocks(",
    ),
    RuleSource(
        "Block hashes chain over the parent's hash and the block's tokens",
        "schedconf.spec.hashing:compute_block_hash",
        V1,
        "vllm/v1/core/kv_cache_utils.py",
        707,
        "def hash_block_tokens(",
    ),
)

V0_RULES: tuple[RuleSource, ...] = (
    RuleSource(
        "A new group is queued at the tail of `waiting`",
        "schedconf.spec.v0.scheduler:Scheduler.add_request",
        V0,
        V0_SCHED,
        542,
        "def add_seq_group(",
    ),
    RuleSource(
        "Running decodes first; a group that cannot append a slot preempts from the tail",
        "schedconf.spec.v0.scheduler:Scheduler._schedule_running",
        V0,
        V0_SCHED,
        640,
        "def _schedule_running(",
    ),
    RuleSource(
        "Swapped groups come back while blocks last (LATER / NEVER)",
        "schedconf.spec.v0.scheduler:Scheduler._schedule_swapped",
        V0,
        V0_SCHED,
        812,
        "def _schedule_swapped(",
    ),
    RuleSource(
        "Priority: a waiting group of higher priority forces out running groups",
        "schedconf.spec.v0.scheduler:Scheduler._schedule_priority_preemption",
        V0,
        V0_SCHED,
        959,
        "def _schedule_priority_preemption(",
    ),
    RuleSource(
        "Prefills are admitted while budget, seats and blocks last; a prompt past the limit is ignored",
        "schedconf.spec.v0.scheduler:Scheduler._schedule_prefills",
        V0,
        V0_SCHED,
        1027,
        "def _schedule_prefills(",
    ),
    RuleSource(
        "Without chunked prefill: prefills first, decodes only in a step without them",
        "schedconf.spec.v0.scheduler:Scheduler._schedule_default",
        V0,
        V0_SCHED,
        1217,
        "def _schedule_default(",
    ),
    RuleSource(
        "With chunked prefill: running, then swapped, then prefills, in one budget",
        "schedconf.spec.v0.scheduler:Scheduler._schedule_chunked_prefill",
        V0,
        V0_SCHED,
        1345,
        "def _schedule_chunked_prefill(",
    ),
    RuleSource(
        "Preemption: recompute for a single sequence, else swap",
        "schedconf.spec.v0.scheduler:Scheduler._preempt",
        V0,
        V0_SCHED,
        1750,
        "def _preempt(",
    ),
    RuleSource(
        "Admission keeps a watermark of 1% of the GPU blocks free",
        "schedconf.spec.v0.block_manager:SelfAttnBlockSpaceManager.can_allocate",
        V0,
        V0_BLOCKS,
        110,
        "def can_allocate(",
    ),
    RuleSource(
        "Swapping in needs the blocks for the tokens not yet seen",
        "schedconf.spec.v0.block_manager:SelfAttnBlockSpaceManager.can_swap_in",
        V0,
        V0_BLOCKS,
        349,
        "def can_swap_in(",
    ),
    RuleSource(
        "Blocks are marked computed at the end of a scheduling step",
        "schedconf.spec.v0.block_manager:SelfAttnBlockSpaceManager.mark_blocks_as_computed",
        V0,
        V0_BLOCKS,
        306,
        "def mark_blocks_as_computed(",
    ),
    RuleSource(
        "The evictor takes the least recently used block, then the longest prefix",
        "schedconf.spec.v0.evictor:LRUEvictor.evict",
        V0,
        "vllm/core/evictor.py",
        94,
        "def evict(self)",
    ),
    RuleSource(
        "Stop order: min_tokens, EOS unless ignore_eos, stop ids, length",
        "schedconf.spec.v0.stop:maybe_stop_sequence",
        V0,
        "vllm/engine/output_processor/stop_checker.py",
        31,
        "def maybe_stop_sequence(",
    ),
)

RULES: tuple[RuleSource, ...] = V1_RULES + V0_RULES
