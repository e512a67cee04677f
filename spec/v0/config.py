"""The v0 scheduler configuration: a frozen record, validated once at construction.

Field names are vLLM 0.10.2's (``SchedulerConfig``, ``CacheConfig``). Every
other option is at its default (no LoRA, no sliding window, delay_factor 0,
no lookahead slots, pipeline parallel 1, watermark 0.01). The refusals are
those of ``SchedulerConfig._verify_args`` plus the worker's
``raise_if_cache_size_invalid`` (the engine refuses to start when the GPU pool
cannot hold one ``max_model_len`` sequence).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from schedconf.spec.errors import InvalidConfig, require

WATERMARK = 0.01
"""``SelfAttnBlockSpaceManager``'s default watermark; the scheduler never passes another."""


@dataclass(frozen=True)
class V0SchedulerConfig:
    """Everything the v0 scheduler's decisions depend on besides its inputs.

    v0 has no null block: GPU blocks ``0..num_gpu_blocks-1`` are all usable,
    CPU (swap) blocks are ``0..num_cpu_blocks-1`` in every output.
    """

    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    policy: str
    preemption_mode: str | None
    max_num_partial_prefills: int
    max_long_partial_prefills: int
    long_prefill_token_threshold: int

    def __post_init__(self) -> None:
        self._require_types()
        require(
            self.block_size >= 1,
            InvalidConfig,
            "invalid_block_size",
            "block_size must be >= 1",
            field="block_size",
            value=self.block_size,
        )
        require(
            self.num_gpu_blocks >= 1,
            InvalidConfig,
            "invalid_num_gpu_blocks",
            "num_gpu_blocks must be >= 1",
            field="num_gpu_blocks",
            value=self.num_gpu_blocks,
        )
        require(
            self.num_cpu_blocks >= 0,
            InvalidConfig,
            "invalid_num_cpu_blocks",
            "num_cpu_blocks must be >= 0",
            field="num_cpu_blocks",
            value=self.num_cpu_blocks,
        )
        require(
            self.max_num_batched_tokens >= 1,
            InvalidConfig,
            "invalid_token_budget",
            "max_num_batched_tokens must be >= 1",
            value=self.max_num_batched_tokens,
        )
        require(
            self.max_num_seqs >= 1,
            InvalidConfig,
            "invalid_max_num_seqs",
            "max_num_seqs must be >= 1",
            value=self.max_num_seqs,
        )
        require(
            self.max_model_len >= 1,
            InvalidConfig,
            "invalid_max_model_len",
            "max_model_len must be >= 1",
            value=self.max_model_len,
        )
        require(
            self.long_prefill_token_threshold >= 0,
            InvalidConfig,
            "invalid_threshold",
            "long_prefill_token_threshold must be >= 0",
            value=self.long_prefill_token_threshold,
        )
        # SchedulerConfig._verify_args, in its order.
        require(
            self.enable_chunked_prefill or self.max_num_batched_tokens >= self.max_model_len,
            InvalidConfig,
            "budget_below_max_model_len",
            "with chunked prefill disabled, max_num_batched_tokens must be >= max_model_len",
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
        )
        require(
            self.max_num_batched_tokens >= self.max_num_seqs,
            InvalidConfig,
            "budget_below_max_num_seqs",
            "max_num_batched_tokens must be >= max_num_seqs",
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
        )
        require(
            self.max_num_partial_prefills >= 1,
            InvalidConfig,
            "invalid_max_num_partial_prefills",
            "max_num_partial_prefills must be >= 1",
            value=self.max_num_partial_prefills,
        )
        if self.max_num_partial_prefills > 1:
            require(
                self.enable_chunked_prefill,
                InvalidConfig,
                "partial_prefills_without_chunked_prefill",
                "max_num_partial_prefills > 1 needs chunked prefill",
                value=self.max_num_partial_prefills,
            )
            require(
                self.long_prefill_token_threshold <= self.max_model_len,
                InvalidConfig,
                "threshold_above_max_model_len",
                "long_prefill_token_threshold must be <= max_model_len",
                threshold=self.long_prefill_token_threshold,
                max_model_len=self.max_model_len,
            )
        require(
            1 <= self.max_long_partial_prefills <= self.max_num_partial_prefills,
            InvalidConfig,
            "invalid_max_long_partial_prefills",
            "max_long_partial_prefills must be in [1, max_num_partial_prefills]",
            value=self.max_long_partial_prefills,
        )
        # worker.raise_if_cache_size_invalid: the engine does not start.
        require(
            self.max_model_len <= self.block_size * self.num_gpu_blocks,
            InvalidConfig,
            "pool_below_max_model_len",
            "block_size * num_gpu_blocks must be >= max_model_len",
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
        )

    def _require_types(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("enable_chunked_prefill", "enable_prefix_caching"):
                require(
                    isinstance(value, bool),
                    InvalidConfig,
                    "invalid_config_type",
                    f"{f.name} must be a boolean",
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
            elif f.name == "preemption_mode":
                require(
                    value in (None, "swap", "recompute"),
                    InvalidConfig,
                    "invalid_preemption_mode",
                    "preemption_mode must be null, 'swap' or 'recompute'",
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

    @property
    def effective_long_prefill_token_threshold(self) -> int:
        """``SchedulerConfig.__post_init__``: 0 becomes ``int(0.04 * max_model_len)`` with partial prefills > 1."""
        if self.max_num_partial_prefills > 1 and self.long_prefill_token_threshold == 0:
            return int(self.max_model_len * 0.04)  # vLLM's float expression, kept exact
        return self.long_prefill_token_threshold

    @property
    def watermark_blocks(self) -> int:
        """``int(0.01 * num_gpu_blocks)``: 0 below 100 blocks."""
        return int(WATERMARK * self.num_gpu_blocks)

    def to_dict(self) -> dict[str, Any]:
        """Return the config as a plain dict (trace headers, protocol init)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> V0SchedulerConfig:
        """Build a config from a dict that has exactly the known fields."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        require(
            not unknown,
            InvalidConfig,
            "unknown_config_field",
            f"unknown config field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}",
            fields=unknown,
        )
        missing = sorted(known - set(data))
        require(
            not missing,
            InvalidConfig,
            "missing_config_field",
            f"missing config field(s): {', '.join(missing)}",
            fields=missing,
        )
        return cls(**data)
