"""The v0 stop checker (``engine/output_processor/stop_checker.py``, 0.10.2), after one appended token.

In this order:

1. fewer than ``min_tokens`` outputs: keep going (even past a length cap);
2. the EOS token, unless ``ignore_eos``: FINISHED_STOPPED;
3. one of ``stop_token_ids``: FINISHED_STOPPED with ``stop_reason`` = it;
4. (stop strings: need a tokenizer, not modelled)
5. ``get_len() >= max_model_len``: FINISHED_LENGTH_CAPPED;
6. ``output_len == max_tokens`` (equality): FINISHED_LENGTH_CAPPED.
"""

from __future__ import annotations

from schedconf.spec.v0.sequence import SequenceGroup, SequenceStatus


def maybe_stop_sequence(seq: SequenceGroup, max_model_len: int) -> None:
    """Set ``seq.status`` (and ``stop_reason``) when its last token stops it."""
    params = seq.sampling_params
    if seq.get_output_len() < params.min_tokens:
        return
    last = seq.output_token_ids[-1]
    if not params.ignore_eos and last == params.eos_token_id:
        seq.status = SequenceStatus.FINISHED_STOPPED
        return
    if last in params.stop_token_ids:
        seq.status = SequenceStatus.FINISHED_STOPPED
        seq.stop_reason = last
        return
    if seq.get_len() >= max_model_len:
        seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
        return
    if seq.get_output_len() == params.max_tokens:
        seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
