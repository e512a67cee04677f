"""The model's building blocks, the sampler and the drafter, against hand-derived facts."""

from __future__ import annotations

import math

import torch

from schedconf.impl.drafter import NgramDrafter
from schedconf.impl.model import BENCH_250M, TINY, LlamaModel, ModelConfig
from schedconf.impl.sampling import greedy, mask_stop_tokens


def test_weights_come_from_the_seed(tiny_model):
    again = LlamaModel(TINY)
    other = LlamaModel(ModelConfig(seed=1))
    assert torch.equal(again.embedding, tiny_model.embedding)
    assert torch.equal(again.layers[1]["down"], tiny_model.layers[1]["down"])
    assert not torch.equal(other.embedding, tiny_model.embedding)
    # float64 weights are the float32 draw widened exactly.
    f32 = LlamaModel(TINY, dtype=torch.float32)
    assert torch.equal(f32.lm_head.double(), tiny_model.lm_head)


def test_parameter_count_matches_the_tensors(tiny_model):
    m = tiny_model
    tensors = [m.embedding, m.final_norm, m.lm_head] + [t for layer in m.layers for t in layer.values()]
    assert sum(t.numel() for t in tensors) == TINY.num_params
    # The GPU bench model is "a few hundred million parameters".
    assert 200e6 < BENCH_250M.num_params < 300e6


def test_rms_norm_has_unit_rms(tiny_model):
    x = torch.randn(5, TINY.hidden_size, dtype=torch.float64) * 7
    y = tiny_model.rms_norm(x, torch.ones(TINY.hidden_size, dtype=torch.float64))
    assert torch.allclose(y.pow(2).mean(-1), torch.ones(5, dtype=torch.float64), atol=1e-6)


def test_rotary_depends_only_on_relative_position(tiny_model):
    q = torch.randn(1, 1, TINY.head_dim, dtype=torch.float64)
    k = torch.randn(1, 1, TINY.head_dim, dtype=torch.float64)

    def score(pq: int, pk: int) -> float:
        rq = tiny_model.rotary(q, torch.tensor([pq]))
        rk = tiny_model.rotary(k, torch.tensor([pk]))
        return float((rq * rk).sum())

    assert math.isclose(score(7, 3), score(107, 103), rel_tol=1e-9, abs_tol=1e-12)
    assert not math.isclose(score(7, 3), score(7, 4), rel_tol=1e-6)
    # Rotation keeps the norm.
    assert math.isclose(float(tiny_model.rotary(q, torch.tensor([55])).norm()), float(q.norm()), rel_tol=1e-12)


def test_dense_forward_is_causal(tiny_model):
    seq = [5, 9, 300, 41, 7, 7, 12]
    full = tiny_model.forward_dense(seq + [99, 100])
    prefix = tiny_model.forward_dense(seq)
    assert torch.allclose(full[: len(seq)], prefix, atol=1e-12, rtol=0)
    # A different earlier token changes later logits.
    assert not torch.allclose(tiny_model.forward_dense([6] + seq[1:])[-1], prefix[-1])


def test_token_ids_wrap_around_the_vocabulary(tiny_model):
    v = TINY.vocab_size
    assert torch.equal(tiny_model.forward_dense([3, v + 4]), tiny_model.forward_dense([3 + v, 4]))
    assert tiny_model.token_tensor([-1]).tolist() == [v - 1]


def test_greedy_takes_the_lowest_id_among_equal_maxima_and_reports_the_margin():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 0.5, 2.0, 1.5]], dtype=torch.float64)
    tokens, runner_up, margins = greedy(logits)
    assert tokens == [1, 2]
    assert runner_up == [2, 3]
    assert margins == [0.0, 0.5]


def test_stop_tokens_are_masked_inside_the_vocabulary_only():
    logits = torch.zeros(2, 4, dtype=torch.float64)
    mask_stop_tokens(logits, [(1, {2, 99})])
    assert logits[0].tolist() == [0, 0, 0, 0]
    assert logits[1].tolist() == [0, 0, float("-inf"), 0]


def test_ngram_drafter_by_hand():
    drafter = NgramDrafter(k=3, n_max=3, n_min=1)
    # ... 1 2 3 4 1 2: the 3-gram (4, 1, 2) never occurred before; the 2-gram
    # (1, 2) did, at position 0, followed by 3 4 1.
    assert drafter.propose("r", [1, 2, 3, 4, 1], [2], limit=8) == [3, 4, 1]
    # One more token, 3: (1, 2, 3) occurred at 0, followed by 4 1 2.
    assert drafter.propose("r", [], [3], limit=8) == [4, 1, 2]
    # The limit caps the proposal; no match gives nothing.
    assert drafter.propose("r", [], [4], limit=1) == [1]
    assert drafter.propose("s", [5, 6, 7], [8], limit=8) == []
