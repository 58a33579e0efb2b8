"""Speculative cycle timing: MTP chain vs DFlash2 block at the same verify width, per phase.

For each drafter the bench prefills ``--batch`` random prompts of ``--context`` tokens, runs
``--warmup`` + ``--cycles`` speculative cycles with **simulated acceptance** (random weights never
accept real drafts; the reference deployment's lengths by default: MTP718 7.37, DFlash2 block 8
7.03) and records
the mean wall time of each phase (draft / verify / commit / rest), the cycle time, the mean commit
length and ms per accepted token (cycle time / acceptance length, the reference deployment's cost
model), plus the
per-cycle phase times for timeline plots. One JSONL row per drafter goes to
``data/bench/spec[-TAG].jsonl`` with the machine, versions, backends and sizes; every row carries
``simulated: true``.

    python -m glmlab.bench.spec --preset tiny --device cpu
    python -m glmlab.bench.spec --preset slice:4 --device cuda --dtype bf16 --batch 32 --context 512

The tiny preset loads its cached checkpoint; ``slice:N`` builds random real-width weights directly
on the device (no multi-GB checkpoint written; ``--init`` overrides either choice). The DFlash2
draft is random too: its widths follow the target (``glmlab.speculative.dflash_io.draft_shape``),
``--draft-layers`` deep.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from glmlab import presets
from glmlab.bench.ops import machine, write_rows
from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.checkpoint.writer import init_random_
from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.config import ModelConfig
from glmlab.core import SamplingParams
from glmlab.engine.config import EngineConfig
from glmlab.engine.model_runner import load_model_for
from glmlab.model.backends import Backends
from glmlab.model.glm import GLM5Model
from glmlab.model.session import Session
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.cycle import PHASES, SpecDecoder
from glmlab.speculative.dflash import DFlashDraftModel
from glmlab.speculative.dflash_io import init_random_draft_, random_draft_config
from glmlab.speculative.factory import make_decoder
from glmlab.speculative.layout import SessionLayout
from glmlab.speculative.memory import spec_state_bytes
from glmlab.speculative.types import SpecRequest

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
REFERENCE_ACCEPT = {"mtp": 7.37, "dflash2": 7.03}  # the reference's acceptance lengths at width 8


def build_target(preset: str, device: str, dtype: torch.dtype, seed: int = 0,
                 init: str = "auto", fp8: str = "dequantize") -> GLM5Model:
    """A checkpoint directory, or a preset: checkpoint = the preset's cached checkpoint through
    the real loader; random = weights drawn on the device. ``auto`` picks checkpoint for tiny,
    random for real widths. ``fp8``: how block-FP8 checkpoint weights load (dequantize | keep)."""
    if Path(preset).is_dir() or init == "checkpoint" or (init == "auto" and preset == "tiny"):
        path = preset if Path(preset).is_dir() else preset_checkpoint(preset, seed=seed)
        name = {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
        return load_model_for(path, EngineConfig(device=device, dtype=name, fp8_weights=fp8))
    cfg = ModelConfig.from_hf(presets.preset(preset))
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build straight in the run dtype: no fp32 copy of the experts
    try:
        with torch.device(device):
            model = GLM5Model(cfg)
    finally:
        torch.set_default_dtype(default)
    return init_random_(model, seed).to_dtype(dtype).eval()


def random_draft(target: GLM5Model, block_size: int, num_layers: int,
                 seed: int = 0) -> DFlashDraftModel:
    cfg = random_draft_config(target.cfg, block_size=block_size, num_layers=num_layers)
    with torch.device(target.embed_tokens.weight.device):
        draft = DFlashDraftModel(cfg).to(target.dtype)
    return init_random_draft_(draft, seed).eval()


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 256), (n, length), generator=g).tolist()


def run_one(target: GLM5Model, args, algorithm: str, kv_dtype: str = "bf16") -> dict:
    width = args.width
    accept_len = args.accept.get(algorithm, REFERENCE_ACCEPT[algorithm])
    spec = SpecConfig(algorithm=algorithm, num_steps=width - 1, block_size=width,
                      commit=args.commit, draft_kv_dtype="bf16" if kv_dtype == "-" else kv_dtype,
                      simulate_accept_len=accept_len, simulate_mode=args.accept_mode)
    session = Session(target, args.batch, args.context + (args.warmup + args.cycles + 1) * width)
    draft = None
    if algorithm == "dflash2":
        layers = args.draft_layers or (5 if target.cfg.hidden_size >= 1024 else 2)
        draft = random_draft(target, width, layers, args.seed)
    dec = make_decoder(target, SessionLayout(session), spec, draft=draft, seed=args.seed)
    params = SamplingParams(max_new_tokens=10**6, ignore_eos=True)
    reqs = [SpecRequest(row=i, params=params) for i in range(args.batch)]
    dec.start(reqs, _prompts(args.batch, args.context, target.cfg.vocab_size, args.seed))
    for _ in range(args.warmup):
        dec.step(reqs)
    dec.stats.clear()
    for _ in range(args.cycles):
        dec.step(reqs)
    row = _row(dec, spec, args)
    if draft is not None:
        c = draft.cfg
        row |= {"draft_kv_dtype": kv_dtype, "draft_layers": c.num_layers,
                "draft_heads": [c.num_heads, c.num_kv_heads, c.head_dim],
                "draft_kv_bytes_per_token": dec.drafter.kv.layout.bytes_per_token,
                "target_layer_ids": list(c.target_layer_ids)}
    return row


def _row(dec: SpecDecoder, spec: SpecConfig, args) -> dict:
    stats = dec.stats
    phase_ms = {p: 1e3 * sum(s.phase_s[p] for s in stats) / len(stats) for p in PHASES}
    cycle_ms = sum(phase_ms.values())
    commit = sum(s.mean_commit for s in stats) / len(stats)
    return {
        "bench": "spec_cycle", "config": spec.name, "algorithm": spec.algorithm, "simulated": True,
        "simulated_accept_len": spec.simulate_accept_len, "accept_mode": spec.simulate_mode,
        "preset": args.preset, "device": args.device, "dtype": args.dtype,
        "backends": dataclass_as_dict(args.backends), "commit_mode": args.commit,
        "batch": args.batch, "context": args.context, "verify_width": args.width,
        "cycles": len(stats), "torch_threads": torch.get_num_threads(),
        "phase_ms": phase_ms, "cycle_ms": cycle_ms, "accept_len": commit,
        "ms_per_accepted_token": cycle_ms / commit,
        "output_tok_per_s": args.batch * commit / (cycle_ms / 1e3),
        "per_cycle_ms": [{p: 1e3 * s.phase_s[p] for p in PHASES} for s in stats],
        "spec_state_bytes_per_slot": spec_state_bytes(dec.model.cfg, args.width,
                                                      dec.model.dtype, torch.bfloat16),
    }


def dataclass_as_dict(obj) -> dict:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="tiny", help="tiny, slice:N or a checkpoint directory")
    p.add_argument("--fp8-weights", choices=("dequantize", "keep"), default="dequantize",
                   help="block-FP8 checkpoint weights: dequantise at load or keep for FP8 GEMMs")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=None,
                   help="default: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=8, help="verify width (MTP steps + 1 = block)")
    p.add_argument("--cycles", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--passes", type=int, default=1,
                   help="timed passes per config; only the last is reported (2 on a GPU)")
    p.add_argument("--algorithms", default="mtp,dflash2")
    p.add_argument("--draft-kv", default="bf16,fp8", help="DFlash2 draft KV dtypes to run")
    p.add_argument("--draft-layers", type=int, default=None, help="default 5 at real width, else 2")
    p.add_argument("--accept", default="", help="e.g. mtp=7.37,dflash2=7.03 "
                   "(default: the reference deployment's)")
    p.add_argument("--accept-mode", choices=("fixed", "sampled"), default="fixed")
    p.add_argument("--commit", choices=("replay", "snapshot"), default="replay")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--init", choices=("auto", "checkpoint", "random"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="data/bench")
    p.add_argument("--tag", default="")
    p.add_argument("--quiet", dest="verbose", action="store_false")
    add_dataclass_args(p, Backends, prefix="backends-")
    args = p.parse_args(argv)
    args.backends = dataclass_from_args(Backends, args, prefix="backends-")
    args.dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    args.accept = {k: float(v) for k, v in (kv.split("=") for kv in args.accept.split(",") if kv)}
    return args


def run(args: argparse.Namespace) -> list[dict]:
    """Every requested drafter (and draft-KV dtype) on one target; returns the rows."""
    if args.threads:
        torch.set_num_threads(args.threads)
    target = build_target(args.preset, args.device, _DTYPES[args.dtype], args.seed, args.init,
                          args.fp8_weights)
    target.use_backends(args.backends)
    rows = []
    for algorithm in args.algorithms.split(","):
        kv_dtypes = args.draft_kv.split(",") if algorithm == "dflash2" else ["-"]
        for kv_dtype in kv_dtypes:
            # NOTE: the draft's context grows every cycle and some JIT kernels compile per shape,
            # so a first pass over the same shapes is thrown away (H200 2026-11-30: 60 vs 13 ms).
            for _ in range(args.passes - 1):
                run_one(target, args, algorithm, kv_dtype)
            row = run_one(target, args, algorithm, kv_dtype)
            rows.append(row)
            if args.verbose:
                print(describe(row))
    return rows


def describe(row: dict) -> str:
    phases = " ".join(f"{p} {row['phase_ms'][p]:.2f}" for p in PHASES)
    kv = f" draft-kv {row['draft_kv_dtype']}" if "draft_kv_dtype" in row else ""
    return (f"{row['config']}{kv} [simulated accept {row['accept_len']:.2f}] ms: {phases} "
            f"| cycle {row['cycle_ms']:.2f} | {row['ms_per_accepted_token']:.2f} ms/token")


def measure(**options) -> list[dict]:
    """``run`` with keyword options (``batch=4`` -> ``--batch 4``); nothing is written."""
    argv = []
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return run(parse_args(argv + ["--quiet"]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = run(args)
    name = "spec" + (f"-{args.tag}" if args.tag else "")
    path = write_rows(rows, Path(args.out), name, warmup=f"{args.warmup} cycles",
                      repetitions=f"{args.cycles} cycles x {args.passes} passes (last reported)")
    print(f"{len(rows)} rows -> {path}")
    print(json.dumps({"machine": machine()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
