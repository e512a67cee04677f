"""The symbolic half of the invariants: Z3 backend, symbolic state, transitions, proofs, witnesses.

This package is the one place under ``spec/`` that may import Z3. It reuses
the invariants of ``spec/v1/invariants.py`` unchanged: :class:`~schedconf.spec.symbolic.z3ops.Z3Ops`
implements the operations protocol of ``spec/ops.py`` and
:class:`~schedconf.spec.symbolic.state.SymbolicView` offers the attribute and method
names of :class:`~schedconf.spec.v1.view.ConcreteView` over Z3 terms.

Modules:

* ``z3ops``: the Z3 operations backend.
* ``state``: the symbolic state (``R`` request slots, ``B`` usable blocks),
  its view, well-formedness and auxiliary lemmas, and the two bridges to the
  concrete model (scheduler -> values, Z3 model -> scheduler).
* ``transitions``: the model's transitions over symbolic states, each citing
  the ``spec/`` code it mirrors.
* ``proofs``: preservation proofs per transition and invariant, with a CLI
  (``python -m schedconf.spec.symbolic.proofs --bounds 4,8 --timeout 60``).
* ``drive``: runs the encoded transitions along a concrete scheduler's events
  (the drift guard).
* ``realise``: turns a Z3 state into a trace by a seeded workload search.
* ``witnesses``: Z3 queries for named corner cases, realised as traces
  (``python -m schedconf.spec.symbolic.witnesses --write``).
"""
