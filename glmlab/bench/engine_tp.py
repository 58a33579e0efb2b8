"""Decode and prefill throughput of a TP/EP engine on N local ranks, rung by rung, as JSONL.

    python -m glmlab.bench.engine_tp --ranks 2 --preset tiny --num-prompts 8 --input-len 200 \\
        --output-len 16 --shared-prefix-ratio 0.9 --rungs '[{"name": "base"}]'
    scripts/h200x4_decode_ladder.sh     # the reference deployment's decode ladder at TP4/EP4, full
    size

Every rank builds its shard once (``--model DIR``: load + ``apply_tp``; ``--preset NAME``: the
random checkpoint drawn in place by ``random_tp_model``, no disk), then runs each rung: an engine
around the shard (``EngineConfig`` fields from the rung) driven closed-loop with ``concurrency``
requests in flight (0: the running-request limit + 4, just above it, as the reference deployment
sets its
client). Every rank runs the same program (``glmlab.distributed.engine_tp``); rank 0 takes the
times and the ranks' outputs are checked equal at the end. Modes:

- ``mixed``: one engine prefills and decodes. With ``radix=kv_and_state`` a shared prefix is
  computed once (the warm-up request) and each request computes only its own tail.
- ``pd``: a prefill engine (``prefill_engine`` options, kv_and_state) hands each request to a
  decode engine (``engine`` options) through ``LocalPD``: the reference deployment's decode
  instance, with its
  own radix mode. Requests enter as the decode engine has room for them (concurrency = its
  limit). Imported requests decode without speculation (the drafter never saw their prompt),
  so speculative rungs run in ``mixed`` mode.

A row: output/input tokens/s over the run, mean TPOT (per request, first token excluded) and
TTFT, the running-request limit and the median running count, the pools per GPU, speculative
cycle statistics, the rung's ``reference`` figures (the published deployment's) copied beside ours.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from glmlab import presets
from glmlab.bench.ops import write_rows
from glmlab.cache.budget import GIB
from glmlab.core import SamplingParams
from glmlab.distributed.engine_tp import build_tp_engine, digest, same_on_all_ranks
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups, launch
from glmlab.distributed.random_shard import random_tp_model
from glmlab.distributed.tp import apply_tp
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.engine.local_pd import LocalPD
from glmlab.engine.model_runner import load_model_for
from glmlab.model.backends import Backends
from glmlab.model.glm import GLM5Model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Workload:
    num_prompts: int = 16
    input_len: int = 256
    output_len: int = 16
    shared_prefix_ratio: float = 0.0  # 0.999: the reference deployment's decode workload
    concurrency: int = 0  # 0: the running-request limit + 4
    seed: int = 0

    def prompts(self, vocab_size: int, n: int, offset: int) -> list[list[int]]:
        """``n`` prompts sharing the same prefix; their own tails drawn from ``seed + offset``."""
        shared = int(self.input_len * self.shared_prefix_ratio)
        prefix = torch.randint(0, vocab_size, (shared,),
                               generator=torch.Generator().manual_seed(self.seed)).tolist()
        gen = torch.Generator().manual_seed(self.seed + 1 + offset)
        return [prefix + torch.randint(0, vocab_size, (self.input_len - shared,),
                                       generator=gen).tolist() for _ in range(n)]


@dataclass(frozen=True)
class Rung:
    name: str
    engine: dict = field(default_factory=dict)  # EngineConfig fields
    mode: str = "mixed"  # mixed | pd
    prefill_engine: dict = field(default_factory=dict)  # pd: the prefill engine's fields
    reference: dict = field(default_factory=dict)  # the reference deployment's figures here


@dataclass(frozen=True)
class TPBenchConfig:
    layout: ParallelLayout
    rungs: tuple[Rung, ...]
    workload: Workload
    model: str = ""  # a checkpoint directory ...
    preset: str = "tiny"  # ... or a preset drawn in place with random weights
    fp8: bool = False  # the preset's FP8 layout
    fp8_weights: str = "keep"  # keep | dequantize
    weight_seed: int = 0
    dtype: str = "fp32"
    device: str = "cpu"
    cpu_threads: int = 0


def engine_config(bench: TPBenchConfig, options: dict) -> EngineConfig:
    options = dict(options)
    if isinstance(options.get("backends"), dict):
        options["backends"] = Backends(**options["backends"])
    return EngineConfig(device=_device(bench), dtype=bench.dtype, **options)


def _device(bench: TPBenchConfig) -> str:
    return f"cuda:{torch.cuda.current_device()}" if bench.device.startswith("cuda") else "cpu"


def build_shard(bench: TPBenchConfig, groups: ProcessGroups) -> GLM5Model:
    dtype, device = DTYPES[bench.dtype], _device(bench)
    if bench.model:
        cfg = engine_config(bench, {"fp8_weights": bench.fp8_weights})
        return apply_tp(load_model_for(bench.model, cfg), groups)
    config = presets.preset(bench.preset)
    if not bench.fp8:
        config.pop("quantization_config", None)
    return random_tp_model(config, groups, seed=bench.weight_seed, fp8=bench.fp8,
                           fp8_mode=bench.fp8_weights, dtype=dtype, device=device)


# ------------------------------------------------------------------------------ the loop
@dataclass
class Run:
    """What the closed loop saw: per request, (time, tokens) of each output event."""

    added: dict[str, float] = field(default_factory=dict)
    events: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    running: list[int] = field(default_factory=list)
    outputs: list[tuple] = field(default_factory=list)
    steps: int = 0
    start: float = 0.0
    end: float = 0.0

    def record(self, outs, running: int) -> None:
        now = time.perf_counter()
        for o in outs:
            if o.new_token_ids:
                self.events.setdefault(o.rid, []).append((now, len(o.new_token_ids)))
        self.running.append(running)
        self.outputs.append(digest(outs))
        self.steps += 1


def run_mixed(engine: Engine, prompts: list[list[int]], params: SamplingParams,
              concurrency: int) -> Run:
    run, todo, live = Run(start=time.perf_counter()), deque(prompts), set()
    while todo or engine.has_work:
        while todo and len(live) < concurrency:
            rid = engine.add_request(todo.popleft(), params)
            run.added[rid] = time.perf_counter()
            live.add(rid)
        outs = engine.step()
        run.record(outs, engine.stats().running)
        live -= {o.rid for o in outs if o.finished}
    run.end = time.perf_counter()
    return run


def run_pd(pd: LocalPD, prompts: list[list[int]], params: SamplingParams,
           concurrency: int) -> Run:
    run, todo, live = Run(start=time.perf_counter()), deque(prompts), set()
    while todo or pd.decode.has_work:
        # at most what the prefill engine runs at once: a hand-off batch is prefilled whole
        # before any of it moves, and held requests keep their state slots until then
        room = min(concurrency - len(live), len(todo), pd.prefill.budget.max_running_requests)
        if room > 0:
            start = time.perf_counter()
            handoffs = pd.submit([todo.popleft() for _ in range(room)], params)
            now = time.perf_counter()
            for h in handoffs:  # the first token came from the prefill engine
                run.added[h.rid] = start
                run.events[h.rid] = [(now, 1)]
                live.add(h.rid)
        outs = pd.decode.step()
        run.record(outs, pd.decode.stats().running)
        live -= {o.rid for o in outs if o.finished}
    run.end = time.perf_counter()
    return run


def summarize(run: Run, num_prompt_tokens: int) -> dict:
    wall = run.end - run.start
    out_tokens = sum(n for ev in run.events.values() for _, n in ev)
    tpot, ttft = [], []
    for rid, ev in run.events.items():
        ttft.append(ev[0][0] - run.added[rid])
        after = sum(n for _, n in ev[1:])
        if after:
            tpot.append((ev[-1][0] - ev[0][0]) / after)
    return dict(wall_s=wall, steps=run.steps, requests=len(run.events),
                output_tokens=out_tokens, output_tok_s=out_tokens / wall,
                input_tok_s=num_prompt_tokens / wall,
                mean_tpot_ms=1e3 * statistics.fmean(tpot) if tpot else None,
                mean_ttft_s=statistics.fmean(ttft) if ttft else None,
                median_running=statistics.median(run.running) if run.running else 0,
                peak_running=max(run.running, default=0))


def pools(engine: Engine) -> dict:
    b = engine.budget
    return dict(max_running_requests=b.max_running_requests, num_pages=b.num_pages,
                page_size=b.inputs.page_size, token_slots=b.token_slots,
                num_state_slots=b.num_state_slots, pool_gib=b.pool_bytes / GIB,
                kv_gib=b.kv_bytes / GIB, draft_kv_gib=b.draft_kv_bytes / GIB,
                state_gib=b.state_bytes / GIB, tail_gib=b.tail_bytes / GIB,
                spec_gib=b.spec_bytes / GIB,
                caps=[f"{c.kind} {c.value}: {c.reason}" for c in b.caps])


def run_rung(bench: TPBenchConfig, model: GLM5Model, groups: ProcessGroups, rung: Rung) -> dict:
    w, vocab = bench.workload, model.cfg.vocab_size
    params = SamplingParams(max_new_tokens=w.output_len, ignore_eos=True)
    cfg = engine_config(bench, rung.engine)  # its backends are bound by each engine's runner
    if rung.mode == "pd":
        if bench.device.startswith("cuda") and "cache_bytes" not in rung.prefill_engine:
            raise ValueError(f"rung {rung.name}: a pd rung shares the GPUs between two engines; "
                             "give prefill_engine.cache_bytes (the decode engine takes the rest)")
        pre_cfg = engine_config(bench, {"radix": "kv_and_state", **rung.prefill_engine})
        pre = build_tp_engine(model, pre_cfg, groups)
        engine = build_tp_engine(model, cfg, groups)
        pd = LocalPD(pre, engine)
        concurrency = w.concurrency or engine.budget.max_running_requests
        pd.submit(w.prompts(vocab, 1, offset=10**6), params)  # warm-up: caches the prefix
        while engine.has_work:
            engine.step()
        run = run_pd(pd, w.prompts(vocab, w.num_prompts, 0), params, concurrency)
    elif rung.mode == "mixed":
        engine = build_tp_engine(model, cfg, groups)
        concurrency = w.concurrency or engine.budget.max_running_requests + 4
        warm = w.prompts(vocab, 1, offset=10**6)
        run_mixed(engine, warm, params, 1)  # warm-up: caches the prefix, pays first-shape JIT
        run = run_mixed(engine, w.prompts(vocab, w.num_prompts, 0), params, concurrency)
    else:
        raise ValueError(f"rung {rung.name}: mode must be mixed or pd, got {rung.mode!r}")
    same_on_all_ranks(run.outputs, groups.tp)
    info = groups.info
    row = dict(bench="tp-decode", rung=rung.name, mode=rung.mode, tp=info.tp_size,
               ep=info.ep_size, model=bench.model or f"random:{bench.preset}", fp8=bench.fp8,
               fp8_weights=bench.fp8_weights, dtype=bench.dtype, device=bench.device,
               backend=dist.get_backend() if dist.is_initialized() else None,
               **dataclasses.asdict(w) | {"concurrency": concurrency},
               engine=cfg.describe(), pools_per_gpu=pools(engine),
               **summarize(run, w.num_prompts * w.input_len), reference_figures=rung.reference)
    if engine.spec is not None:
        row["speculative"] = engine.spec.summary()
    if bench.device.startswith("cuda"):
        row["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / GIB
    return row


def rank_main(bench: TPBenchConfig) -> list[dict]:
    """Per-rank entry for ``parallel.launch``; returns the rows (rank 0's times)."""
    if bench.cpu_threads:
        torch.set_num_threads(bench.cpu_threads)
    groups = ProcessGroups.build(bench.layout)
    start = time.perf_counter()
    model = build_shard(bench, groups)
    build_s = time.perf_counter() - start
    rows = []
    for rung in bench.rungs:
        with torch.inference_mode():
            rows.append({**run_rung(bench, model, groups, rung), "shard_build_s": build_s})
        if bench.device.startswith("cuda"):
            torch.cuda.empty_cache()
        if groups.info.rank == 0:
            print(json.dumps({k: rows[-1][k] for k in ("rung", "output_tok_s", "mean_tpot_ms",
                                                       "median_running")}), flush=True)
    return rows


# ------------------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="TP size = number of processes")
    p.add_argument("--ep", type=int, default=0, help="expert-parallel size: 1, or 0 = ranks")
    p.add_argument("--model", default="", help="checkpoint directory (else --preset)")
    p.add_argument("--preset", default="tiny", help="tiny | slice:N | full, drawn per rank")
    p.add_argument("--fp8", action="store_true", help="the preset in the FP8 checkpoint layout")
    p.add_argument("--fp8-weights", choices=("keep", "dequantize"), default="keep")
    p.add_argument("--weight-seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, GPU r per rank)")
    p.add_argument("--cpu-threads", type=int, default=0)
    for f in dataclasses.fields(Workload):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    p.add_argument("--rungs", default='[{"name": "default"}]',
                   help="JSON list of rungs {name, engine, mode, prefill_engine, reference}, "
                   "or @FILE")
    p.add_argument("--override", default="{}",
                   help="JSON merged into every rung's engine options, e.g. to rehearse a GPU "
                        "ladder on the CPU with small pools and the torch backends")
    p.add_argument("--out", default="data/bench")
    p.add_argument("--tag", default="")
    return p


def with_override(rung: Rung, override: dict) -> Rung:
    """``override`` merged into the rung's engine options (and its prefill engine's); its
    ``speculative`` part only into rungs that speculate."""
    def merged(options: dict) -> dict:
        out = dict(options)
        for key, value in override.items():
            if key == "speculative":
                if key in out:
                    out[key] = {**out[key], **value}
            else:
                out[key] = value
        return out

    prefill = merged(rung.prefill_engine) if rung.mode == "pd" else rung.prefill_engine
    return dataclasses.replace(rung, engine=merged(rung.engine), prefill_engine=prefill)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    text = Path(args.rungs[1:]).read_text() if args.rungs.startswith("@") else args.rungs
    override = json.loads(args.override)
    rungs = tuple(with_override(Rung(**r), override) for r in json.loads(text))
    workload = Workload(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Workload)})
    layout = ParallelLayout(tp=args.ranks, ep=args.ep or args.ranks)
    bench = TPBenchConfig(layout, rungs, workload, args.model, args.preset, args.fp8,
                     args.fp8_weights, args.weight_seed, args.dtype, args.device, args.cpu_threads)
    backend = "nccl" if args.device.startswith("cuda") else "gloo"
    rows = launch(rank_main, args.ranks, bench, backend=backend)[0]
    path = write_rows(rows, Path(args.out), "tp-decode" + (f"-{args.tag}" if args.tag else ""),
                      warmup="1 request per rung", repetitions=1)
    print(f"{len(rows)} rows -> {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
