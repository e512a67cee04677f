"""A small Llama-style decoder with weights generated from a seed (no downloads).

Architecture (Llama 2/3 family): token embedding; ``num_layers`` blocks of
RMSNorm -> grouped-query attention with rotary positions (rotate-half form,
``num_kv_heads`` key/value heads shared by ``num_heads // num_kv_heads`` query
heads each) -> residual, RMSNorm -> SwiGLU MLP -> residual; a final RMSNorm
and an untied LM head. Greedy decoding only.

Rules:

* Token ids are reduced modulo ``vocab_size`` before the embedding lookup, so
  any non-negative id (trace prompts use ids in the thousands) is a valid
  input; sampled ids are always in ``[0, vocab_size)``. Draft placeholders
  (``-1``) map to ``vocab_size - 1``; their positions are always rejected.
* Weights are drawn in float32 from ``torch.Generator().manual_seed(seed)`` on
  the CPU, in a fixed order, then cast: the same seed gives the same model on
  every device, and the float64 model is exactly the float32 draw widened.
* The model is split into the pieces an engine needs (``embed``, per-layer
  ``qkv`` and ``finish_layer``, ``logits``) so that the paged runner can supply
  its own attention; ``forward_dense`` is the plain, unbatched, cache-free
  forward with a causal mask over the whole sequence, the oracle everything
  else is checked against.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the decoder; ``seed`` picks the weights."""

    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    max_position: int = 8192
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary pairs)")

    @property
    def num_params(self) -> int:
        """Parameter count (embedding and LM head included)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return 2 * self.vocab_size * h + self.num_layers * (attn + mlp + 2 * h) + h

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


TINY = ModelConfig()
"""CPU tests and the CPU bench: 2 layers, hidden 64, vocab 512 (about 0.14 M parameters)."""

SMALL = ModelConfig(
    vocab_size=2048,
    hidden_size=256,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=688,
    seed=1,
)
"""The GPU corpus check: about 3.8 M parameters, still cheap in float64."""

BENCH_250M = ModelConfig(
    vocab_size=32000,
    hidden_size=1024,
    num_layers=16,
    num_heads=16,
    num_kv_heads=4,
    head_dim=64,
    intermediate_size=2816,
    seed=2,
)
"""The GPU throughput bench: about 246 M parameters."""

MODEL_CONFIGS = {"tiny": TINY, "small": SMALL, "bench-250m": BENCH_250M}

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


class LlamaModel:
    """The decoder's weights on one device in one dtype, and its building blocks."""

    def __init__(
        self, config: ModelConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        c = config
        gen = torch.Generator(device="cpu").manual_seed(c.seed)

        def draw(rows: int, cols: int, std: float) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=gen, dtype=torch.float32) * std
            return w.to(device=self.device, dtype=dtype)

        def norm_weight(size: int) -> torch.Tensor:
            w = 1.0 + 0.1 * torch.randn(size, generator=gen, dtype=torch.float32)
            return w.to(device=self.device, dtype=dtype)

        h, d = c.hidden_size, c.head_dim
        self.q_size = c.num_heads * d
        self.kv_size = c.num_kv_heads * d
        self.embedding = draw(c.vocab_size, h, 1.0)
        self.layers: list[dict[str, torch.Tensor]] = []
        for _ in range(c.num_layers):
            self.layers.append(
                {
                    "attn_norm": norm_weight(h),
                    "qkv": draw(self.q_size + 2 * self.kv_size, h, 1.0 / math.sqrt(h)),
                    "o": draw(h, self.q_size, 1.0 / math.sqrt(self.q_size)),
                    "mlp_norm": norm_weight(h),
                    "gate_up": draw(2 * c.intermediate_size, h, 1.0 / math.sqrt(h)),
                    "down": draw(h, c.intermediate_size, 1.0 / math.sqrt(c.intermediate_size)),
                }
            )
        self.final_norm = norm_weight(h)
        self.lm_head = draw(c.vocab_size, h, 2.0 / math.sqrt(h))
        # Rotary tables, computed in float64 and cast once: angle = pos * theta^(-2i/d).
        inv_freq = c.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = torch.arange(c.max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.cos = angles.cos().to(device=self.device, dtype=dtype)
        self.sin = angles.sin().to(device=self.device, dtype=dtype)
        self.scale = 1.0 / math.sqrt(d)

    # ------------------------------------------------------------------ pieces

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.rms_eps) * weight

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos/sin rows of ``positions``, shaped to broadcast over heads ([T, 1, d/2])."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    def rotary(self, x: torch.Tensor, positions: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotate pairs ``(x_i, x_{i+d/2})`` by ``pos * theta^(-2i/d)``; ``x`` is [T, heads, d].

        ``positions`` may be the positions or their ``rope()`` rows (computed once per batch).
        """
        cos, sin = self.rope(positions) if isinstance(positions, torch.Tensor) else positions
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden] of ids already reduced to ``[0, vocab_size)``."""
        return self.embedding[token_ids]

    def qkv(
        self,
        layer: int,
        hidden: torch.Tensor,
        positions: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [T, H, d] and keys [T, KVH, d] (rotated), values [T, KVH, d] of one layer."""
        w = self.layers[layer]
        c = self.config
        x = self.rms_norm(hidden, w["attn_norm"])
        qkv = x @ w["qkv"].T
        q = qkv[:, : self.q_size].view(-1, c.num_heads, c.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(-1, c.num_kv_heads, c.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(-1, c.num_kv_heads, c.head_dim)
        return self.rotary(q, positions), self.rotary(k, positions), v

    def finish_layer(self, layer: int, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection and residual, then the SwiGLU MLP and residual; ``attn`` is [T, H*d]."""
        w = self.layers[layer]
        hidden = hidden + attn @ w["o"].T
        x = self.rms_norm(hidden, w["mlp_norm"])
        gate, up = (x @ w["gate_up"].T).chunk(2, dim=-1)
        return hidden + (torch.nn.functional.silu(gate) * up) @ w["down"].T

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: [S, hidden] -> [S, vocab]."""
        return self.rms_norm(hidden, self.final_norm) @ self.lm_head.T

    def token_tensor(self, token_ids: list[int]) -> torch.Tensor:
        """Ids reduced modulo the vocabulary, as a device tensor."""
        v = self.config.vocab_size
        return torch.tensor([t % v for t in token_ids], dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ the oracle

    @torch.inference_mode()
    def forward_dense(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [T, vocab] of one sequence: no cache, no batching, a full causal mask."""
        c = self.config
        ids = self.token_tensor(token_ids)
        t = ids.shape[0]
        positions = self.rope(torch.arange(t, device=self.device))
        hidden = self.embed(ids)
        causal = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()
        group = c.num_heads // c.num_kv_heads
        for layer in range(c.num_layers):
            q, k, v = self.qkv(layer, hidden, positions)
            k = k.repeat_interleave(group, dim=1)  # [T, H, d]
            v = v.repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, k) * self.scale
            scores = scores.masked_fill(~causal, float("-inf"))
            attn = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
            hidden = self.finish_layer(layer, hidden, attn.reshape(t, -1))
        return self.logits(hidden)
