"""glmlab bench: the reference deployment's serving benchmark against a running server
(glmlab serve or SGLang)."""

from __future__ import annotations

import argparse

from glmlab.bench.serving import BenchConfig, main_sync
from glmlab.cliargs import add_dataclass_args, dataclass_from_args

HELP = ("load a server with random or generated-shared-prefix requests; report throughput, TTFT, "
        "TPOT, ITL, latency and cached tokens (JSONL with --output-file); SLO search with "
        "--slo-ttft-ms/--slo-tpot-ms")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dataclass_args(p, BenchConfig)


def run(args: argparse.Namespace) -> int:
    rows = main_sync(dataclass_from_args(BenchConfig, args))
    failed = rows[-1].get("failed", 0) if rows else 1
    return 0 if not failed else 1
