"""glmlab tune moe: tune the MoE grouped-GEMM tiles on real routing and write the config tables.

Routing samples come from a model run (``--model tiny`` on a CPU, ``--model slice:4`` on an H200:
real widths, one 288-expert MoE layer; a preset is built in memory with the same random weights
its checkpoint would hold, a directory is loaded) or from a file (``--samples``). ``--experts``
lists the rank-local expert counts to tune: 288 is the whole layer, 72 the first rank of EP4
(other ranks' experts dropped from each route). Writes the up/down JSON tables (``--out``) and
one report row per (E, M) to ``--report`` (JSONL, with the machine). The tuning itself is
``glmlab.kernels.moe.tuner``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from glmlab.bench.routing import capture_routing
from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.kernels.moe.configs import CONFIG_DIR, MoEShape, merge_tables, read_table, save_table
from glmlab.kernels.moe.fused_moe import device_name
from glmlab.kernels.moe.samples import (
    RoutingSamples,
    local_ids,
    routes_for_m,
    uniform_samples,
)
from glmlab.kernels.moe.timing import timer_for
from glmlab.kernels.moe.tuner import SPACES, Problem, TuneOptions, tune

HELP = ("tune kernel tile configs (moe: block-FP8 grouped GEMMs on real routing samples; "
        "linear-fp8: the block-FP8 dense GEMM at a model's shapes)")
GLM_TOKENS = (1, 16, 64, 128, 256, 768, 1024, 4096, 8192)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="target", required=True)
    moe = sub.add_parser("moe", help="routed-expert GEMMs", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    src = moe.add_mutually_exclusive_group(required=True)
    src.add_argument("--samples", help="routing-sample file (safetensors, NOTES.md), or "
                     "uniform:E:A for random-gating routes over E experts, top-A")
    src.add_argument("--model", help="capture from a run: a preset (tiny, slice:N) or a directory")
    moe.add_argument("--capture-out", help="also save the captured samples here")
    moe.add_argument("--prompts", type=int, default=8, help="sequences in the capture run")
    moe.add_argument("--chunk", type=int, default=128, help="prefill tokens per sequence and step")
    moe.add_argument("--prefill-steps", type=int, default=4)
    moe.add_argument("--decode-steps", type=int, default=4)
    moe.add_argument("--experts", help="comma-separated local expert counts (default: all)")
    moe.add_argument("--hidden", type=int, help="D (default: the model's, else 4096)")
    moe.add_argument("--intermediate", type=int, help="I (default: the model's, else 2048)")
    moe.add_argument("--space", choices=sorted(SPACES), default="reduced")
    moe.add_argument("--heldout-fraction", type=float, default=0.25)
    moe.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    moe.add_argument("--out", default=str(CONFIG_DIR), help="config table directory")
    moe.add_argument("--update", action="store_true",
                     help="keep the other M entries of an existing table in --out")
    moe.add_argument("--report", default="data/bench/moe_tune.jsonl")
    moe.add_argument("--no-progress", action="store_true")
    add_dataclass_args(moe, TuneOptions, defaults={"tokens": GLM_TOKENS})
    from glmlab.commands import tune_linear_fp8

    tune_linear_fp8.add_parser(sub)


def _build_model(spec: str, device: str):
    from glmlab import presets
    from glmlab.checkpoint.loader import load_model
    from glmlab.checkpoint.writer import init_random_
    from glmlab.config import ModelConfig
    from glmlab.model.glm import GLM5Model

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if Path(spec).is_dir():
        return load_model(spec, dtype=dtype, device=device, with_mtp=False)
    cfg = ModelConfig.from_hf(presets.preset(spec))
    with torch.device(device):
        model = GLM5Model(cfg, with_mtp=False)
    return init_random_(model, seed=0).to_dtype(dtype).eval()


def capture(args) -> RoutingSamples:
    """Chunked prefill of ``--prompts`` random sequences, then greedy decode steps."""
    model = _build_model(args.model, args.device)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = min(model.cfg.vocab_size, 256 if args.model == "tiny" else model.cfg.vocab_size)
    total = args.chunk * args.prefill_steps
    prompts = [torch.randint(0, vocab, (total,), generator=gen).tolist()
               for _ in range(args.prompts)]
    where = device_name(torch.device(args.device))
    source = (f"model={args.model} prompts={args.prompts}x{total} random ids, prefill chunk "
              f"{args.chunk}, decode {args.decode_steps}, device={where}")
    samples = capture_routing(model, prompts, args.decode_steps, source, chunk=args.chunk)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the tuner's weights and buffers come next
    return samples


def run(args: argparse.Namespace) -> int:
    if getattr(args, "_tune", None) is not None:  # another target than moe
        return args._tune(args)
    from glmlab.bench.ops import write_rows

    samples = _read_samples(args.samples) if args.samples else capture(args)
    if args.capture_out and not args.samples:
        samples.save(args.capture_out)
    train, held = samples.split(args.heldout_fraction)
    dims = _dims(args)
    options = dataclass_from_args(TuneOptions, args)
    device = torch.device(args.device)
    experts = [int(e) for e in args.experts.split(",")] if args.experts else [samples.num_experts]
    full = Problem.random(MoEShape(max(experts), samples.top_k, *dims), device, options.seed)
    timer, written = timer_for(device), []
    for e in experts:
        if samples.num_experts % e:
            raise ValueError(f"--experts {e} does not divide the samples' {samples.num_experts}")

        def routes(m, count, which, e=e):
            pool = train if which == "train" else held
            seed = options.seed + (0 if which == "train" else 1000)
            return [local_ids(r, 0, e) for r in routes_for_m(pool, m, count, seed)]

        result = tune(full.narrow(e), routes, options, SPACES[args.space], timer,
                      progress=not args.no_progress)
        result.table.meta.update(samples=samples.source, space=args.space,
                                 routes=options.routes, heldout_routes=options.heldout_routes,
                                 skipped=result.skipped, triton=_triton_version())
        shape = MoEShape(e, samples.top_k, *dims)
        table = result.table
        if args.update:
            table = merge_tables(read_table(shape, device_name(device), Path(args.out)), table)
        written += save_table(table, shape, device_name(device), Path(args.out))
        rows = [{**r, "space": args.space, "samples": samples.source,
                 "device_name": device_name(device)} for r in result.rows]
        if args.report:  # per E, so a run cut short keeps what it finished
            path = Path(args.report)
            write_rows(rows, path.parent, path.stem, warmup="graph capture + 2 replays",
                       repetitions=getattr(timer, "replays", None))
        for r in rows:
            print(json.dumps({k: r[k] for k in ("E", "M", "up", "down", "speedup_train",
                                               "speedup_heldout", "heldout_gap",
                                               "numerics_relerr")}), flush=True)
    print(json.dumps({"configs": [str(p) for p in written], "report": args.report}))
    return 0


def _read_samples(spec: str) -> RoutingSamples:
    if spec.startswith("uniform:"):
        _, e, a = spec.split(":")
        return uniform_samples(int(e), int(a), rows=8192, count=8)
    return RoutingSamples.load(spec)


def _dims(args) -> tuple[int, int]:
    """(D, I): the flags, else the capture model's config, else GLM-5.3-Flash's."""
    if args.model and args.hidden is None:
        from glmlab import presets
        from glmlab.config import ModelConfig

        spec = args.model if Path(args.model).is_dir() else presets.preset(args.model)
        cfg = ModelConfig.from_hf(spec)
        return cfg.hidden_size, cfg.moe.intermediate_size
    return args.hidden or 4096, args.intermediate or 2048


def _triton_version() -> str:
    import triton

    return triton.__version__
