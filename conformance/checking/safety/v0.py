"""The v0 safety property ``prefix_hit_unwritten``: a prefix-cache hit reads only KV that a step has written.

The ``safety`` comparison (``drive.py``) drives v1 schedulers; a v0 trace
(vLLM's legacy scheduler, profile ``vllm-0.10``) replays under ``strict`` or
``observable`` only. This module checks one rule over a v0 trace's own
events (the inputs, and each step's SchedulerOutputs and request outputs, as
the trace records them: the reference's, which equal vLLM 0.10.2's wherever
the trace replays strictly), without asking the scheduler which blocks it
thinks are computed:

``prefix_hit_unwritten``
    A prefill group scheduled with a prefix hit (``computed_block_nums``: the
    model runner skips its first ``len(computed_block_nums) * block_size``
    positions) reads, for every position the hit skips, KV that an earlier
    step, or this step's batch, computed in that slot of its block table for
    exactly the group's tokens up to that position.

Why every correct scheduler keeps it: a skipped position is never computed by
this group; attention reads the slot's K/V as if it were the group's own. KV
depends on the token and on every token before it, so a slot written for other
tokens, or never written, gives wrong logits whatever the policy or the cache
design. This step's batch counts (one forward pass writes each layer's KV
before attention reads it).

What the check derives from the outputs, per group: the tokens (prompt plus
the sampled tokens the trace reports), ``num_computed_tokens`` (0 when added;
plus ``token_chunk_size`` per applied step; ``len - 1`` again after every
step in which it samples; 0 when ``observe`` shows it holds no blocks after a
``schedule()``: a recompute preemption), and the positions each step computes,
as vLLM's ``ModelRunner._compute_for_prefix_cache_hit`` picks them: from the
hit's end (a partial hit), only the last one (a hit of the whole chunk), or
all of ``[num_computed_tokens, + token_chunk_size)``. Swaps copy a block's
slots (``blocks_to_swap_out`` / ``blocks_to_swap_in``). A step without
``observe`` that preempts (``preempted > 0``, or any step under the priority
policy, whose preemptions ``preempted`` does not count) leaves the
unscheduled groups' counts unknown unless the count settles them; the check
then stops at the first step that schedules such a group (``stopped_at``):
it never guesses.

vLLM 0.10.2 breaks the rule with chunked prefill and prefix caching
(``reports/findings.md``, V7): the block manager registers a prompt's full
blocks in the prefix cache when it allocates them and marks them all
computed at the end of the ``schedule()`` that scheduled the first chunk.
The model is faithful to it, so the rule is a known violation of profile
``vllm-0.10`` (:data:`KNOWN_VIOLATIONS`), not a divergence: the strict
comparison still passes on such traces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schedconf.conformance.traces.trace import Trace

V0_PROPERTIES = ("prefix_hit_unwritten",)
"""The v0 safety properties this module checks."""

KNOWN_VIOLATIONS: dict[str, dict[str, str]] = {
    "vllm-0.10": {
        "prefix_hit_unwritten": (
            "V7 (reports/findings.md): vLLM 0.10.2's v0 block manager marks every full block of a prompt "
            "computed at the end of the schedule() of its first chunk (PrefixCachingBlockAllocator."
            "mark_blocks_as_computed), so a chunked prefill's later blocks are prefix hits before their KV is "
            "written; the model is faithful to it"
        ),
    },
}
"""Rules a profile breaks on purpose (the model matches the release's bug): profile -> property -> why."""

Slot = tuple[int, int]
"""A KV slot: (block id, offset in the block)."""


@dataclass(frozen=True)
class V0Violation:
    """One break of a v0 safety property, at a step, for a request."""

    prop: str
    step: int
    request_id: str
    message: str

    @property
    def kind(self) -> str:
        """The divergence name reports use: ``safety:<property>``."""
        return f"safety:{self.prop}"


@dataclass
class V0CheckResult:
    """What :func:`check_prefix_hit_unwritten` found; ``stopped_at`` is the step it could not check, if any."""

    violations: list[V0Violation] = field(default_factory=list)
    num_steps: int = 0
    num_hits: int = 0
    stopped_at: int | None = None
    stop_reason: str = ""


@dataclass(eq=False)
class _Group:
    """One incarnation of a request, as the trace's outputs show it."""

    request_id: str
    tokens: list[int]
    computed: int | None = 0
    """``num_computed_tokens`` after the last applied step; None when the outputs do not settle it."""
    table: list[int] = field(default_factory=list)
    live: bool = True


@dataclass
class _Scheduled:
    group: _Group
    chunk: int
    do_sample: bool


def get_known_violation(profile: str, prop: str) -> str | None:
    """Why ``profile`` breaks ``prop`` on purpose (:data:`KNOWN_VIOLATIONS`), or None if it must not."""
    return KNOWN_VIOLATIONS.get(profile, {}).get(prop)


def get_unexpected_violations(result: V0CheckResult, profile: str) -> list[V0Violation]:
    """The violations that are not known behaviour of ``profile``."""
    return [v for v in result.violations if get_known_violation(profile, v.prop) is None]


def get_computed_positions(computed: int, chunk: int, is_prompt: bool, num_hit_tokens: int) -> int:
    """The first position the model runner computes for a group (``_compute_for_prefix_cache_hit``).

    ``[computed, first)`` is served by the prefix hit; ``[first, computed + chunk)`` is computed.
    """
    seq_len = computed + chunk
    if not is_prompt or num_hit_tokens <= computed:
        return computed
    if num_hit_tokens < seq_len:
        return num_hit_tokens
    return seq_len - 1  # a hit of the whole chunk: vLLM recomputes the last position only


def _describe_slot(value: tuple[int, ...] | None, want: tuple[int, ...]) -> str:
    if value is None:
        return "no KV (no step has computed that slot)"
    if len(value) != len(want):
        return f"stale KV (computed for position {len(value) - 1} of another sequence)"
    return "KV computed for other tokens"


def check_prefix_hit_unwritten(trace: Trace) -> V0CheckResult:
    """Check ``prefix_hit_unwritten`` over a v0 trace's recorded events (see the module docstring)."""
    if trace.scheduler != "v0":
        raise ValueError("check_prefix_hit_unwritten reads v0 traces (header scheduler 'v0')")
    config = trace.config
    bs = config["block_size"]
    priority = config["policy"] == "priority"
    result = V0CheckResult()
    groups: dict[str, _Group] = {}
    gpu: dict[Slot, tuple[int, ...]] = {}
    cpu: dict[Slot, tuple[int, ...]] = {}
    pending: dict[Slot, tuple[int, ...]] = {}
    scheduled: list[_Scheduled] = []

    for event in trace.events:
        kind = event["kind"]
        error = event.get("expect_error")
        if error is not None:
            if error.startswith("engine_"):
                break  # vLLM's engine died there: the trace ends
            continue  # a refusal changes nothing
        if kind == "add_request":
            groups[event["request_id"]] = _Group(event["request_id"], list(event["prompt_token_ids"]))
        elif kind == "abort":
            group = groups.pop(event["request_id"], None)
            if group is not None:
                group.live = False
        elif kind == "step":
            expect = event["expect"]
            result.num_steps += 1
            step = event["step"]
            # The worker swaps before the forward pass: the copies take the slots' KV as it is now.
            for g_id, c_id in expect["blocks_to_swap_out"]:
                for off in range(bs):
                    if (g_id, off) in gpu:
                        cpu[(c_id, off)] = gpu[(g_id, off)]
            for c_id, g_id in expect["blocks_to_swap_in"]:
                for off in range(bs):
                    gpu.pop((g_id, off), None)
                    if (c_id, off) in cpu:
                        gpu[(g_id, off)] = cpu[(c_id, off)]
            _settle_preemptions(expect, event.get("observe"), groups, priority)
            pending, scheduled, reads = {}, [], []
            for sg in expect["scheduled_seq_groups"]:
                group = groups[sg["request_id"]]
                if group.computed is None:
                    result.stopped_at = step
                    result.stop_reason = (
                        f"request {group.request_id!r}'s num_computed_tokens is not settled by "
                        f"the outputs (a preemption in a step without observe)"
                    )
                    return result
                group.table = list(sg["block_table"])
                chunk, c = sg["token_chunk_size"], group.computed
                num_hit = len(sg["computed_block_nums"]) * bs
                first = get_computed_positions(c, chunk, sg["is_prompt"], num_hit)
                for pos in range(first, min(c + chunk, len(group.tokens))):
                    pending[(group.table[pos // bs], pos % bs)] = tuple(group.tokens[: pos + 1])
                if first > c:
                    result.num_hits += 1
                    reads.append((group, c, first, sg["computed_block_nums"]))
                scheduled.append(_Scheduled(group, chunk, sg["do_sample"]))
            for group, c, first, hit_blocks in reads:
                violation = _check_reads(group, c, first, hit_blocks, gpu, pending, bs, step)
                if violation is not None:
                    result.violations.append(violation)
        elif kind == "model_output":
            gpu.update(pending)  # the batch ran: its KV is written (an aborted group's too)
            pending = {}
            sampled = event["sampled_token_ids"]
            for item in scheduled:
                group = item.group
                if not group.live:
                    continue  # aborted since the schedule: the engine skips it
                before = len(group.tokens)
                if group.computed is not None:
                    group.computed += item.chunk
                if item.do_sample:
                    group.tokens.extend(sampled.get(group.request_id, []))
                    group.computed = before  # every known token but the one just sampled
            for out in event["expect"]["outputs"]:
                if out["finish_reason"] is not None and out["req_id"] in groups:
                    groups.pop(out["req_id"]).live = False
            scheduled = []
    return result


def _settle_preemptions(
    expect: dict[str, Any], observe: dict[str, Any] | None, groups: dict[str, _Group], priority: bool
) -> None:
    """Reset the counts of groups this ``schedule()`` preempted by recompute (they hold no blocks)."""
    scheduled = {sg["request_id"] for sg in expect["scheduled_seq_groups"]}
    idle = [g for rid, g in groups.items() if rid not in scheduled and g.table]
    if observe is not None and "block_tables" in observe:
        held = set(observe["block_tables"]) | set(observe.get("cpu_block_tables", {}))
        for g in idle:
            if g.request_id not in held:
                g.computed, g.table = 0, []
        return
    swapped_ids = {g_id for g_id, _ in expect["blocks_to_swap_out"]}
    swapped = [g for g in idle if swapped_ids & set(g.table)]
    candidates = [g for g in idle if g not in swapped]
    num_recomputed = expect["preempted"] - len(swapped)
    if not priority and num_recomputed == 0:
        return
    if not priority and num_recomputed == len(candidates):
        for g in candidates:
            g.computed, g.table = 0, []
        return
    for g in candidates:
        g.computed = None  # settled again when it next samples


def _check_reads(
    group: _Group,
    computed: int,
    first: int,
    hit_blocks: list[int],
    gpu: dict[Slot, tuple[int, ...]],
    pending: dict[Slot, tuple[int, ...]],
    bs: int,
    step: int,
) -> V0Violation | None:
    """The first position of the hit whose slot holds no KV for the group's tokens up to it."""
    for pos in range(computed, first):
        j = pos // bs
        slot = (group.table[j], pos % bs)
        want = tuple(group.tokens[: pos + 1])
        if gpu.get(slot) == want or pending.get(slot) == want:
            continue
        return V0Violation(
            "prefix_hit_unwritten",
            step,
            group.request_id,
            f"request {group.request_id!r} is scheduled with a prefix hit of {len(hit_blocks) * bs} tokens "
            f"(computed_block_nums {hit_blocks}), so the model runner skips its positions {computed}-{first - 1}; "
            f"but block {group.table[j]} (its table index {j}, positions {j * bs}-{j * bs + bs - 1}) holds, at position "
            f"{pos}, {_describe_slot(gpu.get(slot), want)}, nor does this step compute it",
        )
    return None
