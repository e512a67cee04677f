"""impl/: our torch inference engine, checked against the spec (see impl/README.md).

Modules:

* ``scheduler``: the fast scheduler (vLLM 0.33/0.32 v1 rules, no torch);
* ``model``: a Llama-style decoder with seeded weights; ``dense``: the
  cache-free greedy oracle; ``sampling``: greedy choice and near ties;
* ``runner``: the paged KV cache and the batched forward pass; ``drafter``:
  n-gram drafts for speculative decoding; ``engine``: the engine loop;
* ``adapter``: the harness adapters (``impl``, ``impl-engine``);
  ``engine_check``: the lockstep whole-engine check; ``campaign``: seeded
  workloads; ``baselines``: the loops the engine bench compares with.

Only ``scheduler``, ``campaign`` and the ``impl`` adapter work without torch.
"""
