"""``glmlab`` command line: one subcommand per module, each with ``add_arguments`` and ``run``."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "init-checkpoint": "glmlab.commands.init_checkpoint",
    "generate": "glmlab.commands.generate",
    "parity": "glmlab.commands.parity",
    "tune": "glmlab.commands.tune",
    "bench": "glmlab.commands.bench",
    "serve": "glmlab.commands.serve",
    "budget": "glmlab.commands.budget",
    "dist": "glmlab.distributed.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glmlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"glmlab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
