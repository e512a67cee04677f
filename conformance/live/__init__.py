"""Trace validation of a live vLLM engine: record what its scheduler did, check it against the model.

* :mod:`schedconf.conformance.live.recorder` runs INSIDE the engine's process. Loaded at
  interpreter start by ``boot/sitecustomize.py`` (put ``conformance/live/boot``
  and this checkout on ``PYTHONPATH`` and set ``SCHEDCONF_RECORD=DIR``), it
  wraps the methods of ``vllm.v1.core.sched.scheduler.Scheduler`` the engine
  core calls and writes one JSON line per call (the format is documented
  in that module).
* :mod:`schedconf.conformance.live.convert` turns a recording into an ordinary schedconf
  trace (header, ``add_request`` / ``abort`` / ``step`` / ``model_output``).
* :mod:`schedconf.conformance.live.check` replays that trace against the reference model
  (``strict`` when the recorded config and requests are within the model's
  scope, else the ``safety`` properties over the engine's own decisions).
* :mod:`schedconf.conformance.live.serve` (``schedconf live``) builds the engine's
  environment, writes a tiny seeded model, starts vLLM's OpenAI server with the
  recorder, sends a bounded load, stops everything and checks the recording.

The engine's code is never modified: the recorder attaches from outside.
"""
