"""Start schedconf's scheduler recorder in every Python process of a vLLM deployment.

Python imports the first ``sitecustomize`` module on ``sys.path`` at start-up,
so putting this folder on ``PYTHONPATH`` (with the schedconf checkout that
holds it) loads it in the API server, the spawned engine-core process and its
workers alike, with no change to vLLM or to its virtual environment. Nothing
happens unless ``SCHEDCONF_RECORD`` names a folder: then an import hook wraps
vLLM's ``Scheduler`` when (and if) the process imports it, and only the
process whose engine core builds a scheduler writes a recording.

A ``sitecustomize`` this one shadows (a distribution's own) is still run.
"""

import os
import sys


def _run_shadowed() -> None:
    """Run the next ``sitecustomize.py`` on ``sys.path`` (the one this module hides), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in sys.path:
        path = os.path.join(os.path.abspath(folder or "."), "sitecustomize.py")
        if os.path.dirname(path) == here or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                code = compile(handle.read(), path, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": path})  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - never break the interpreter's start
            print(f"schedconf: the shadowed {path} failed: {exc}", file=sys.stderr)
        return


_run_shadowed()
if os.environ.get("SCHEDCONF_RECORD"):
    try:
        from schedconf.conformance.live.recorder import install

        install(os.environ["SCHEDCONF_RECORD"])
    except Exception as exc:  # noqa: BLE001 - a broken recorder must not stop the engine: say so loudly
        print(f"schedconf: the scheduler recorder could not be installed: {type(exc).__name__}: {exc}", file=sys.stderr)
