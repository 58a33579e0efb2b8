"""``glmlab`` command line: one subcommand per module, each with ``add_arguments`` and ``run``."""

from __future__ import annotations

import argparse
import importlib
import sys

from glmlab.extras import missing_extra

COMMANDS = {
    "init-checkpoint": "glmlab.commands.init_checkpoint",
    "generate": "glmlab.commands.generate",
    "parity": "glmlab.commands.parity",
    "tune": "glmlab.commands.tune",
    "bench": "glmlab.commands.bench",
    "serve": "glmlab.commands.serve",
    "budget": "glmlab.commands.budget",
    "dist": "glmlab.distributed.cli",
    "train": "glmlab.commands.train",
    "eval": "glmlab.commands.eval",
}
# Commands whose module could not be imported for a missing extra: name -> the error to show.
MISSING: dict[str, Exception] = {}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or with ``only`` just that command's: running one command imports
    only its own module (a broken or heavy package behind another command cannot stop it)."""
    parser = argparse.ArgumentParser(prog="glmlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            # A command whose module needs an extra stays listed and says what to install, so the
            # base install's other commands still work.
            err = missing_extra(e, needed_by=f"glmlab {name}")
            if err is None:
                raise
            sub.add_parser(name, help=f"(not installed: {err})")
            MISSING[name] = err
            continue
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    if argv and argv[0] in MISSING:  # before parsing: its flags are unknown without its module
        print(f"glmlab {argv[0]}: error: {MISSING[argv[0]]}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"glmlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        err = missing_extra(e)
        if err is None:
            raise
        print(f"glmlab {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
