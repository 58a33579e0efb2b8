"""One serving benchmark run (or an SLO search) against a live server, written as JSONL rows.

``BenchConfig`` fields mirror the reference deployment's ``sglang.benchmark.serving`` flags
(``--dataset-name
generated-shared-prefix --gsp-num-groups ... --request-rate inf --max-concurrency 140
--warmup-requests 12 --seed 42 --output-file ...``), so ``glmlab bench`` reads like the reference
deployment's
command. The SLO mode raises ``max_concurrency`` (doubling, then bisecting) to find the highest
load whose mean TTFT and TPOT stay within the targets.

The tokenizer comes from ``--tokenizer`` or the server's ``/model_info`` (a local directory).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from glmlab.bench.client import BACKENDS, get_json, run_load
from glmlab.bench.metrics import format_table, meets_slo, summarize
from glmlab.bench.ops import machine
from glmlab.bench.workloads import BenchRequest, random_requests, shared_prefix_requests
from glmlab.tokenizer import Tokenizer

DATASETS = ("generated-shared-prefix", "random")


@dataclass(frozen=True)
class BenchConfig:
    backend: str = "sglang"  # sglang | sglang-oai | sglang-oai-chat
    base_url: str = ""  # default http://{host}:{port}
    host: str = "127.0.0.1"
    port: int = 30000
    model: str = ""  # model name sent to the OpenAI APIs; default: the server's /v1/models
    tokenizer: str = ""  # a checkpoint directory; default: the server's /model_info
    dataset_name: str = "generated-shared-prefix"
    num_prompts: int = 0  # 0: every generated prompt (groups x prompts per group)
    random_input_len: int = 256
    random_output_len: int = 32
    random_range_ratio: float = 1.0
    gsp_num_groups: int = 1
    gsp_prompts_per_group: int = 16
    gsp_system_prompt_len: int = 240
    gsp_question_len: int = 16
    gsp_output_len: int = 16
    gsp_range_ratio: float = 1.0
    gsp_ordered: bool = False
    tokenize_prompt: bool = False  # send exact input_ids instead of text
    request_rate: float = float("inf")  # requests/s (Poisson arrivals); inf = all at once
    max_concurrency: int = 0  # 0 = unlimited
    warmup_requests: int = 1
    temperature: float = 0.0
    seed: int = 42
    flush_cache: bool = False  # POST /flush_cache before the run (after the warm-up)
    output_file: str = ""  # JSONL to append to
    tag: str = ""  # free label stored with the row
    slo_ttft_ms: float = 0.0  # SLO mode when either target is set
    slo_tpot_ms: float = 0.0
    slo_max_concurrency: int = 64
    request_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
        if self.dataset_name not in DATASETS:
            raise ValueError(f"dataset_name must be one of {', '.join(DATASETS)}")
        if self.request_rate <= 0:
            raise ValueError("request_rate must be > 0 (inf: all at once)")

    @property
    def url(self) -> str:
        return (self.base_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def slo_mode(self) -> bool:
        return bool(self.slo_ttft_ms or self.slo_tpot_ms)


# the reference deployment's 3P1D workloads: 0%, 50%, 93.75% shared
REFERENCE_PREFIX_RATIOS = (0.0, 0.5, 0.9375)


def shared_prefix_ladder(base: BenchConfig, prompt_len: int, output_len: int,
                         ratios: tuple[float, ...] = REFERENCE_PREFIX_RATIOS,
                         ) -> list[tuple[str, BenchConfig]]:
    """The reference deployment's shared-prefix workloads (64K in / 1K out at 0, 50 and 93.75 %
    shared) scaled to
    ``prompt_len`` / ``output_len``: system prompt = ratio x prompt, question = the rest."""
    out = []
    for r in ratios:
        system = round(prompt_len * r)
        out.append((f"{r:.2%} shared", replace(
            base, dataset_name="generated-shared-prefix", gsp_system_prompt_len=system,
            gsp_question_len=prompt_len - system, gsp_output_len=output_len,
            tag=f"{base.tag}prefix{r:g}")))
    return out


def build_requests(cfg: BenchConfig, tok: Tokenizer) -> list[BenchRequest]:
    if cfg.dataset_name == "random":
        return random_requests(tok, cfg.num_prompts or 16, cfg.random_input_len,
                               cfg.random_output_len, cfg.random_range_ratio, cfg.seed,
                               cfg.tokenize_prompt)
    reqs = shared_prefix_requests(tok, cfg.gsp_num_groups, cfg.gsp_prompts_per_group,
                                  cfg.gsp_system_prompt_len, cfg.gsp_question_len,
                                  cfg.gsp_output_len, cfg.gsp_range_ratio, cfg.seed,
                                  cfg.gsp_ordered, cfg.tokenize_prompt)
    return reqs[: cfg.num_prompts] if cfg.num_prompts else reqs


async def _server_facts(cfg: BenchConfig) -> tuple[str, str, object]:
    """(model name, tokenizer directory, server info) as the server describes itself."""
    try:
        status, models = await get_json(cfg.url, "/v1/models")
    except OSError as e:
        raise ValueError(f"cannot reach {cfg.url}: {e}") from e
    if status != 200:
        raise ValueError(f"{cfg.url}/v1/models answered {status}: is the server up?")
    model = cfg.model or models["data"][0]["id"]
    tokenizer = cfg.tokenizer
    if not tokenizer:
        for path in ("/model_info", "/get_model_info"):  # a router serves only the second
            status, info = await get_json(cfg.url, path)
            if status == 200 and isinstance(info, dict):
                tokenizer = info.get("tokenizer_path") or info.get("model_path") or ""
                break
    if not tokenizer or not Path(tokenizer).is_dir():
        raise ValueError(f"no local tokenizer directory (got {tokenizer!r}): pass --tokenizer")
    _, server = await get_json(cfg.url, "/get_server_info")
    return model, tokenizer, server


async def run_once(cfg: BenchConfig, requests: list[BenchRequest], model: str) -> dict:
    if cfg.warmup_requests:
        warm = [replace(r, output_len=min(r.output_len, 4)) for r in requests]
        await run_load(cfg.url, cfg.backend, warm[: cfg.warmup_requests], model,
                       cfg.temperature, seed=cfg.seed, timeout_s=cfg.request_timeout_s)
    if cfg.flush_cache:
        await get_json(cfg.url, "/flush_cache", method="POST")
    results, duration = await run_load(cfg.url, cfg.backend, requests, model, cfg.temperature,
                                       cfg.request_rate, cfg.max_concurrency, cfg.seed,
                                       cfg.request_timeout_s)
    summary = summarize(results, duration)
    errors = sorted({r.error for r in results if not r.success})[:5]
    return {**summary, "errors": errors}


async def run_benchmark(cfg: BenchConfig, verbose: bool = True) -> list[dict]:
    """Run (or search, in SLO mode); returns the rows written to ``cfg.output_file``."""
    model, tok_dir, server = await _server_facts(cfg)
    requests = build_requests(cfg, Tokenizer.from_dir(tok_dir))
    base = {**machine(), "config": _jsonable(asdict(cfg)), "model": model,
            "num_requests": len(requests), "server_info": server}
    rows = []
    if not cfg.slo_mode:
        rows.append({**base, **await run_once(cfg, requests, model)})
    else:
        rows = await _slo_search(cfg, requests, model, base, verbose)
    if verbose:
        print(format_table(rows[-1]))
    if cfg.output_file:
        path = Path(cfg.output_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return rows


async def _slo_search(cfg, requests, model, base, verbose) -> list[dict]:
    rows, tried = [], {}

    async def trial(c: int) -> bool:
        if c not in tried:
            row = {**base, **await run_once(replace(cfg, max_concurrency=c), requests, model),
                   "slo_trial": True, "max_concurrency": c}
            row["meets_slo"] = meets_slo(row, cfg.slo_ttft_ms, cfg.slo_tpot_ms)
            rows.append(row)
            tried[c] = row["meets_slo"]
            if verbose:
                print(f"concurrency {c}: mean TTFT {row['mean_ttft_ms']:.1f} ms, mean TPOT "
                      f"{row['mean_tpot_ms']:.1f} ms, output {row['output_throughput']:.1f} "
                      f"tok/s -> {'meets' if row['meets_slo'] else 'misses'} the SLO")
        return tried[c]

    good, bad, c = 0, None, 1
    while c <= cfg.slo_max_concurrency:
        if not await trial(c):
            bad = c
            break
        good, c = c, c * 2
    if bad is None and good < cfg.slo_max_concurrency and await trial(cfg.slo_max_concurrency):
        good = cfg.slo_max_concurrency
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if await trial(mid) else (good, mid)
    best = next((r for r in rows if r["max_concurrency"] == good), None)
    final = {**(best or base), "slo_trial": False, "slo_best_concurrency": good,
             "slo_ttft_ms": cfg.slo_ttft_ms, "slo_tpot_ms": cfg.slo_tpot_ms}
    return rows + [final]


def _jsonable(d: dict) -> dict:
    return {k: (str(v) if isinstance(v, float) and v == float("inf") else v)
            for k, v in d.items()}


def main_sync(cfg: BenchConfig) -> list[dict]:
    return asyncio.run(run_benchmark(cfg))
