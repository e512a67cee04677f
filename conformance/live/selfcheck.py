"""``python -m schedconf.conformance.live.selfcheck --self-check --expect-version V``: is this a live vLLM environment?

Runs in ``.venvs/live-vllm-VERSION`` (the env builder's step 3): imports vLLM's
OpenAI server, its engine core and scheduler, ``transformers`` and
``tokenizers`` (what :mod:`schedconf.conformance.live.model` needs) and the recorder,
checks the version and prints ``self-check ok: ...``. Loads no model.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m schedconf.conformance.live.selfcheck")
    parser.add_argument("--self-check", action="store_true", required=True)
    parser.add_argument("--expect-version", default=None)
    args = parser.parse_args(argv)
    import tokenizers
    import transformers
    import vllm
    import vllm.entrypoints.openai.api_server  # noqa: F401 - the server imports
    import vllm.v1.engine.core  # noqa: F401
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401

    import schedconf.conformance.live.recorder  # noqa: F401

    if args.expect_version and vllm.__version__ != args.expect_version:
        print(f"self-check failed: vLLM {vllm.__version__}, expected {args.expect_version}", file=sys.stderr)
        return 1
    print(
        f"self-check ok: vLLM {vllm.__version__} (OpenAI server, engine core), transformers "
        f"{transformers.__version__}, tokenizers {tokenizers.__version__}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
