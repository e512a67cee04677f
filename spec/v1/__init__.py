"""The executable model of vLLM's v1 scheduler (0.33 core; 0.32 / 0.11 and async profiles).

``scheduler`` is the step machine; ``request``, ``queues``, ``block_pool`` and ``kv_cache`` its
state; ``config`` and ``profiles`` what a release fixes; ``invariants`` (over ``view``) what must
hold after every call; ``stop``, ``stats`` and ``render`` the outputs. Imports only the shared
modules of ``schedconf.spec`` (never ``spec.v0``).
"""
