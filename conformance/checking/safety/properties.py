"""The safety properties: what every paged-KV scheduler must get right, whatever its policy.

Each ``check_*`` function states one rule over what a scheduler under test
shows (its canonical SchedulerOutput, its request outputs, its optional
``observe()``) and the harness's record of the run (:class:`RequestRecord`),
and returns the violations as plain-word messages (empty: the rule holds).
Each docstring says why the rule holds for *every* correct scheduler, not
only for vLLM's policy. The driver (``conformance/checking/safety/drive.py``) calls
them after every ``schedule()`` and ``update``; a message becomes a
``Divergence`` of kind ``safety`` whose field is the property's name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PROPERTIES = (
    "token_budget",
    "seats",
    "known_requests",
    "progress",
    "max_model_len",
    "block_ids",
    "computed_kv",
    "blocks_return",
    "block_exclusivity",
    "block_conservation",
    "block_tables",
    "request_lifecycle",
    "stop_rules",
    "liveness",
)
"""Every property, in the order they are checked within one call."""


@dataclass
class RequestRecord:
    """The harness's view of one incarnation of a request, built from the SUT's own outputs.

    ``tokens`` are the prompt plus every token the harness sampled for it and
    the SUT reported; ``computed`` is ``num_computed_tokens`` after the last
    applied step; ``table`` its block table as the SchedulerOutputs hand it
    out (new requests: ``block_ids``; running: ``+= new_block_ids``; resumed:
    ``= new_block_ids``; emptied when preempted or ended).
    """

    request_id: str
    tokens: list[int]
    num_prompt: int
    max_tokens: int
    min_tokens: int
    eos_token_id: int | None
    """None under ``ignore_eos``."""
    stop_token_ids: tuple[int, ...]
    added_at_step: int
    computed: int = 0
    table: list[int] = field(default_factory=list)
    ended: str | None = None
    """None while live; else how it ended: ``finished (stop)``, ``aborted``, ..."""

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def max_len(self) -> int:
        """The longest this request can ever get: prompt plus max_tokens (max_model_len caps it further)."""
        return self.num_prompt + self.max_tokens


# ---------------------------------------------------------------- schedule()


def check_token_budget(output: Mapping[str, Any], max_num_batched_tokens: int) -> list[str]:
    """The tokens scheduled in one step are at most ``max_num_batched_tokens``.

    The budget is the size of the batch the model runner was built for (its
    activation buffers, its CUDA graphs): any scheduler that exceeds it asks
    the model for a batch it cannot run, whatever order it picks requests in.
    """
    total = sum(output["num_scheduled_tokens"].values())
    out = []
    if total > max_num_batched_tokens:
        out.append(
            f"{total} tokens scheduled ({_counts(output)}), over max_num_batched_tokens={max_num_batched_tokens}"
        )
    if output.get("total_num_scheduled_tokens", total) != total:
        out.append(
            f"total_num_scheduled_tokens={output['total_num_scheduled_tokens']} but the per-request counts "
            f"add up to {total}"
        )
    return out


def check_seats(output: Mapping[str, Any], max_num_seqs: int) -> list[str]:
    """At most ``max_num_seqs`` requests are scheduled in one step.

    Seats are the rows of the model runner's per-request state (sampling
    tensors, block-table rows); a step with more requests than rows cannot run
    under any policy.
    """
    n = len(output["num_scheduled_tokens"])
    return [f"{n} requests scheduled, over max_num_seqs={max_num_seqs}"] if n > max_num_seqs else []


def check_known_requests(output: Mapping[str, Any], records: Mapping[str, RequestRecord]) -> list[str]:
    """Only requests that were added and are still live are scheduled.

    A request the client never sent, or one that already finished or was
    aborted, has no prompt, no sampling state and no blocks the scheduler may
    use: running it computes garbage for nobody (or for a client that left).
    """
    out = []
    for rid in output["num_scheduled_tokens"]:
        rec = records.get(rid)
        if rec is None:
            out.append(f"request {rid!r} is scheduled but was never added")
        elif rec.ended is not None:
            out.append(f"request {rid!r} is scheduled but it already ended ({rec.ended})")
    return out


def get_reported_computed(
    output: Mapping[str, Any], records: Mapping[str, RequestRecord] | None = None
) -> dict[str, tuple[int, bool, bool]]:
    """``req_id -> (num_computed_tokens, is_new, is_resumed)`` from the step's new and cached request lists.

    A scheduled request in neither list (vLLM 0.11 leaves some running ones
    out) continues from its recorded ``computed`` when ``records`` are given.
    """
    out = {r["req_id"]: (r["num_computed_tokens"], True, False) for r in output["scheduled_new_reqs"]}
    for r in output["scheduled_cached_reqs"]:
        out[r["req_id"]] = (r["num_computed_tokens"], False, bool(r["resumed"]))
    for rid in output["num_scheduled_tokens"]:
        if records is not None and rid not in out and rid in records:
            out[rid] = (records[rid].computed, False, False)
    return out


def check_progress(output: Mapping[str, Any], records: Mapping[str, RequestRecord]) -> list[str]:
    """Each scheduled request gets ``1 <= n <= num_tokens + drafts - num_computed_tokens`` tokens,
    and a request that kept running starts where its last step left it.

    Scheduling 0 tokens spends a seat on nothing; scheduling more than the
    request lacks computes positions that hold no token (drafts, the tokens
    the model proposed, count only when the step lists them; the harness sends
    none, so only a scheduler's own placeholders can appear). A running
    request's ``num_computed_tokens`` is what it had plus what its last step
    computed (minus rejected drafts): anything else skips tokens or computes
    some twice, under any policy.
    """
    out = []
    reported = get_reported_computed(output, records)
    drafts = output.get("scheduled_spec_decode_tokens", {})
    listed = {r["req_id"] for r in output["scheduled_new_reqs"]} | {
        r["req_id"] for r in output["scheduled_cached_reqs"]
    }
    preempted = set(output.get("preempted_req_ids") or ())
    for rid, n in output["num_scheduled_tokens"].items():
        rec = records.get(rid)
        if rec is None or rec.ended is not None:
            continue  # known_requests says it
        if rid in preempted or rid not in listed:
            # vLLM 0.11 leaves a same-step priority victim scheduled (no repair): its chunk runs on freed blocks
            where = (
                "in the step that preempts it"
                if rid in preempted
                else "but is in neither scheduled_new_reqs nor scheduled_cached_reqs (a same-step victim?)"
            )
            out.append(f"request {rid!r} is scheduled for {n} tokens {where}")
            continue
        computed, is_new, resumed = reported[rid]
        lacks = len(rec.tokens) + len(drafts.get(rid, ())) - computed
        if not 1 <= n <= max(lacks, 0) or n < 1:
            out.append(
                f"request {rid!r} is scheduled for {n} tokens; it lacks {lacks} "
                f"({len(rec.tokens)} tokens + {len(drafts.get(rid, ()))} drafts - {computed} computed)"
            )
        elif not is_new and not resumed and computed != rec.computed:
            out.append(
                f"request {rid!r} kept running with num_computed_tokens={computed}, but its last step left "
                f"it at {rec.computed}"
            )
    return out


def check_max_model_len(
    output: Mapping[str, Any], max_model_len: int, records: Mapping[str, RequestRecord] | None = None
) -> list[str]:
    """No request is scheduled past position ``max_model_len - 2``: ``num_computed_tokens + n <= max_model_len - 1``.

    The token sampled after a step sits at position ``num_computed_tokens + n``
    and must be below ``max_model_len`` (positions, rotary tables and the
    block table are sized for it); vLLM caps each step at
    ``max_model_len - 1 - num_computed_tokens`` (``spec/v1/scheduler.py``, the
    running loop). A sequence of ``max_model_len`` tokens is length-capped, so
    its last token is never computed, under any policy.
    """
    out = []
    reported = get_reported_computed(output, records)
    for rid, n in output["num_scheduled_tokens"].items():
        if rid in reported and reported[rid][0] + n > max_model_len - 1:
            out.append(
                f"request {rid!r} is scheduled for positions {reported[rid][0]}..{reported[rid][0] + n - 1}; "
                f"the last computable position is max_model_len - 2 = {max_model_len - 2}"
            )
    return out


def is_pool_block_id(block_id: Any, num_gpu_blocks: int) -> bool:
    """True for the id of a usable block of a pool of ``num_gpu_blocks``: an integer in ``1..num_gpu_blocks - 1``."""
    return isinstance(block_id, int) and not isinstance(block_id, bool) and 1 <= block_id < num_gpu_blocks


def _get_ids_outside_pool(holders: Iterable[tuple[str, str, Iterable[Any]]], num_gpu_blocks: int) -> list[str]:
    """One message per ``(holder, where, ids)`` that holds an id outside ``1..num_gpu_blocks - 1``."""
    out = []
    for holder, where, ids in holders:
        bad = [b for b in ids if not is_pool_block_id(b, num_gpu_blocks)]
        if bad:
            null = " (block 0 is the null block: never handed out, never free)" if 0 in bad else ""
            out.append(
                f"{holder} has block {bad[0]!r} ({where}), outside the pool's usable blocks "
                f"1..{num_gpu_blocks - 1}{null}"
            )
    return out


def check_block_ids(output: Mapping[str, Any], num_gpu_blocks: int) -> list[str]:
    """Every block id a SchedulerOutput hands out (``block_ids``, ``new_block_ids``) is a usable block of
    the pool: an integer in ``1..num_gpu_blocks - 1``.

    The model runner's KV cache is one tensor of ``num_gpu_blocks`` blocks,
    indexed by these ids: a larger or negative id writes KV outside it (a
    crash at best, another tensor's memory at worst), whatever the policy.
    Block 0 is the null block (FORMAT.md: ``num_gpu_blocks`` counts it): the
    runner points padding entries of block tables at it, so KV a request
    kept there is overwritten by any padded step. A scheduler may number its
    own blocks as it likes, but the ids it hands the runner name the runner's
    blocks.
    """
    holders: list[tuple[str, str, Iterable[Any]]] = []
    for r in output["scheduled_new_reqs"]:
        holders.append((f"request {r['req_id']!r}", "scheduled_new_reqs block_ids", r["block_ids"]))
    for r in output["scheduled_cached_reqs"]:
        holders.append((f"request {r['req_id']!r}", "scheduled_cached_reqs new_block_ids", r["new_block_ids"]))
    return _get_ids_outside_pool(holders, num_gpu_blocks)


def check_observed_block_ids(
    block_tables: Mapping[str, list[Any]] | None, free_block_queue: Iterable[Any] | None, num_gpu_blocks: int
) -> list[str]:
    """Every block id ``observe()`` reports (``block_tables``, ``free_block_queue``) is a usable block of
    the pool, ``1..num_gpu_blocks - 1``: the null block 0 is never free and never held.

    The scheduler's own account of its pool names the blocks it hands the
    model runner (:func:`check_block_ids`): an id outside the pool in a
    table is KV no runner can hold, and in the free queue a block the
    scheduler will hand out next.
    """
    holders: list[tuple[str, str, Iterable[Any]]] = [
        (f"request {rid!r}", "observe block_tables", table) for rid, table in sorted((block_tables or {}).items())
    ]
    if free_block_queue is not None:
        holders.append(("the free queue", "observe free_block_queue", free_block_queue))
    return _get_ids_outside_pool(holders, num_gpu_blocks)


def get_step_tables(output: Mapping[str, Any], records: Mapping[str, RequestRecord]) -> dict[str, list[int]]:
    """Every scheduled request's block table after this step's allocation, from the SchedulerOutput."""
    tables = {}
    for r in output["scheduled_new_reqs"]:
        tables[r["req_id"]] = list(r["block_ids"])
    for r in output["scheduled_cached_reqs"]:
        rec = records.get(r["req_id"])
        before = [] if rec is None or r["resumed"] else rec.table
        tables[r["req_id"]] = before + list(r["new_block_ids"])
    return tables


KvWrite = tuple[int, tuple[int, ...]]
"""What a block's KV was computed for: (its index in the request's table, the request's tokens up to its last written position)."""


def get_step_writes(
    output: Mapping[str, Any], records: Mapping[str, RequestRecord], tables: Mapping[str, list[int]], block_size: int
) -> dict[int, KvWrite]:
    """The KV each scheduled request writes in this step: block id -> (table index, tokens up to the block's last written position).

    Positions ``[num_computed_tokens, num_computed_tokens + n)`` that hold a
    known token (not a draft) are written into the block covering them.
    """
    writes: dict[int, KvWrite] = {}
    reported = get_reported_computed(output, records)
    for rid, n in output["num_scheduled_tokens"].items():
        rec = records.get(rid)
        if rec is None or rid not in reported:
            continue
        start = reported[rid][0]
        end = min(start + n, len(rec.tokens))
        table = tables.get(rid, [])
        for pos in range(start, end):
            j = pos // block_size
            if j < len(table) and (pos == end - 1 or (pos + 1) % block_size == 0):
                writes[table[j]] = (j, tuple(rec.tokens[: pos + 1]))
    return writes


def check_computed_kv(
    output: Mapping[str, Any],
    records: Mapping[str, RequestRecord],
    tables: Mapping[str, list[int]],
    written: Mapping[int, KvWrite],
    block_size: int,
) -> list[str]:
    """A new or resumed request with ``num_computed_tokens = c > 0`` has, for every position below ``c``,
    a block in its table whose KV was computed at that table index for exactly the request's tokens up to it.

    A prefix hit skips computing those positions: attention then reads the
    blocks' KV as if it were the request's own. KV depends on the token and
    on every token before it, so reading KV written for other tokens (or
    never written) gives wrong logits, whatever the scheduler's policy or
    cache design. ``written`` holds the KV of every applied step plus the
    writes of this step (a hit on a block the same batch computes is fine:
    the KV is written before attention reads it, layer by layer).
    """
    out = []
    for rid, (c, is_new, resumed) in get_reported_computed(output, records).items():
        rec = records.get(rid)
        if rec is None or c <= 0 or not (is_new or resumed):
            continue
        table = tables.get(rid, [])
        for j in range((c + block_size - 1) // block_size):
            need = min(c, (j + 1) * block_size)
            if j >= len(table):
                out.append(f"request {rid!r} claims {c} computed tokens but its table has only {len(table)} blocks")
                break
            got = written.get(table[j])
            want = tuple(rec.tokens[:need])
            if got is None or got[0] != j or len(got[1]) < need or got[1][:need] != want or len(want) < need:
                what = (
                    "never written"
                    if got is None
                    else f"written as table index {got[0]} for {len(got[1])} tokens {_short(got[1])}"
                )
                out.append(
                    f"request {rid!r} claims {c} computed tokens, but block {table[j]} (its table index {j}, "
                    f"positions up to {need - 1}) holds KV {what}, not for its tokens {_short(want)}"
                )
                break
    return out


# ------------------------------------------------------------------ blocks


def check_blocks_return(
    block_tables: Mapping[str, list[int]] | None,
    num_free_blocks: int | None,
    records: Mapping[str, RequestRecord],
    num_usable_blocks: int,
) -> list[str]:
    """A request that ended holds no block, and with no live request every usable block is free.

    A finished or aborted request's KV is never read again by it; a block it
    keeps is a leak that shrinks the pool until no request fits (a cached
    block may stay *cached*, but it must be counted free: evictable).
    """
    out = []
    for rid, table in sorted((block_tables or {}).items()):
        rec = records.get(rid)
        if table and rec is not None and rec.ended is not None:
            out.append(f"request {rid!r} ended ({rec.ended}) but still holds blocks {table}")
    if num_free_blocks is not None and not any(r.ended is None for r in records.values()):
        if num_free_blocks != num_usable_blocks:
            out.append(f"no request is live, but {num_free_blocks} of {num_usable_blocks} usable blocks are free")
    return out


def check_block_exclusivity(
    tables: Mapping[str, list[int]],
    records: Mapping[str, RequestRecord],
    block_size: int,
    free_block_queue: Iterable[int] | None = None,
) -> list[str]:
    """A block is held by two live requests only as a shared prefix: the same table index, and both
    requests' tokens identical through the end of that block; a held block is never free.

    Each request writes its own KV into the blocks of its table; two requests
    writing the same block clobber each other, unless the block is a full
    block of a common prefix (a prefix-cache hit), which neither writes
    again. The derived reference count (the number of live holders) must be
    0 for a free block: handing out a held block overwrites its KV.
    """
    holders: dict[int, list[tuple[str, int]]] = {}
    for rid, table in sorted(tables.items()):
        rec = records.get(rid)
        if rec is None or rec.ended is not None:
            continue
        seen = set()
        for j, b in enumerate(table):
            if b in seen:
                return [f"request {rid!r} holds block {b} twice in its table {table}"]
            seen.add(b)
            holders.setdefault(b, []).append((rid, j))
    out = []
    for b, hs in sorted(holders.items()):
        if len(hs) < 2:
            continue
        (r0, j0), rest = hs[0], hs[1:]
        end = (j0 + 1) * block_size
        first = records[r0].tokens[:end]
        for rid, j in rest:
            toks = records[rid].tokens[:end]
            if j != j0 or len(first) < end or toks != first:
                out.append(
                    f"block {b} is held by {r0!r} (table index {j0}) and {rid!r} (table index {j}), "
                    f"which is not a shared full prefix block of identical tokens"
                )
                break
    for b in free_block_queue or ():
        if b in holders:
            out.append(
                f"block {b} is in the free queue while {holders[b][0][0]!r} holds it "
                f"(reference count {len(holders[b])})"
            )
    return out


def check_block_conservation(
    block_tables: Mapping[str, list[int]],
    num_free_blocks: int,
    records: Mapping[str, RequestRecord],
    num_usable_blocks: int,
) -> list[str]:
    """Free blocks plus the distinct blocks held by live requests equal the usable blocks (``num_gpu_blocks - 1``).

    Every usable block is either free (possibly cached, evictable) or held by
    a live request; a block in neither is leaked, a block in both is handed
    out twice. Block 0 is the null block vLLM's pool keeps for padding.
    """
    held = {b for rid, t in block_tables.items() if rid in records and records[rid].ended is None for b in t}
    if num_free_blocks + len(held) != num_usable_blocks:
        return [
            f"{num_free_blocks} free + {len(held)} held by live requests = {num_free_blocks + len(held)}, "
            f"not the {num_usable_blocks} usable blocks"
        ]
    return []


def check_block_tables(
    block_tables: Mapping[str, list[int]], records: Mapping[str, RequestRecord], preemptions_reported: bool = True
) -> list[str]:
    """The table ``observe()`` reports for a live request is the one its SchedulerOutputs handed out
    (new: ``block_ids``; running: ``+ new_block_ids``; resumed: replaced), block for block, in order.

    The model runner knows a request's blocks only from the SchedulerOutputs:
    it writes and reads the request's KV there, table index ``j`` holding
    positions ``j * block_size`` up to the next block. The scheduler's own
    table is what it frees when the request ends, shares on a prefix hit and
    counts as held. A block in the runner's table but not the scheduler's is
    freed (and handed out again) while the runner still writes it; a block in
    the scheduler's but not the runner's, or at another index, is shared or
    hit as holding KV the runner never wrote there. Either way KV is lost or
    read wrong, under any policy.

    Compared for the requests both sides know: a live request the
    SchedulerOutputs gave blocks (a scheduler may hold blocks for a request
    it has not scheduled yet) and, when the release reports its preemptions
    (``preempted_req_ids``), missing from the reported tables counts as an
    empty one; without them (vLLM 0.11) only requests in both are compared.
    """
    out = []
    for rid, rec in sorted(records.items()):
        if rec.ended is not None or not rec.table:
            continue
        if rid not in block_tables and not preemptions_reported:
            continue
        reported = list(block_tables.get(rid) or [])
        if reported != rec.table:
            out.append(
                f"request {rid!r}: observe() reports block table {_short(reported)}, but the "
                f"SchedulerOutputs handed out {_short(rec.table)}"
            )
    return out


# ------------------------------------------------------------------ update


def get_expected_finishes(rec: RequestRecord, max_model_len: int, order: str) -> list[tuple[str | None, int | None]]:
    """The (finish_reason, stop_reason) pairs the stop rules allow after the last token of ``rec.tokens``.

    EOS (unless ignored) and stop token ids stop, ``max_tokens`` outputs or
    ``max_model_len`` tokens cap the length. Where the rules leave a choice to
    the engine, every choice is allowed, the profile's (``stop_check_order``,
    ``spec/v1/stop.py``) first: when a stop and the length cap hold at the same
    token, either reason; when a stop token is sampled below ``min_tokens``
    (engines mask such tokens in the sampler, so only an injected output has
    one), stopping or going on (vLLM 0.29+ stops, 0.12-0.25 go on). When no
    rule holds, only "not finished".
    """
    last = rec.tokens[-1]
    stop: tuple[str | None, int | None] | None = None
    if rec.eos_token_id is not None and last == rec.eos_token_id:
        stop = ("stop", None)
    elif last in rec.stop_token_ids:
        stop = ("stop", last)
    length = ("length", None) if len(rec.tokens) >= max_model_len or rec.num_output >= rec.max_tokens else None
    allowed = [x for x in ((length, stop) if order == "length_first" else (stop, length)) if x is not None]
    if stop is not None and rec.num_output < rec.min_tokens:
        going_on = length or (None, None)
        if going_on not in allowed:
            allowed.insert(0 if order == "min_tokens_first" else len(allowed), going_on)
    return allowed or [(None, None)]


def check_request_lifecycle(
    sampled: Mapping[str, list[int]], outputs: list[dict[str, Any]], records: Mapping[str, RequestRecord]
) -> list[str]:
    """Every request the model sampled a token for gets exactly one output; no output goes to a request
    that sampled nothing or has already ended (so none is reported finished twice).

    The client is waiting on each sampled token; a request whose token is
    lost never ends for the client (a lost request), and an output for an
    ended request reaches a client that is gone (a duplicate). Bookkeeping,
    not policy.
    """
    out = []
    seen: dict[str, int] = {}
    for o in outputs:
        seen[o["req_id"]] = seen.get(o["req_id"], 0) + 1
    for rid, n in sorted(seen.items()):
        rec = records.get(rid)
        if n > 1:
            out.append(f"request {rid!r} has {n} outputs in one update")
        elif rec is not None and rec.ended is not None:
            out.append(f"request {rid!r} got an output after it ended ({rec.ended})")
        elif rid not in sampled:
            o = next(x for x in outputs if x["req_id"] == rid)
            if o["new_token_ids"] or o["finish_reason"] is not None:
                out.append(f"request {rid!r} got an output ({_short(o)}) but sampled nothing this step")
    for rid in sorted(sampled):
        rec = records.get(rid)
        if rec is not None and rec.ended is None and rid not in seen:
            out.append(
                f"request {rid!r} sampled token {sampled[rid]} but update_from_output() reported nothing "
                f"for it: the request is lost"
            )
    return out


def check_stop_rules(
    sampled: Mapping[str, list[int]],
    outputs: list[dict[str, Any]],
    records: Mapping[str, RequestRecord],
    max_model_len: int,
    order: str,
) -> list[str]:
    """A request's output keeps the sampled token and finishes exactly when the stop rules say, with their reason.

    Stop conditions are the client's request (``max_tokens``, EOS unless
    ``ignore_eos``, ``stop_token_ids``, ``min_tokens``) plus the
    ``max_model_len`` cap: no scheduling policy may change them. ``records``
    already hold the sampled token.
    """
    out = []
    for o in outputs:
        rid = o["req_id"]
        rec = records.get(rid)
        if rid not in sampled or rec is None or rec.ended is not None:
            continue
        if list(o["new_token_ids"]) != list(sampled[rid]):
            out.append(f"request {rid!r} sampled {sampled[rid]} but the output has {o['new_token_ids']}")
            continue
        allowed = get_expected_finishes(rec, max_model_len, order)
        got = (o["finish_reason"], o["stop_reason"])
        if got not in allowed:
            want = allowed[0] if len(allowed) == 1 else " or ".join(map(str, allowed))
            out.append(
                f"request {rid!r} after {rec.num_output} output tokens (max_tokens={rec.max_tokens}, "
                f"min_tokens={rec.min_tokens}, eos={rec.eos_token_id}, stop_token_ids={list(rec.stop_token_ids)}, "
                f"last token {rec.tokens[-1]}, {len(rec.tokens)} of max_model_len={max_model_len}): "
                f"finish {got}, the stop rules give {want}"
            )
    return out


# ---------------------------------------------------------------- liveness


def compute_liveness_bound(records: Iterable[RequestRecord], max_model_len: int) -> int:
    """Steps within which every live request must end once no input arrives (spec/symbolic/LIVENESS.md).

    ``W_r = min(prompt + max_tokens, max_model_len) - 1`` is the most tokens
    request r computes from scratch (its last token is sampled, never
    computed; a resumed request re-prefills its outputs, so the total stays
    ``W_r``). With the live requests' works sorted ascending,
    ``W_1 <= ... <= W_n``, the bound is ``sum_i (W_i + sum_{j > i} (W_j + 1))``:
    what vLLM 0.32/0.33 provably meet under priority (distinct keys) for the
    worst assignment of priorities, and above their FCFS bound
    ``sum_r (ceil(P_r / c) + W_r - P_r)``. It asks of any scheduler what the
    proof uses: some request leads (is never preempted) until it ends, and
    each step either gives the leader a token, or gives another request a
    token it keeps, or preempts one (at most ``W_j + 1`` such steps per other
    request and leader). A scheduler that starves a request, or throws work
    away more often, exceeds it.
    """
    from schedconf.spec.symbolic.liveness_bound import compute_any_order_bound

    live = [r for r in records if r.ended is None]
    return compute_any_order_bound(min(r.max_len, max_model_len) - 1 for r in live)


def check_liveness(
    step: int,
    deadline: int | None,
    records: Mapping[str, RequestRecord],
    num_usable_blocks: int,
    block_size: int,
    last_input_step: int,
) -> list[str]:
    """After the last input, every live request that fits the pool alone ends by the deadline
    (:func:`compute_liveness_bound` steps after it): still live at ``step >= deadline`` fails.

    Safety alone is met by a scheduler that runs nothing; the clients are not
    served by it. A request fits alone when ``min(prompt + max_tokens,
    max_model_len)`` tokens fit the usable blocks.
    """
    if deadline is None or step < deadline:
        return []
    stuck = [
        r
        for r in records.values()
        if r.ended is None and (r.max_len + block_size - 1) // block_size <= num_usable_blocks
    ]
    if not stuck:
        return []
    names = ", ".join(f"{r.request_id!r} ({r.num_output} outputs, {r.computed} computed)" for r in stuck[:5])
    return [
        f"{len(stuck)} request(s) still live {step - last_input_step} steps after the last input (bound "
        f"{deadline - last_input_step} steps): {names}"
    ]


# ----------------------------------------------------------------- helpers


def _counts(output: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in output["num_scheduled_tokens"].items())


def _short(value: Any, limit: int = 60) -> str:
    text = str(list(value)) if isinstance(value, tuple) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
