"""impl/: our torch inference engine, checked against the spec (see impl/README.md).

Modules:

* ``scheduler``: the fast scheduler (vLLM 0.33/0.32 v1 rules, no torch);
* ``model``: a Llama-style decoder with seeded weights; ``dense``: the
  cache-free greedy oracle; ``sampling``: greedy choice and near ties;
* ``runner``: the paged KV cache and the batched forward pass; ``drafter``:
  n-gram drafts for speculative decoding; ``engine``: the engine loop;
* ``baselines``: the loops the engine bench compares with;
* the v0 path (profile ``vllm-0.10``, vLLM 0.10.2's legacy scheduler):
  ``v0_blocks`` (naive and prefix-caching allocators, LRU evictor),
  ``v0_scheduler`` (``FastV0Scheduler``), ``v0_runner`` (device and host KV
  caches, swap-in/out/copy, the forward), ``v0_engine`` (``V0Engine``).

``scheduler``, ``v0_blocks``, ``v0_scheduler`` and ``drafter`` need no torch. The engine does not know it is being
checked: nothing here imports ``conformance``. Its adapters (``--sut impl``,
``--sut impl-engine``) are ``conformance/adapters/impl.py``, the lockstep
whole-engine check is ``gpu_checks/engine_check.py`` and the seeded workloads
first written for it are ``conformance/workloads/tight_workloads.py``.
"""
