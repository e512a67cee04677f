"""The scheduler configuration: a frozen record, validated once at construction.

Field names are vLLM's (``SchedulerConfig``, ``CacheConfig``, ``ModelConfig``).
Only the knobs of the modelled core are here; every other vLLM option is at its
default (no connectors, LoRA, multimodal, data parallelism, watermark 0). Pipeline parallelism is
here only as far as the scheduler sees it (``pipeline_parallel_size``: the decode stagger).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from schedconf.spec.errors import InvalidConfig, require

OPTIONAL_FIELDS: dict[str, object] = {
    "max_concurrent_batches": 1,
    "max_num_active_seqs": None,
    "long_prefill_token_threshold_adaptive": False,
    "use_v2_model_runner": False,
    "pipeline_parallel_size": 1,
    "prefill_schedule_interval": 1,
    "log_stats": True,
}
"""Config fields optional in traces, with the default an absent one takes."""


def cdiv(a: int, b: int) -> int:
    """Return ``ceil(a / b)`` for non-negative ``a`` and positive ``b``."""
    return -(-a // b)


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything the scheduler's decisions depend on besides its inputs.

    ``num_gpu_blocks`` counts the null block 0, as in vLLM: N blocks give N-1
    usable blocks with ids 1..N-1.
    """

    block_size: int = 16
    num_gpu_blocks: int = 10000
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 16
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    policy: str = "fcfs"
    num_spec_tokens: int = 0
    num_lookahead_tokens: int = 0
    """Extra slots allocated past the scheduled tokens. vLLM derives it from the
    spec-decode method (EAGLE / draft models); here it is a free knob, so traces
    that set it can be checked against the model and our engine, not vLLM."""
    scheduler_reserve_full_isl: bool | None = None
    """None means: the profile's default (``reserve_full_sequence_at_admission``)."""
    max_concurrent_batches: int = 1
    """Steps that may be in flight at once: scheduled, their model output not yet
    applied (vLLM's EngineCore batch queue size: 1 synchronous, 2 with async
    scheduling, ``pipeline_parallel_size`` with pipeline parallelism)."""
    max_num_active_seqs: int | None = None
    """vLLM 0.32+ ``SchedulerConfig.max_num_active_seqs``: the admission cap of
    the waiting loop (RUNNING requests), at most ``max_num_seqs``, which keeps
    sizing the model runner; None means ``max_num_seqs``."""
    long_prefill_token_threshold_adaptive: bool = False
    """vLLM 0.32+: with several requests present, the effective
    ``long_prefill_token_threshold`` (when non-zero) is floored at
    ``max_num_batched_tokens // (running + waiting)``, a fair share."""
    use_v2_model_runner: bool = False
    """vLLM 0.32+ output layout of the V2 model runner: resumed requests are
    listed among ``scheduled_new_reqs`` (after the new ones, with all their
    blocks) instead of as resumed entries of ``scheduled_cached_reqs``."""
    pipeline_parallel_size: int = 1
    """vLLM's ``ParallelConfig.pipeline_parallel_size``. The scheduler reads it in one place: with
    ``AsyncScheduler`` and the V2 model runner, a request decodes again only ``pipeline_parallel_size``
    steps after its last decode (profile knob ``pp_decode_stagger``). Other values than 1 need an
    async profile (``pipeline_parallel_not_modelled``)."""
    prefill_schedule_interval: int = 1
    """vLLM 0.33 ``SchedulerConfig.prefill_schedule_interval``: prefill (admissions with prompt left
    and running prefill chunks) runs at most once every N executed steps while a decode runs
    (profile knob ``local_prefill_cadence``). 1 admits prefill on every step."""
    log_stats: bool = True
    """vLLM's ``log_stats``: without it the scheduler reports no ``SchedulerStats`` (no prefix-cache or
    spec-decode counters) after an update."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in (
                "enable_chunked_prefill",
                "enable_prefix_caching",
                "long_prefill_token_threshold_adaptive",
                "use_v2_model_runner",
                "log_stats",
            ):
                require(
                    isinstance(value, bool),
                    InvalidConfig,
                    "invalid_config_type",
                    f"{f.name} must be a boolean",
                    field=f.name,
                    value=value,
                )
            elif f.name == "scheduler_reserve_full_isl":
                require(
                    value is None or isinstance(value, bool),
                    InvalidConfig,
                    "invalid_config_type",
                    f"{f.name} must be a boolean or null",
                    field=f.name,
                    value=value,
                )
            elif f.name == "max_num_active_seqs":
                require(
                    value is None or (isinstance(value, int) and not isinstance(value, bool)),
                    InvalidConfig,
                    "invalid_config_type",
                    f"{f.name} must be an integer or null",
                    field=f.name,
                    value=value,
                )
            elif f.name == "policy":
                require(
                    value in ("fcfs", "priority"),
                    InvalidConfig,
                    "invalid_policy",
                    "policy must be 'fcfs' or 'priority'",
                    field=f.name,
                    value=value,
                )
            else:
                require(
                    isinstance(value, int) and not isinstance(value, bool),
                    InvalidConfig,
                    "invalid_config_type",
                    f"{f.name} must be an integer",
                    field=f.name,
                    value=value,
                )
        # A block holds at least one token.
        require(
            self.block_size >= 1,
            InvalidConfig,
            "invalid_block_size",
            "block_size must be >= 1",
            field="block_size",
            value=self.block_size,
        )
        # Block 0 is the null block; at least one usable block must remain.
        require(
            self.num_gpu_blocks >= 2,
            InvalidConfig,
            "invalid_num_gpu_blocks",
            "num_gpu_blocks must be >= 2 (block 0 is the null block)",
            field="num_gpu_blocks",
            value=self.num_gpu_blocks,
        )
        require(
            self.max_num_batched_tokens >= 1,
            InvalidConfig,
            "invalid_token_budget",
            "max_num_batched_tokens must be >= 1",
            field="max_num_batched_tokens",
            value=self.max_num_batched_tokens,
        )
        require(
            self.max_num_seqs >= 1,
            InvalidConfig,
            "invalid_max_num_seqs",
            "max_num_seqs must be >= 1",
            field="max_num_seqs",
            value=self.max_num_seqs,
        )
        require(
            self.max_model_len >= 1,
            InvalidConfig,
            "invalid_max_model_len",
            "max_model_len must be >= 1",
            field="max_model_len",
            value=self.max_model_len,
        )
        require(
            self.long_prefill_token_threshold >= 0,
            InvalidConfig,
            "invalid_threshold",
            "long_prefill_token_threshold must be >= 0 (0 disables it)",
            field="long_prefill_token_threshold",
            value=self.long_prefill_token_threshold,
        )
        require(
            self.num_spec_tokens >= 0,
            InvalidConfig,
            "invalid_num_spec_tokens",
            "num_spec_tokens must be >= 0",
            field="num_spec_tokens",
            value=self.num_spec_tokens,
        )
        require(
            self.max_num_active_seqs is None or 1 <= self.max_num_active_seqs <= self.max_num_seqs,
            InvalidConfig,
            "invalid_max_num_active_seqs",
            "max_num_active_seqs must be null or in [1, max_num_seqs]",
            field="max_num_active_seqs",
            value=self.max_num_active_seqs,
        )
        require(
            self.max_concurrent_batches >= 1,
            InvalidConfig,
            "invalid_max_concurrent_batches",
            "max_concurrent_batches must be >= 1 (1 = synchronous)",
            field="max_concurrent_batches",
            value=self.max_concurrent_batches,
        )
        require(
            self.pipeline_parallel_size >= 1,
            InvalidConfig,
            "invalid_pipeline_parallel_size",
            "pipeline_parallel_size must be >= 1",
            field="pipeline_parallel_size",
            value=self.pipeline_parallel_size,
        )
        require(
            self.prefill_schedule_interval >= 1,
            InvalidConfig,
            "invalid_prefill_schedule_interval",
            "prefill_schedule_interval must be >= 1 (1 admits prefill on every step)",
            field="prefill_schedule_interval",
            value=self.prefill_schedule_interval,
        )
        require(
            self.num_lookahead_tokens >= 0,
            InvalidConfig,
            "invalid_num_lookahead_tokens",
            "num_lookahead_tokens must be >= 0",
            field="num_lookahead_tokens",
            value=self.num_lookahead_tokens,
        )
        # vLLM's SchedulerConfig rejects this: without chunking, a prompt of
        # max_model_len tokens could never be scheduled.
        require(
            self.enable_chunked_prefill or self.max_num_batched_tokens >= self.max_model_len,
            InvalidConfig,
            "budget_below_max_model_len",
            "with chunked prefill disabled, max_num_batched_tokens must be >= max_model_len",
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
        )
        # vLLM's SchedulerConfig (all releases) wants a token per seat.
        require(
            self.max_num_batched_tokens >= self.max_num_seqs,
            InvalidConfig,
            "budget_below_max_num_seqs",
            "max_num_batched_tokens must be >= max_num_seqs",
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
        )
        # vLLM refuses to start when the KV cache cannot hold one sequence of
        # max_model_len tokens; a smaller pool would let a lone request preempt
        # itself forever.
        require(
            cdiv(self.max_model_len, self.block_size) <= self.num_gpu_blocks - 1,
            InvalidConfig,
            "pool_below_max_model_len",
            "num_gpu_blocks - 1 usable blocks must hold max_model_len tokens",
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
        )

    @property
    def num_usable_blocks(self) -> int:
        """Blocks a request can hold: all but the null block."""
        return self.num_gpu_blocks - 1

    def to_dict(self) -> dict[str, Any]:
        """Return the config as a plain dict (trace headers, protocol init).

        The fields added after the trace format's first release
        (:data:`OPTIONAL_FIELDS`) are left out at their defaults, so a config
        that does not use them reads as it did before they existed.
        """
        data = asdict(self)
        for name, default in OPTIONAL_FIELDS.items():
            if data[name] == default:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SchedulerConfig:
        """Build a config from a dict, refusing unknown fields by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        require(
            not unknown,
            InvalidConfig,
            "unknown_config_field",
            f"unknown config field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}",
            fields=unknown,
        )
        return cls(**data)
