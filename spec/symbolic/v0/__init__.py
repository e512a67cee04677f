"""The symbolic half of the v0 model (vLLM 0.10.2's legacy scheduler, profile ``vllm-0.10``).

Built like the v1 package (``spec/symbolic/``) and reusing its Z3 backend
(``spec/symbolic/z3ops.py``): one :class:`~schedconf.spec.symbolic.v0.state.State`
class holds Python values or Z3 terms, the transitions compute on both, the
invariants are written once over a view/ops protocol and evaluated on the
model (through the state read from it) and through Z3.

Scope (fixed, see ``transitions.py``): ``_schedule_default`` (chunked
prefill off), FCFS or priority (``_schedule_priority_preemption``, recompute
preemption only), the naive block allocator (prefix caching off), one
sequence per group, no LoRA / prompt embeds / lookahead, watermark 0 (fewer
than 100 GPU blocks), preemption mode RECOMPUTE or SWAP (a symbolic switch),
the stop check abstracted to "stop token or not" with ``min_tokens = 0``.

Modules:

* ``state``: shape (``R`` request slots, ``B`` GPU blocks, ``C`` CPU blocks),
  the state, its view, lemmas, canonical form;
* ``invariants``: the v0 safety rules this encoding proves, ``inv_<name>(s, o)``;
* ``model_view``: the model's own rules (``spec/v0/invariants.py``) over a
  symbolic state, assumed and proved too with ``--model-invariants``;
* ``transitions``: the v0 transitions, each citing the ``spec/v0`` code and
  the vLLM 0.10.2 code it mirrors;
* ``proofs``: preservation proofs, CLI ``python -m schedconf.spec.symbolic.v0.proofs --bounds 4,8 [--cpu-blocks 8]``;
* ``bridge``: reading a ``schedconf.spec.v0`` scheduler into a state;
* ``drive``: runs the encoded transitions along the model's events (drift guard);
* ``witnesses``: Z3 queries for named corner cases, realised as v0 traces.
"""
