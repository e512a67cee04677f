"""The v0 model runner: a device KV cache, a host (CPU) swap cache, and the forward of one ``V0StepOutput``.

Per step, in vLLM's worker order (``Worker.execute_worker``): ``blocks_to_swap_in``
(host -> device), ``blocks_to_swap_out`` (device -> host), ``blocks_to_copy``
(device -> device), then the forward pass of ``scheduled_seq_groups``
(vLLM never has swap-ins and swap-outs in one step). The copies move the KV
bytes of every layer: a request swapped out and back in continues from the
keys and values it computed before, nothing is recomputed.

Each scheduled group computes positions ``[num_computed, num_computed +
token_chunk_size)`` of its sequence (prompt and generated tokens) through its
block table, except that a prompt chunk skips its prefix-cache hit
(``computed_block_nums``; a full hit still computes the last position, as
vLLM's ``_compute_for_prefix_cache_hit``), and samples greedily at the
sequence's last position when ``do_sample``. Attention is ``impl/runner.py``'s (``_Attention``): every new
key/value of the layer is written into its slot first, then each query
attends over its own table up to its own position.

KV validity. vLLM v0 registers a full block in the prefix cache when it is
*allocated*, before its KV exists, and counts it as a hit once the schedule()
that registered it has ended; a block can also become shared when a decode
fills it and its hash is already cached (the table then points at the other
block). So a block table may name blocks whose bytes were never written. The
runner keeps, per device block, how many leading slots hold valid KV and the
allocator generation at which they were written (``v0_blocks.gen``: a cache hit
keeps content and generation, a fresh allocation bumps it), carries that
across swaps (host blocks have their own), and before a group's forward it
starts the group at the first block of its context that is not valid
(recomputing those positions from the sequence's own tokens, without
sampling). Scheduler decisions are unchanged; ``num_repaired_tokens`` counts
the extra positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from schedconf.impl.model import LlamaModel
from schedconf.impl.runner import SHORT_SEGMENT, Segment, _Attention
from schedconf.impl.sampling import TIE_EPS, NearTie, greedy, mask_stop_tokens
from schedconf.impl.v0_scheduler import FastV0Scheduler, V0StepOutput


@dataclass
class V0ExecuteResult:
    """What one v0 step executed and produced."""

    sampled: list[int | None]
    """Per scheduled group: the greedy token, or None when it does not sample."""
    near_ties: list[NearTie]
    segments: list[Segment]
    logits: dict[int, torch.Tensor] = field(default_factory=dict)
    """With ``keep_logits``: per entry index, the float64 CPU logits row of its sampled position."""
    num_repaired_tokens: int = 0
    num_swapped_blocks: int = 0


class V0ModelRunner:
    """Owns the device and host KV caches of one model; executes the steps of one FastV0Scheduler."""

    def __init__(self, model: LlamaModel, scheduler: FastV0Scheduler, *, repair: bool = True) -> None:
        c = model.config
        self.model = model
        self.scheduler = scheduler
        self.block_size = bs = scheduler.bs
        self.repair = repair
        ngpu, ncpu = scheduler.gpu.num_blocks, scheduler.cpu.num_blocks
        dev_shape = (ngpu, bs, c.num_kv_heads, c.head_dim)
        host_shape = (ncpu, bs, c.num_kv_heads, c.head_dim)
        self.pinned = torch.device(model.device).type == "cuda"
        layers = c.num_layers
        # Device: one tensor, keys of every layer then values ([2 * layers, blocks, ...]; a layer's
        # cache is a contiguous slice, as the forward needs). Host: block-major ([blocks, 2 * layers,
        # ...]), so a host block is one contiguous run of bytes (every layer's keys and values).
        self.kv = torch.zeros((2 * layers, *dev_shape), dtype=model.dtype, device=model.device)
        self.kv_host = torch.zeros(
            (host_shape[0], 2 * layers, *host_shape[1:]), dtype=model.dtype, pin_memory=self.pinned
        )
        self.k_cache = [self.kv[i] for i in range(layers)]
        self.v_cache = [self.kv[layers + i] for i in range(layers)]
        self.k_host = [self.kv_host[:, i] for i in range(layers)]
        self.v_host = [self.kv_host[:, layers + i] for i in range(layers)]
        self.valid = [0] * ngpu
        self.valid_gen = [-1] * ngpu
        self.host_valid = [0] * ncpu
        self.host_gen = [-1] * ncpu
        self.tie_eps = TIE_EPS.get(model.dtype, 1e-3)
        self.num_repaired_tokens = 0
        self.num_forward_tokens = 0
        self.num_swapped_in_blocks = 0
        self.num_swapped_out_blocks = 0
        self.num_copied_blocks = 0

    # ------------------------------------------------------------------ cache operations

    def _gpu_valid(self, b: int) -> int:
        return self.valid[b] if self.valid_gen[b] == self.scheduler.gpu.gen[b] else 0

    def _set_gpu_valid(self, b: int, n: int) -> None:
        gen = self.scheduler.gpu.gen[b]
        if self.valid_gen[b] == gen:
            self.valid[b] = max(self.valid[b], n)
        else:
            self.valid[b], self.valid_gen[b] = n, gen

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy host blocks to device blocks, ``(cpu, gpu)`` pairs, every layer's keys and values."""
        if not pairs:
            return
        kv, host = self.kv, self.kv_host
        if self.pinned:  # stage the host blocks in pinned memory, one asynchronous copy, one device scatter
            staged = torch.empty((len(pairs), *host.shape[1:]), dtype=host.dtype, pin_memory=True)
            for i, (c, _) in enumerate(pairs):
                staged[i].copy_(host[c])
            dst = torch.tensor([g for _, g in pairs], dtype=torch.long, device=kv.device)
            kv.index_copy_(1, dst, staged.to(kv.device, non_blocking=True).transpose(0, 1))
        else:  # block by block (a CPU gather/scatter kernel is several times slower than these copies)
            for c, g in pairs:
                kv[:, g].copy_(host[c])
        cpu_gen = self.scheduler.cpu.gen
        for c, g in pairs:
            self._set_gpu_valid(g, self.host_valid[c] if self.host_gen[c] == cpu_gen[c] else 0)
        self.num_swapped_in_blocks += len(pairs)

    def swap_out(self, pairs: list[tuple[int, int]], gens: list[int]) -> None:
        """Copy device blocks to host blocks, ``(gpu, cpu)`` pairs; ``gens``: each GPU block's generation when freed."""
        if not pairs:
            return
        kv, host = self.kv, self.kv_host
        if self.pinned:  # one device gather, one device -> pinned copy, then the host blocks
            src = torch.tensor([g for g, _ in pairs], dtype=torch.long, device=kv.device)
            gathered = kv.index_select(1, src).transpose(0, 1).contiguous()
            staged = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
            staged.copy_(gathered, non_blocking=True)
            torch.cuda.current_stream(kv.device).synchronize()
            for i, (_, c) in enumerate(pairs):
                host[c].copy_(staged[i])
        else:
            for g, c in pairs:
                host[c].copy_(kv[:, g])
        cpu_gen = self.scheduler.cpu.gen
        for (g, c), gen in zip(pairs, gens):
            n = self.valid[g] if self.valid_gen[g] == gen else 0
            if self.host_gen[c] == cpu_gen[c]:
                n = max(n, self.host_valid[c])
            self.host_valid[c], self.host_gen[c] = n, cpu_gen[c]
        self.num_swapped_out_blocks += len(pairs)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks to device blocks (copy-on-write), ``(src, dst)`` pairs."""
        if not pairs:
            return
        dev = self.model.device
        src = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=dev)
        dst = torch.tensor([d for _, d in pairs], dtype=torch.long, device=dev)
        self.kv.index_copy_(1, dst, self.kv.index_select(1, src))
        for s, d in pairs:
            self._set_gpu_valid(d, self._gpu_valid(s))
        self.num_copied_blocks += len(pairs)

    # ------------------------------------------------------------------ forward

    def _segments(self, out: V0StepOutput) -> tuple[list[Segment], int]:
        bs = self.block_size
        segments: list[Segment] = []
        repaired = 0
        for index, (req, chunk, is_prompt, _, table, computed, before) in enumerate(out.entries):
            end = before + chunk
            start = before
            if is_prompt and computed:  # vLLM's _compute_for_prefix_cache_hit: skip the hit blocks
                start = max(before, min(len(computed) * bs, end - 1))
            skipped = start
            if self.repair:
                for j in range(-(-start // bs)):
                    if self._gpu_valid(table[j]) < min(bs, start - j * bs):
                        start = j * bs
                        break
            repaired += skipped - start
            ntok = len(req.tokens)
            seg = Segment(index, req, table, start, end, ntok, [], req.tokens[start:end])  # type: ignore[arg-type]
            segments.append(seg)
        return segments, repaired

    def _slots(self, table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    @torch.inference_mode()
    def execute(self, out: V0StepOutput, *, keep_logits: bool = False) -> V0ExecuteResult:
        """Swap, copy, run the forward pass of ``out`` and sample (see the module docstring)."""
        self.swap_in(out.blocks_to_swap_in)
        self.swap_out(out.blocks_to_swap_out, out.swap_out_gens)
        self.copy_blocks(out.blocks_to_copy)
        segments, repaired = self._segments(out)
        self.num_repaired_tokens += repaired
        result = V0ExecuteResult(
            sampled=[None] * len(out.entries),
            near_ties=[],
            segments=segments,
            num_repaired_tokens=repaired,
            num_swapped_blocks=len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out),
        )
        if not segments:
            return result
        model, dev = self.model, self.model.device
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sampling: list[Segment] = []
        for seg in segments:
            seg.row = len(ids)
            ids.extend(seg.input_ids)
            positions.extend(range(seg.start, seg.end))
            slots.extend(self._slots(seg.table, seg.start, seg.end))
            if out.entries[seg.entry_index][3]:
                seg.sample_row = len(sample_rows)
                sample_rows.append(seg.row + seg.end - 1 - seg.start)
                sampling.append(seg)
        self.num_forward_tokens += len(ids)
        ids_t = model.token_tensor(ids)
        rope = model.rope(torch.tensor(positions, dtype=torch.long, device=dev))
        slot_t = torch.tensor(slots, dtype=torch.long, device=dev)
        plans = self._attention_plans(segments)
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
        self._record_written(segments)
        if sample_rows:
            logits = model.logits(hidden[torch.tensor(sample_rows, dtype=torch.long, device=dev)])
            self._sample(sampling, logits, result, keep_logits)
        return result

    def _attention_plans(self, segments: list[Segment]) -> list[_Attention]:
        short = [s for s in segments if s.end - s.start <= SHORT_SEGMENT]
        plans = [_Attention(self, short)] if short else []  # type: ignore[arg-type]
        long_segments = [s for s in segments if s.end - s.start > SHORT_SEGMENT]
        plans.extend(_Attention(self, [s]) for s in long_segments)  # type: ignore[arg-type]
        return plans

    def _record_written(self, segments: list[Segment]) -> None:
        """Every block a segment wrote now holds valid KV up to the segment's end."""
        bs = self.block_size
        for seg in segments:
            for j in range(seg.start // bs, -(-seg.end // bs)):
                self._set_gpu_valid(seg.table[j], min(bs, seg.end - j * bs))

    def _sample(
        self, sampling: list[Segment], logits: torch.Tensor, result: V0ExecuteResult, keep_logits: bool
    ) -> None:
        masks = []
        for seg in sampling:
            req = seg.req
            if len(req.tokens) - req.num_prompt < req.min_tokens:
                masks.append((seg.sample_row, req.stopset))
        if keep_logits:
            cpu = logits.to(device="cpu", dtype=torch.float64, copy=True)
        mask_stop_tokens(logits, masks)
        tokens, runner_up, margins = greedy(logits)
        for seg in sampling:
            row = seg.sample_row
            result.sampled[seg.entry_index] = tokens[row]
            if margins[row] < self.tie_eps:
                req = seg.req
                result.near_ties.append(
                    NearTie(
                        req.req_id, len(req.tokens) - req.num_prompt, tokens[row], runner_up[row], float(margins[row])
                    )
                )
            if keep_logits:
                result.logits[seg.entry_index] = cpu[row]
