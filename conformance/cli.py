"""The ``schedconf`` command line (also ``python -m conformance``)."""

from __future__ import annotations

import argparse
import sys

from spec.render import StepTable


def cmd_demo(args: argparse.Namespace) -> int:
    """Run a built-in example on the reference model and print its step table."""
    from conformance.examples import EXAMPLES
    from conformance.workload import run_workload

    workload = EXAMPLES[args.example]()
    trace = run_workload(workload, check=True)
    table = StepTable()
    pending = None
    for event in trace.events:
        if event["kind"] == "step":
            pending = event
        elif event["kind"] == "model_output" and pending is not None:
            table.add_canonical_step(pending["step"], pending["expect"], event["expect"]["outputs"],
                                     pending.get("observe", {}).get("num_free_blocks", -1))
    print(f"example {args.example!r}: {workload.description}")
    print(f"config: {workload.config.to_dict()}")
    print()
    print(table.render())
    print()
    print("every invariant held after each of the", len(trace.events), "events")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="schedconf",
        description="Executable specification and conformance suite for LLM-serving schedulers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a built-in example on the reference model and print its step table")
    demo.add_argument("--example", default="mixed", help="which built-in example (default: mixed)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
