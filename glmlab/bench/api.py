"""What the serving API's request options cost the engine (``python -m glmlab.bench.ops --op api``).

Three cases, measured side by side in one process on one model (``--preset``: ``slice:N`` at real
widths, its block-FP8 weights drawn in place on the GPU by ``glmlab.distributed.random_shard``, or
``tiny`` on the CPU for a rehearsal), with the op backends named by ``--backends``:

- ``penalties``: decode steps of ``--batch`` requests at ``--context`` tokens, every request with
  frequency, presence and repetition penalties and top-20 logprobs, against the same batch plain
  (goal: at most 5% slower);
- ``grammar``: the same, ``--constrained`` of the requests under a ``json_schema`` grammar
  (xgrammar bitmasks; the tokenizer is glmlab's byte-level one padded to the model's vocabulary,
  so xgrammar's per-step work is that of a small vocabulary), against the batch plain (goal: at
  most 10% slower);
- ``samples``: ``n = --samples`` samples of one ``--prompt-len``-token prompt, read off the
  engines' own counts (``EngineStats.prefill_compute_tokens``, ``pages_allocated``): one mixed
  engine forking the samples, the same n as separate requests, and a prefill + decode engine pair
  (``LocalPD``: one prefill, one move, the samples forked on decode). The prompt must be computed
  once and its pages allocated once; the rows carry the counts and what they should be.

Decode steps need no prefill: the requests are imported (a PD decode instance's path) into a
cache filled with random rows, so a step costs what its context and batch make it cost. A row is
one case: the step times of both variants (median over ``--reps`` rounds of ``--steps`` steps
after ``--warmup``), their ratio and the goal, and the sampler's time alone for each (the same
requests on one batch of random logits: how much of the difference is sampling). Rows go to
``--stream`` as each case ends (stamped with ``glmlab.bench.provenance``), and are returned for
``glmlab.bench.ops`` to write.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch

from glmlab.bench.api_matchers import case_matchers
from glmlab.bench.ops import machine
from glmlab.bench.profile_table import write_profile
from glmlab.checkpoint.tokenizer import build_byte_tokenizer
from glmlab.core import SamplingParams
from glmlab.distributed.parallel import ProcessGroups
from glmlab.distributed.random_shard import random_tp_model
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.engine.local_pd import LocalPD
from glmlab.model.backends import Backends
from glmlab.presets import preset, preset_config
from glmlab.sampling import sample_seed
from glmlab.tokenizer import Tokenizer

TIMING = {"warmup": "--warmup decode steps per round", "repetitions": "--steps x --reps"}
BACKENDS = {"fast": Backends.fast, "reference": Backends, "triton": Backends.triton,
            "issue": lambda: Backends(kda="fla", sparse_mla="tilelang", moe="triton")}
GOALS = {"penalties": 1.05, "grammar": 1.10}
# a JSON object whose one string must be longer than any run here: a request never completes it
SCHEMA = ('{"type": "object", "properties": {"text": {"type": "string", "minLength": 100000}},'
          ' "required": ["text"]}')


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops --op api")
    p.add_argument("--preset", default="slice:4")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="fast", choices=sorted(BACKENDS))
    p.add_argument("--sampling", choices=("torch", "triton"),
                   help="the sampler's penalty and mask ops (default: the backend set's)")
    p.add_argument("--cases", default="penalties,grammar,samples")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--constrained", type=int, default=64)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=2,
                   help="rounds of both variants (which goes first alternates)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=4096)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--cache-gb", type=float, help="pool GB of the decode engine, half of it "
                   "for each of the samples case's three (default: 16 on CUDA)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stream", help="append each row to this JSONL file as it is measured")
    p.add_argument("--time-budget", type=float, help="seconds; later cases are skipped")
    p.add_argument("--profile-dir", help="write the kernels of one sampler call per variant "
                   "here (profile-sampler-VARIANT.txt): where the sampler's time goes")
    return p.parse_args(argv)


# ---------------------------------------------------------------- model and engines
def build_model(args):
    cuda = args.device.startswith("cuda")
    fp8 = cuda and args.preset != "tiny"
    return random_tp_model(preset(args.preset), ProcessGroups.single(), seed=args.seed, fp8=fp8,
                           fp8_mode="keep", dtype=torch.bfloat16 if cuda else torch.float32,
                           device=args.device, with_mtp=False)


def engine_config(args, context_len: int, running: int, share: float = 1.0) -> EngineConfig:
    """``share`` of ``--cache-gb`` for this engine's pools (the samples case holds three)."""
    cuda = args.device.startswith("cuda")
    gb = share * (args.cache_gb if args.cache_gb is not None else (16.0 if cuda else 0.25))
    return EngineConfig(device=args.device, fp8_weights="keep" if cuda else "dequantize",
                        page_size=args.page_size, context_len=context_len,
                        cache_bytes=int(gb * 1e9), max_running_requests=running,
                        cuda_graph_max_bs=running,  # graphs captured up to the batch only
                        backends=backends(args), print_budget=False,
                        max_num_batched_tokens=max(8192, args.prompt_len),
                        chunk_size=max(8192, args.prompt_len) // args.page_size * args.page_size)


def backends(args) -> Backends:
    chosen = BACKENDS[args.backends]()
    return dataclasses.replace(chosen, sampling=args.sampling) if args.sampling else chosen


def fill_random(engine: Engine, seed: int) -> None:
    """Random rows in every float cache region (a step's cost does not depend on the values),
    drawn in blocks of rows (an FP8 region has no in-place normal_; a whole pool at once would
    need its size again in fp32)."""
    g = torch.Generator(engine.runner.device).manual_seed(seed)
    with torch.no_grad():
        for t, _ in engine.cache.storage.regions().values():
            if not t.is_floating_point():
                continue
            rows = max(1, (1 << 26) // max(1, t[0].numel()))
            for i in range(0, t.shape[0], rows):
                block = t[i:i + rows]
                block.copy_(torch.randn(block.shape, generator=g, device=t.device).mul_(0.1))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------- decode steps
def first_allowed(matcher, vocab: int) -> int:
    mask = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)
    matcher.fill_mask(mask, 0)
    word = int((mask[0] != 0).nonzero()[0])
    bits = int(mask[0, word]) & 0xFFFFFFFF
    return word * 32 + (bits & -bits).bit_length() - 1


def decode_round(engine: Engine, args, params: list[SamplingParams], grammars: list,
                 label: str | None = None) -> tuple[list[float], list[float]]:
    """Import ``len(params)`` requests at ``--context`` tokens, then step: the step times (ms)
    after the warm-up, then the sampler's alone (``--steps`` calls on one random logits batch,
    the requests as they are). Every request ends (aborted) before it returns."""
    vocab = engine.model.cfg.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    rids = []
    for p, grammar in zip(params, grammars, strict=True):
        prompt = torch.randint(0, vocab, (args.context,), generator=g).tolist()
        rids.append(engine.add_request(prompt, p, imported=True, grammar=grammar))
    engine.step()  # admits them (their content is "imported": the random rows)
    targets = {t.rid for t in engine.import_targets()}
    if targets != set(rids):
        raise RuntimeError(f"the engine admitted {len(targets)} of {len(rids)} requests")
    for rid, grammar in zip(rids, grammars, strict=True):
        first = first_allowed(grammar, vocab) if grammar is not None else 1
        engine.complete_import(rid, first)
    times = []
    for i in range(args.warmup + args.steps):
        sync(args.device)
        start = time.perf_counter()
        outs = engine.step()
        sync(args.device)
        if i >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
        if len(outs) != len(rids) or any(o.finished for o in outs):
            raise RuntimeError("a request left the batch before the timed steps ended")
    reqs = [engine.request(r) for r in rids]
    logits = torch.randn(len(reqs), vocab, generator=torch.Generator().manual_seed(1))
    logits = logits.to(engine.runner.device)
    sampled = []
    for _ in range(args.steps):
        sync(args.device)
        start = time.perf_counter()
        engine.runner.sample(reqs, logits)
        sync(args.device)
        sampled.append((time.perf_counter() - start) * 1e3)
    if label and args.profile_dir:
        write_profile(lambda: engine.runner.sample(reqs, logits),
                      Path(args.profile_dir) / f"profile-sampler-{label}.txt",
                      f"the sampler once: {label}, {len(reqs)} requests x {vocab} logits")
    for rid in rids:
        engine.abort(rid)
        engine.forget(rid)
    engine.assert_idle()
    return times, sampled


def side_by_side(engine: Engine, args, case: str, variant) -> dict:
    """``variant() -> (params, grammars)`` against the plain batch, rounds interleaved."""
    new = args.warmup + args.steps + 4
    plain = [SamplingParams(temperature=1.0, seed=args.seed + i, max_new_tokens=new,
                            ignore_eos=True) for i in range(args.batch)]
    times: dict[str, list[float]] = {"plain": [], case: []}
    sampler: dict[str, list[float]] = {"plain": [], case: []}
    for r in range(args.reps):
        rounds = [("plain", (plain, [None] * args.batch)), (case, variant(plain))]
        for name, (ps, gs) in rounds[::-1] if r % 2 else rounds:  # neither always goes first
            steps, alone = decode_round(engine, args, ps, gs, name if r == 0 else None)
            times[name] += steps
            sampler[name] += alone
    base, other = statistics.median(times["plain"]), statistics.median(times[case])
    return {"case": case, "batch": args.batch, "context": args.context,
            "plain_step_ms": round(base, 4), "step_ms": round(other, 4),
            "ratio": round(other / base, 4), "goal_ratio": GOALS[case],
            "meets_goal": other / base <= GOALS[case],
            # the sampler alone on one logits batch: where the difference comes from
            "plain_sampler_ms": round(statistics.median(sampler["plain"]), 4),
            "sampler_ms": round(statistics.median(sampler[case]), 4),
            "plain_step_ms_all": [round(t, 4) for t in times["plain"]],
            "step_ms_all": [round(t, 4) for t in times[case]],
            "cuda_graphs": engine.runner.graphs is not None}


def case_penalties(engine: Engine, args) -> dict:
    def variant(plain):
        return ([dataclasses.replace(p, frequency_penalty=0.5, presence_penalty=0.5,
                                     repetition_penalty=1.1, logprobs=20) for p in plain],
                [None] * len(plain))

    row = side_by_side(engine, args, "penalties", variant)
    return {**row, "options": "frequency_penalty 0.5, presence_penalty 0.5, "
                              "repetition_penalty 1.1, logprobs 20 (top-20) on every request"}


def case_grammar(engine: Engine, args) -> dict:
    from glmlab.serve.grammar import GrammarCache
    from glmlab.serve.schemas import GrammarSpec

    vocab = engine.model.cfg.vocab_size
    tok = Tokenizer(build_byte_tokenizer(), None, engine.eos_token_ids, frozenset())
    compiled = GrammarCache(tok, vocab).compile(GrammarSpec("json_schema", SCHEMA))
    k = min(args.constrained, args.batch)

    def variant(plain):
        from glmlab.serve.grammar import Compiled

        return plain, [Compiled(compiled).matcher() if i < k else None
                       for i in range(len(plain))]

    row = side_by_side(engine, args, "grammar", variant)
    return {**row, "constrained": k, "schema": json.loads(SCHEMA),
            "tokenizer": f"glmlab byte-level ({tok._tok.get_vocab_size()} tokens) padded to "
                         f"{vocab}"}


# ---------------------------------------------------------------- n samples of one prompt
def _run(engine: Engine) -> None:
    while engine.has_work:
        engine.step()


def page_bytes(engine: Engine) -> tuple[int, int]:
    """(bytes of one page's token and pool rows, bytes of one request's state rows)."""
    st = engine.cache.storage
    rows = {"token": st.page_size, "pool": st.page_size // st.cfg.dsa.index_kpool, "state": 0}
    page = sum(t[0].numel() * t.element_size() * rows[u] for t, u in st.regions().values())
    state = sum(t[0].numel() * t.element_size() for t, u in st.regions().values()
                if u == "state")
    return page, state


def case_samples(model, args) -> Iterator[dict]:
    """Rows as measured: one engine forking the samples, the prefill + decode pair, then the
    same n as separate requests (the baseline, last: n prompts to compute)."""
    n, plen, new, s = args.samples, args.prompt_len, args.new_tokens, args.page_size
    vocab = model.cfg.vocab_size
    prompt = torch.randint(0, vocab, (plen,), generator=torch.Generator().manual_seed(7)).tolist()
    params = SamplingParams(n=n, temperature=1.0, seed=11, max_new_tokens=new, ignore_eos=True)
    pages = lambda t: -(-t // s)  # noqa: E731
    forked = pages(plen + new) + (n - 1) * (pages(plen + new) - plen // s)

    def measure(mode: str, engine: Engine, submit, expect: dict) -> dict:
        before = engine.stats()
        sync(args.device)
        start = time.perf_counter()
        submit(engine)
        _run(engine)
        sync(args.device)
        after = engine.stats()
        engine.assert_idle()
        got = {"prefill_compute_tokens": after.prefill_compute_tokens
               - before.prefill_compute_tokens,
               "pages_allocated": after.pages_allocated - before.pages_allocated}
        return {"case": "samples", "mode": mode, "samples": n, "prompt_len": plen,
                "new_tokens": new, "page_size": s,
                "wall_ms": round((time.perf_counter() - start) * 1e3, 2), **got,
                "expected": expect, "as_expected": got == expect}

    one = Engine(model, engine_config(args, plen + new + s, n, 0.5))
    yield measure("mixed_one_request", one, lambda e: e.add_request(prompt, params),
                  {"prefill_compute_tokens": plen, "pages_allocated": forked})
    pd = LocalPD(Engine(model, engine_config(args, plen + new + s, n, 0.5)),
                 Engine(model, engine_config(args, plen + new + s, n, 0.5)))
    handoffs = []
    before = pd.prefill.stats()
    row = measure("pd_decode", pd.decode, lambda e: handoffs.extend(pd.submit([prompt], params)),
                  {"prefill_compute_tokens": 0, "pages_allocated": forked})
    after = pd.prefill.stats()
    pd.prefill.assert_idle()
    pb, state = page_bytes(pd.decode)
    side = {"prefill_compute_tokens": after.prefill_compute_tokens
            - before.prefill_compute_tokens,
            "pages_allocated": after.pages_allocated - before.pages_allocated}
    want = {"prefill_compute_tokens": plen, "pages_allocated": pages(plen)}
    row.update(prefill_side=side, prefill_side_expected=want,
               bytes_moved=handoffs[0].bytes_moved, bytes_one_prompt=pages(plen) * pb + state)
    row["as_expected"] = (row["as_expected"] and side == want
                          and row["bytes_moved"] == row["bytes_one_prompt"])
    pd = None  # its pools are freed before the baseline runs
    yield row
    separate = [SamplingParams(temperature=1.0, seed=sample_seed(11, i), max_new_tokens=new,
                               ignore_eos=True) for i in range(n)]
    yield measure("mixed_n_requests", one, lambda e: [e.add_request(prompt, p) for p in separate],
                  {"prefill_compute_tokens": n * plen, "pages_allocated": n * pages(plen + new)})


# ---------------------------------------------------------------- driver
def run(argv: list[str]) -> list[dict]:
    args = _args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - {"penalties", "grammar", "samples", "matchers"}
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}: penalties, grammar, samples, "
                         "matchers")
    started = time.monotonic()
    # the matchers case needs only the vocabulary size: no model drawn for it alone
    model = build_model(args) if set(cases) - {"matchers"} else None
    common = {"preset": args.preset, "device": args.device, "backends": args.backends,
              "backend_ops": backends(args).describe(),
              "model_dtype": str(model.dtype).removeprefix("torch.") if model else None}
    rows: list[dict] = []
    engine = None

    def emit(row: dict, t0: float) -> None:
        row = {**common, **row, "case_s": round(time.monotonic() - t0, 1)}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_all")}), flush=True)
        if args.stream:
            Path(args.stream).parent.mkdir(parents=True, exist_ok=True)
            with Path(args.stream).open("a") as f:
                f.write(json.dumps({**machine(args.warmup, args.steps * args.reps), **row})
                        + "\n")

    for case in cases:
        if args.time_budget and time.monotonic() - started > args.time_budget:
            print(f"skipped {case}: past the time budget", flush=True)
            continue
        t0 = time.monotonic()
        try:  # one run on a GPU machine: a case that breaks leaves the others their rows
            if case in ("penalties", "grammar") and engine is None:  # matchers: no engine
                engine = Engine(model, engine_config(args, args.context + 2 * args.steps
                                                     + 4 * args.page_size, args.batch))
                fill_random(engine, args.seed)
            if case == "matchers":
                tok = Tokenizer(build_byte_tokenizer(), None, frozenset({1}), frozenset())
                got = [case_matchers(preset_config(args.preset).vocab_size, tok, SCHEMA,
                                     args.constrained, args.steps)]
            elif case == "penalties":
                got = [case_penalties(engine, args)]
            elif case == "grammar":
                got = [case_grammar(engine, args)]
            else:
                engine = None  # its pools are not needed any more
                got = case_samples(model, args)
            for row in got:
                emit(row, t0)
        except Exception as e:  # noqa: BLE001 - recorded as the case's row, loudly
            traceback.print_exc()
            emit({"case": case, "error": f"{type(e).__name__}: {e}"[:2000]}, t0)
            engine = None  # its state is unknown: the next case builds its own
    return rows
