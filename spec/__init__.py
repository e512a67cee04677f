"""The executable specification: pure, deterministic models of vLLM's schedulers (no torch, no I/O).

Two models side by side over a shared vocabulary:

* ``v1/``: vLLM's v1 scheduler (0.33 core, older-release and async profiles);
* ``v0/``: vLLM 0.10.2's legacy scheduler (running / swapped / waiting);
* shared at this level: ``errors`` (typed errors with stable codes), ``hashing`` (block hashes),
  ``tokens`` (token ids and arrival times), ``ops`` (the operations the invariants are written
  in), ``output`` (the model runner's output and request outputs both schedulers use, and v1's
  ``SchedulerOutput``),
  ``sources`` (where each rule was read in vLLM), ``schedulers`` (picks the model by profile);
* ``symbolic/``: the Z3 encodings (the only place that may import z3).

Nothing here imports ``schedconf.conformance``, ``impl`` or torch (``symbolic`` may use the
trace writer to realise witnesses).
"""
