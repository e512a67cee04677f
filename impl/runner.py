"""The model runner: a paged KV cache and the forward pass of one scheduled batch.

KV layout: per layer, one key and one value tensor of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``; token position ``p`` of a
request lives in slot ``table[p // block_size] * block_size + p % block_size``
of the flattened tensor, ``table`` being the request's block table.

From each ``StepOutput`` the runner builds, per scheduled request, the input
ids of positions ``[num_computed, num_computed + n)`` (its tokens, then its
scheduled drafts), their positions and slots; runs the layers, writing every
new key/value into its slot *before* any attention of that layer reads the
cache (so a request admitted on a prefix hit reads blocks another request of
the same batch is computing); attends each query over its own request's
blocks up to its own position; and samples greedily where the scheduled chunk
reaches the end of the sequence: the last real token and each draft, with
verification accepting the leading drafts equal to the model's own choices.

Attention is batched in two shapes: every short segment (decodes, draft
verification, short chunks) in one padded call, and each long prefill chunk
on its own, its queries split so no score matrix exceeds a fixed size.

Prefix hits and KV validity. The scheduler caches a block when it is
scheduled, before its KV is computed. Under the priority policy a request can
be scheduled, cache blocks, and then be preempted in the same step (a victim
taken back out of the batch): its cached blocks stay in the prefix cache
although their KV was never written, and a later prefix hit would read
garbage. The runner therefore keeps, per block, the pool generation
(``BlockPool.gen``: how often the block was taken from the free queue) at which
it last wrote all of the block's slots with the request's own tokens. A hit
block whose generation does not match, and that no request of the batch
completes, is recomputed: the admitted request's segment starts at the first
such block (extra positions, no sampling). Scheduler decisions are unchanged.

Steps in flight (async scheduling, the batch queue). ``execute`` is
``prepare`` (on the scheduler's thread, right after ``schedule()``: segments,
slots, block tables, attention plans, all taken from the scheduler's state of
that moment, which later ``schedule()`` calls may change) followed by ``run``
(the forward pass and sampling; it may run on another thread while the next
step is scheduled) and ``propose`` (drafts, on the scheduler's thread). Steps
run in the order they were scheduled. Under an async profile a decode may be
scheduled while the token it consumes is still being sampled by an earlier
step (an output placeholder): ``prepare`` leaves a hole there and ``run``
fills it with the request's token if the scheduler has it by then, else with
the token the earlier step sampled (vLLM's async model runner reads
``prev_sampled_token_ids`` the same way). Blocks that a prepared step writes
in full count as valid for the prefix-hit repair of later steps (they run
after it); ``commit`` makes them valid for good once the step's output is
applied.

Async scheduling with spec decode. ``AsyncScheduler`` never sees a draft: it
schedules ``[-1] * k`` placeholders for a request's next step, counting on all
of them being accepted. Like vLLM's worker, the runner keeps the drafter's
proposals from each request's previous step (made in ``run``, right after
sampling, on the thread that runs the steps) and puts them where the ``-1``s
are; and since the scheduler counted the previous step's drafts as accepted
(its output was not back yet), every position of the next step is moved back
by the number of drafts the previous steps in flight rejected (their
"sources", the request's sampling steps prepared and not yet applied when it
was scheduled, same incarnation). ``run`` does both, with slots and attention
rebuilt for moved segments; the segment then holds the real positions.
Blocks a moved step writes are marked in flight only where every possible
shift writes them; ``commit`` marks exactly. ``commit(result, sampled)``
takes the tokens the scheduler was given when they are not the runner's own
(teacher forcing): they decide the sources' rejections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from schedconf.impl.drafter import NgramDrafter
from schedconf.impl.model import LlamaModel
from schedconf.impl.sampling import TIE_EPS, NearTie, greedy, mask_stop_tokens
from schedconf.impl.scheduler import BlockPool, Req, StepOutput

SHORT_SEGMENT = 16
"""Segments of at most this many tokens share one padded attention call."""

MAX_SCORE_ELEMENTS = 1 << 24
"""Queries of a long segment are split so one score matrix has at most this many elements."""


@dataclass
class Segment:
    """One scheduled request's work in this step."""

    entry_index: int
    req: Req
    table: list[int]
    start: int
    """First position computed (below ``num_computed`` when hit blocks are repaired)."""
    end: int
    """One past the last position computed."""
    num_tokens: int
    """The request's ``num_tokens`` at scheduling time: positions below are real tokens."""
    drafts: list[int]
    input_ids: list[int]
    holes: list[int] = field(default_factory=list)
    """Positions whose input token a step still in flight samples (async placeholders)."""
    commit_blocks: list[tuple[int, int]] = field(default_factory=list)
    """``(block, pool generation)`` of the table blocks ``[start // bs, ceil(end / bs))`` at scheduling time."""
    row: int = 0
    """Index of the segment's first position in the flattened batch."""
    sample_row: int = -1
    """Index (in the logits) of the first sampled position, or -1."""
    commit_first: int = 0
    """Table index of ``commit_blocks[0]``."""
    marked: list[tuple[int, int]] = field(default_factory=list)
    """``(block, generation)`` marked written in flight by ``prepare`` (unmarked by ``commit``)."""
    num_scheduled_drafts: int = 0
    """Drafts scheduled (fixed at ``prepare``; ``end - num_tokens`` once positions are real)."""
    incarnation: int = 0
    """The request's ``num_preemptions`` when prepared."""
    sources: list[Segment] = field(default_factory=list)
    """Async + spec: the request's sampling segments in flight when this one was prepared."""
    rejected: int = 0
    """Async + spec: drafts this segment's verification rejected (the shift it causes later steps)."""
    known: int = 0
    """``len(req.tokens)`` at ``prepare``: positions from here on were placeholders then."""


@dataclass
class PreparedStep:
    """A scheduled step ready to run: everything taken from the scheduler's state when it was scheduled."""

    out: StepOutput
    segments: list[Segment]
    repaired: int
    ids: list[int] = field(default_factory=list)
    """Input ids of the flattened batch; holes hold -1 until ``run`` fills them."""
    hole_rows: list[tuple[int, Req, int]] = field(default_factory=list)
    """``(row, request, position)`` of every hole."""
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)
    plans: list[_Attention] = field(default_factory=list)
    fixups: list[Segment] = field(default_factory=list)
    """Async + spec: segments whose positions, placeholder inputs and drafts ``run`` settles."""


@dataclass
class ExecuteResult:
    """What one forward pass produced."""

    sampled: list[list[int]]
    """Per scheduled entry: the sampled token plus accepted drafts ([] for a prefill chunk)."""
    drafts: dict[str, list[int]]
    """Drafts proposed for the next step, per request that sampled."""
    near_ties: list[NearTie]
    segments: list[Segment]
    logits: dict[int, torch.Tensor] = field(default_factory=dict)
    """With ``keep_logits``: per entry index, the float64 CPU logits of its sampled positions."""
    num_repaired_tokens: int = 0
    num_drafts_accepted: int = 0


class ModelRunner:
    """Owns the paged KV cache of one model; executes StepOutputs of one FastScheduler."""

    def __init__(
        self,
        model: LlamaModel,
        pool: BlockPool,
        block_size: int,
        max_model_len: int,
        num_spec_tokens: int = 0,
        drafter: NgramDrafter | None = None,
        repair_prefix_hits: bool = True,
        async_scheduling: bool = False,
    ) -> None:
        """``repair_prefix_hits=False`` trusts every prefix hit; it exists only to demonstrate the hazard.

        ``async_scheduling``: steps may be scheduled with output placeholders;
        keep each step's sampled tokens until the step that consumes them ran.
        """
        c = model.config
        self.model = model
        self.pool = pool
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_spec_tokens = num_spec_tokens
        self.drafter = drafter
        self.repair_prefix_hits = repair_prefix_hits
        shape = (pool.num_blocks, block_size, c.num_kv_heads, c.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in range(c.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in range(c.num_layers)]
        self.written_gen = [-1] * pool.num_blocks
        self.inflight_gen: dict[int, int] = {}
        """Blocks written in full by steps prepared but not committed yet: block -> pool generation."""
        self.async_scheduling = async_scheduling
        self.sampled_ahead: dict[Req, dict[int, int]] = {}
        """Per request, tokens sampled by steps that ran, by position (fills the holes of later steps)."""
        self.tie_eps = TIE_EPS.get(model.dtype, 1e-3)
        self.num_repaired_tokens = 0
        self.num_forward_tokens = 0
        self.num_holes_from_runner = 0
        """Placeholder inputs filled from an earlier step's sampled tokens (not yet applied by the scheduler)."""
        self.num_holes_from_scheduler = 0
        """Placeholder inputs whose token the scheduler had applied by the time the step ran."""
        self.async_spec = async_scheduling and num_spec_tokens > 0
        """AsyncScheduler with spec decode: drafts are the runner's, positions corrected at ``run``."""
        self._open: dict[Req, list[Segment]] = {}
        """Async + spec: per request, its sampling segments prepared and not yet committed (scheduler's thread)."""
        self.next_drafts: dict[Req, tuple[int, list[int]]] = {}
        """Async + spec: per request, ``(sequence length, proposals)`` after its last sampling step (run's thread)."""
        self._to_forget: list[str] = []
        """Async + spec: ids whose drafter state ``run`` drops (the drafter lives on run's thread)."""
        self.num_drafts_substituted = 0
        """Async + spec: scheduled ``-1`` drafts given the drafter's proposals."""
        self.num_shifted_segments = 0
        """Async + spec: segments moved back over drafts rejected by steps still in flight."""

    # ------------------------------------------------------------------ batch building

    def _segments(self, out: StepOutput) -> tuple[list[Segment], int]:
        """One segment per scheduled entry, hit blocks without valid KV repaired."""
        bs = self.block_size
        gen, written, inflight = self.pool.gen, self.written_gen, self.inflight_gen
        completing: set[int] = set()
        for req, n, start, ntok, _ in out.entries:
            table = req.blocks
            assert table is not None
            for j in range(start // bs, min(start + n, ntok) // bs):
                completing.add(table[j])
        segments: list[Segment] = []
        repaired = 0
        for index, (req, n, start, ntok, _) in enumerate(out.entries):
            table = req.blocks
            assert table is not None
            seg_start = start
            if self.repair_prefix_hits and index >= out.num_running and start > 0:
                for j in range(start // bs):
                    b = table[j]
                    g = gen[b]
                    if written[b] != g and inflight.get(b) != g and b not in completing:
                        seg_start = j * bs
                        break
                if seg_start < start:
                    repaired += start - seg_start
                    completing.update(table[seg_start // bs : start // bs])
            end = start + n
            drafts = list(out.spec_tokens.get(req.req_id, ())) if end > ntok else []
            real_end = min(end, ntok)
            ids = req.tokens[seg_start:real_end]
            holes: list[int] = []
            if seg_start + len(ids) < real_end:  # placeholders: sampled by steps still in flight
                holes = list(range(seg_start + len(ids), real_end))
                ids = ids + [-1] * len(holes)
            ids += drafts[: max(end - ntok, 0)]
            seg = Segment(index, req, table, seg_start, end, ntok, drafts, ids, holes)
            seg.num_scheduled_drafts = max(end - ntok, 0)
            seg.known = len(req.tokens)
            seg.incarnation = req.num_preemptions
            max_shift = 0
            if self.async_spec:
                seg.sources = [s for s in self._open.get(req, ()) if s.incarnation == seg.incarnation]
                max_shift = sum(s.num_scheduled_drafts for s in seg.sources)
            seg.commit_first = max(seg_start - max_shift, 0) // bs
            seg.commit_blocks = [(b, gen[b]) for b in table[seg.commit_first : (end + bs - 1) // bs]]
            # blocks this step fills with the sequence's tokens whatever the
            # shift (placeholders are tokens; drafts are not, until verified):
            # later steps may read them
            seg.marked = seg.commit_blocks[
                seg_start // bs - seg.commit_first : max(real_end - max_shift, 0) // bs - seg.commit_first
            ]
            segments.append(seg)
        return segments, repaired

    def _slots(self, table: list[int], start: int, end: int) -> range | list[int]:
        """The cache slots of positions ``[start, end)``, block by block."""
        bs = self.block_size
        out: list[int] = []
        j = start // bs
        p = start
        while p < end:
            base = table[j] * bs
            stop = min(end, (j + 1) * bs)
            out.extend(range(base + p - j * bs, base + stop - j * bs))
            p = stop
            j += 1
        return out

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def execute(self, out: StepOutput, *, propose: bool = True, keep_logits: bool = False) -> ExecuteResult:
        """Run the forward pass of ``out`` and sample (see the module docstring): prepare, run, propose."""
        result = self.run(self.prepare(out), keep_logits=keep_logits)
        if propose:
            self.propose(result)
        return result

    @torch.inference_mode()
    def prepare(self, out: StepOutput) -> PreparedStep:
        """Everything of a step that reads the scheduler's state; call right after ``schedule()``."""
        segments, repaired = self._segments(out)
        step = PreparedStep(out, segments, repaired)
        if not segments:
            return step
        ids, positions, slots, sample_rows = step.ids, step.positions, step.slots, step.sample_rows
        for seg in segments:
            seg.row = len(ids)
            if self.async_spec and (seg.sources or seg.holes or seg.num_scheduled_drafts):
                step.fixups.append(seg)  # run settles its positions and inputs
            else:
                for pos in seg.holes:
                    step.hole_rows.append((seg.row + pos - seg.start, seg.req, pos))
            ids.extend(seg.input_ids)
            positions.extend(range(seg.start, seg.end))
            slots.extend(self._slots(seg.table, seg.start, seg.end))
            if seg.end >= seg.num_tokens:
                seg.sample_row = len(sample_rows)
                first = seg.row + (seg.num_tokens - 1 - seg.start)
                sample_rows.extend(range(first, seg.row + (seg.end - seg.start)))
                if self.async_spec:
                    self._open.setdefault(seg.req, []).append(seg)
            for b, g in seg.marked:
                self.inflight_gen[b] = g
        step.plans = self._attention_plans(segments)
        return step

    @torch.inference_mode()
    def run(
        self, step: PreparedStep, *, keep_logits: bool = False, drafts: dict[str, list[int]] | None = None
    ) -> ExecuteResult:
        """The forward pass and greedy sampling of a prepared step (steps run in schedule order).

        Touches no scheduler state but the tokens of the requests with holes
        (read, never written); may run on a worker thread. Async + spec:
        ``drafts`` (per request id) replace the drafter's proposals as the
        inputs of the scheduled ``-1`` drafts (teacher forcing).
        """
        if self._to_forget:
            self._forget_now()
        out, segments = step.out, step.segments
        self.num_repaired_tokens += step.repaired
        sampled: list[list[int]] = [[] for _ in out.entries]
        result = ExecuteResult(
            sampled=sampled, drafts={}, near_ties=[], segments=segments, num_repaired_tokens=step.repaired
        )
        if not segments:
            return result
        model, dev = self.model, self.model.device
        ids = step.ids
        if step.hole_rows:
            ids = list(ids)
            ahead = self.sampled_ahead
            for row, req, pos in step.hole_rows:
                tokens = req.tokens
                if pos < len(tokens):
                    ids[row] = tokens[pos]
                    self.num_holes_from_scheduler += 1
                else:  # not applied yet: the token an earlier step sampled (0 for an output since discarded)
                    ids[row] = ahead.get(req, {}).get(pos, 0)
                    self.num_holes_from_runner += 1
        positions, slots, plans = step.positions, step.slots, step.plans
        if step.fixups:
            ids, positions, slots, plans = self._settle(step, ids, drafts)
        self.num_forward_tokens += len(ids)
        ids_t = model.token_tensor(ids)
        rope = model.rope(torch.tensor(positions, dtype=torch.long, device=dev))
        slot_t = torch.tensor(slots, dtype=torch.long, device=dev)
        hidden = model.embed(ids_t)
        c = model.config
        for layer in range(c.num_layers):
            q, k, v = model.qkv(layer, hidden, rope)
            k_flat = self.k_cache[layer].view(-1, c.num_kv_heads, c.head_dim)
            v_flat = self.v_cache[layer].view(-1, c.num_kv_heads, c.head_dim)
            k_flat.index_copy_(0, slot_t, k)
            v_flat.index_copy_(0, slot_t, v)
            attn = torch.empty_like(q)
            for plan in plans:
                plan.run(q, k_flat, v_flat, attn, model.scale)
            hidden = model.finish_layer(layer, hidden, attn.reshape(q.shape[0], -1))
        if not step.sample_rows:
            return result
        logits = model.logits(hidden[torch.tensor(step.sample_rows, dtype=torch.long, device=dev)])
        self._sample(out, segments, logits, result, keep_logits=keep_logits)
        if self.async_spec and self.drafter is not None:
            self._propose_ahead(result)
        return result

    def _settle(
        self, step: PreparedStep, ids: list[int], given: dict[str, list[int]] | None
    ) -> tuple[list[int], list[int], list[int], list[_Attention]]:
        """Async + spec, at run time: move segments back over their sources' rejected drafts, fill inputs.

        A segment's real tokens come from the request (applied) or from the
        steps that sampled them (``sampled_ahead``); its scheduled ``-1``
        drafts become ``given[req_id]`` or the proposals made after the
        request's previous step, if they were made for this sequence length
        (padded with token 0: a draft only has to be verified, not right).
        """
        ids = list(ids)
        positions, slots = step.positions, step.slots
        moved = False
        for seg in step.fixups:
            req = seg.req
            shift = 0
            for src in seg.sources:
                shift += src.rejected
            if shift:
                if not moved:
                    positions, slots, moved = list(positions), list(slots), True
                seg.start -= shift
                seg.end -= shift
                seg.num_tokens -= shift
                n = seg.end - seg.start
                positions[seg.row : seg.row + n] = range(seg.start, seg.end)
                slots[seg.row : seg.row + n] = self._slots(seg.table, seg.start, seg.end)
                self.num_shifted_segments += 1
            tokens = req.tokens
            ahead = self.sampled_ahead.get(req, {})
            for pos in range(seg.start, min(seg.end, seg.num_tokens)):
                if pos < len(tokens):
                    ids[seg.row + pos - seg.start] = tokens[pos]
                    if pos >= seg.known:
                        self.num_holes_from_scheduler += 1
                else:  # not applied yet: the token an earlier step sampled (0 for an output since discarded)
                    ids[seg.row + pos - seg.start] = ahead.get(pos, 0)
                    self.num_holes_from_runner += 1
            m = seg.num_scheduled_drafts
            if m:
                proposal: list[int] | None = None if given is None else given.get(req.req_id)
                if proposal is None:
                    kept = self.next_drafts.get(req)
                    proposal = kept[1] if kept is not None and kept[0] == seg.num_tokens else []
                d = list(proposal[:m])
                self.num_drafts_substituted += len(d)
                d += [0] * (m - len(d))
                seg.drafts = d
                first = seg.row + seg.num_tokens - seg.start
                ids[first : first + m] = d
        plans = self._attention_plans(step.segments) if moved else step.plans
        return ids, positions, slots, plans

    def _propose_ahead(self, result: ExecuteResult) -> None:
        """Async + spec: the drafter's proposals after this step, kept for each request's next step.

        The drafter's copy of a sequence is checked against the runner's view
        (length and last token) and rebuilt where it went astray (an output
        dropped by a reset preemption); finished requests get none.
        """
        drafter = self.drafter
        assert drafter is not None
        limit_base = self.max_model_len - 1
        for seg in result.segments:
            chosen = result.sampled[seg.entry_index]
            req = seg.req
            if seg.sample_row < 0 or not chosen or req.is_finished:
                continue
            length = seg.num_tokens
            tail = drafter.context_tail(req.req_id)
            prefix: list[int] = []
            if tail is None or tail != (length, self._token_at(req, length - 1)):
                drafter.forget(req.req_id)
                prefix = [self._token_at(req, p) for p in range(length)]
            proposals = drafter.propose(req.req_id, prefix, chosen, limit_base - (length + len(chosen)))
            self.next_drafts[req] = (length + len(chosen), proposals)

    def _token_at(self, req: Req, pos: int) -> int:
        """The request's token at ``pos``: applied, or sampled by a step that ran (0 if unknown)."""
        tokens = req.tokens
        if pos < len(tokens):
            return tokens[pos]
        return self.sampled_ahead.get(req, {}).get(pos, 0)

    def _forget_now(self) -> None:
        """Drop the drafter state of finished requests (on run's thread, where the drafter works)."""
        while self._to_forget:
            rid = self._to_forget.pop()
            if self.drafter is not None:
                self.drafter.forget(rid)
        for req in [r for r in self.next_drafts if r.is_finished]:
            del self.next_drafts[req]

    def _attention_plans(self, segments: list[Segment]) -> list[_Attention]:
        short = [s for s in segments if s.end - s.start <= SHORT_SEGMENT]
        plans: list[_Attention] = []
        if short:
            plans.append(_Attention(self, short))
        for seg in segments:
            if seg.end - seg.start > SHORT_SEGMENT:
                plans.append(_Attention(self, [seg]))
        return plans

    def _sample(
        self,
        out: StepOutput,
        segments: list[Segment],
        logits: torch.Tensor,
        result: ExecuteResult,
        *,
        keep_logits: bool,
    ) -> None:
        """Greedy choice per sampled position, draft verification, near ties."""
        masks: list[tuple[int, frozenset[int]]] = []
        for seg in segments:
            if seg.sample_row < 0 or not seg.req.min_tokens:
                continue
            num_out = seg.num_tokens - seg.req.num_prompt
            for i in range(seg.end - seg.num_tokens + 1):
                if num_out + i < seg.req.min_tokens:
                    masks.append((seg.sample_row + i, seg.req.stopset))
        if keep_logits:  # the model's own logits, before the min-tokens mask
            cpu = logits.to(device="cpu", dtype=torch.float64, copy=True)
        mask_stop_tokens(logits, masks)
        tokens, runner_up, margins = greedy(logits)
        ahead = self.sampled_ahead
        for seg in segments:
            if seg.sample_row < 0:
                continue
            req = seg.req
            m = seg.end - seg.num_tokens  # drafts scheduled
            row = seg.sample_row
            accepted = 0
            while accepted < m and seg.drafts[accepted] == tokens[row + accepted]:
                accepted += 1
            chosen = tokens[row : row + accepted + 1]
            result.sampled[seg.entry_index] = chosen
            result.num_drafts_accepted += accepted
            seg.rejected = m - accepted
            num_out = seg.num_tokens - req.num_prompt
            for i in range(accepted + 1):
                if margins[row + i] < self.tie_eps:
                    result.near_ties.append(
                        NearTie(req.req_id, num_out + i, tokens[row + i], runner_up[row + i], float(margins[row + i]))
                    )
            if keep_logits:
                result.logits[seg.entry_index] = cpu[row : row + m + 1]
            if self.async_scheduling:  # a later step in flight may consume these tokens
                known = {p: t for p, t in ahead.get(req, {}).items() if p >= seg.start}
                for i, t in enumerate(chosen):
                    known[seg.num_tokens + i] = t
                ahead[req] = known

    def propose(self, result: ExecuteResult) -> None:
        """The drafter's proposals for the next step, per request that sampled (on the scheduler's thread).

        Async + spec: none (``run`` proposed already; the scheduler gets no drafts).
        """
        if self.drafter is None or self.async_spec:
            return
        limit_base = self.max_model_len - 1
        for seg in result.segments:
            chosen = result.sampled[seg.entry_index]
            if seg.sample_row < 0 or not chosen:
                continue
            drafts = self.drafter.propose(
                seg.req.req_id, seg.req.tokens, chosen, limit_base - (seg.num_tokens + len(chosen))
            )
            if drafts:
                result.drafts[seg.req.req_id] = drafts

    # ------------------------------------------------------------------ after the update

    def commit(self, result: ExecuteResult, sampled: list[list[int]] | None = None) -> None:
        """Record which blocks now hold valid KV; call after ``update_from_output``.

        ``sampled``: the tokens the scheduler was given per entry when they
        are not ``result.sampled`` (teacher forcing); they decide how many
        drafts each segment rejected (async + spec: later steps move back by
        that many).

        A position's KV is valid when it was computed from the token the
        sequence really has there, with a valid context: every real token of a
        segment, then its drafts up to the first one the sequence does not
        contain. Blocks whose last slot falls in a segment's valid range get the
        pool generation they were in when the step was scheduled (a block freed
        and taken again since is in a newer one, so it does not become valid).
        """
        bs = self.block_size
        written, inflight = self.written_gen, self.inflight_gen
        for seg in result.segments:
            if self.async_spec and seg.sample_row >= 0:
                if sampled is not None and sampled[seg.entry_index]:
                    seg.rejected = seg.num_scheduled_drafts - (len(sampled[seg.entry_index]) - 1)
                open_segments = self._open.get(seg.req)
                if open_segments is not None:
                    open_segments[:] = [s for s in open_segments if s is not seg]
                    if not open_segments or seg.req.is_finished:
                        del self._open[seg.req]
            for b, g in seg.marked:
                if inflight.get(b) == g:
                    del inflight[b]
            valid_end = min(seg.end, seg.num_tokens)
            if valid_end == seg.num_tokens:
                tokens = seg.req.tokens
                for d in seg.drafts[: seg.end - seg.num_tokens]:
                    if valid_end < len(tokens) and tokens[valid_end] == d:
                        valid_end += 1
                    else:
                        break
            first = seg.start // bs - seg.commit_first
            for b, g in seg.commit_blocks[first : max(valid_end // bs - seg.commit_first, first)]:
                written[b] = g
            if self.drafter is not None and seg.req.is_finished:
                if self.async_spec:
                    self._to_forget.append(seg.req.req_id)
                else:
                    self.drafter.forget(seg.req.req_id)
        ahead = self.sampled_ahead
        if ahead:
            for req in list(ahead):
                if req.is_finished:
                    ahead.pop(req, None)

    def forget(self, req_id: str) -> None:
        """Drop per-request state of an aborted request."""
        if self.drafter is not None:
            if self.async_spec:
                self._to_forget.append(req_id)  # the drafter is run's
            else:
                self.drafter.forget(req_id)


class _Attention:
    """One padded attention call over a group of segments (queries over their own blocks)."""

    def __init__(self, runner: ModelRunner, segments: list[Segment]) -> None:
        dev = runner.model.device
        bs = runner.block_size
        self.segments = segments
        qmax = max(s.end - s.start for s in segments)
        lmax = max(s.end for s in segments)
        max_blocks = (lmax + bs - 1) // bs
        tables = [s.table[:max_blocks] + [0] * (max_blocks - min(len(s.table), max_blocks)) for s in segments]
        bt = torch.tensor(tables, dtype=torch.long, device=dev)
        kpos = torch.arange(lmax, device=dev)
        self.ctx_slots = bt[:, kpos // bs] * bs + kpos % bs  # [R, Lmax]; padding points at the null block
        q_rows: list[list[int]] = []
        q_pos: list[list[int]] = []
        valid_rows: list[int] = []
        for s in segments:
            n = s.end - s.start
            q_rows.append(list(range(s.row, s.row + n)) + [s.row] * (qmax - n))
            q_pos.append(list(range(s.start, s.end)) + [0] * (qmax - n))
            valid_rows.extend(range(s.row, s.row + n))
        self.q_rows = torch.tensor(q_rows, dtype=torch.long, device=dev)  # [R, Qmax]
        qp = torch.tensor(q_pos, dtype=torch.long, device=dev)
        self.mask = (kpos[None, None, :] <= qp[:, :, None])[:, None]  # [R, 1, Qmax, Lmax]
        self.valid = (
            torch.arange(qmax, device=dev)[None, :]
            < torch.tensor([s.end - s.start for s in segments], device=dev)[:, None]
        )  # [R, Qmax]
        self.valid_rows = torch.tensor(valid_rows, dtype=torch.long, device=dev)
        self.qmax, self.lmax = qmax, lmax

    def run(self, q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, out: torch.Tensor, scale: float) -> None:
        """``out[rows] = softmax(q k^T * scale, masked) v`` for this group's rows."""
        r, qmax = self.q_rows.shape
        qg = q.index_select(0, self.q_rows.view(-1)).view(r, qmax, *q.shape[1:]).transpose(1, 2)  # [R, H, Qmax, d]
        kv_shape = (r, self.lmax, *k_flat.shape[1:])
        k = k_flat.index_select(0, self.ctx_slots.view(-1)).view(kv_shape).transpose(1, 2)  # [R, KVH, Lmax, d]
        v = v_flat.index_select(0, self.ctx_slots.view(-1)).view(kv_shape).transpose(1, 2)
        h = qg.shape[1]
        step = max(1, MAX_SCORE_ELEMENTS // max(1, r * h * self.lmax))
        if step >= qmax:
            o = F.scaled_dot_product_attention(qg, k, v, attn_mask=self.mask, scale=scale, enable_gqa=True)
        else:
            o = torch.cat(
                [
                    F.scaled_dot_product_attention(
                        qg[:, :, i : i + step],
                        k,
                        v,
                        attn_mask=self.mask[:, :, i : i + step],
                        scale=scale,
                        enable_gqa=True,
                    )
                    for i in range(0, qmax, step)
                ],
                dim=2,
            )
        o = o.transpose(1, 2)  # [R, Qmax, H, d]
        out.index_copy_(0, self.valid_rows, o[self.valid])
