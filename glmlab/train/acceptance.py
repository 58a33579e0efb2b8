"""Measured speculative acceptance of a trained model, and routing samples from it.

For every drafter setting (MTP chains of 1..7 steps, DFlash2 blocks of 4 and 8) and temperature
(greedy, 0.7) the engine runs real speculative decoding (``EngineConfig.speculative``, nothing
simulated) on prompts cut from the test split, and one JSONL row records the cycles and the mean
commit length per cycle (``accept_len``: accepted drafts + the bonus token, the figure the
published 7.37 / 7.03 are), next to the cycle times. A DFlash2 draft trained with block 8 also
drafts blocks of 4 (it has no per-slot weights; training alternated both sizes): its config is
re-issued with ``block_size`` 4 in a temporary directory over the same weights.

    python -m glmlab.train.acceptance --model small --device cuda --out data/bench

``routing_samples`` captures the trained routers' top-k choices on test prompts in the
``glmlab.kernels.moe.samples`` format (prefill, then greedy decode steps).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from glmlab.bench.ops import write_rows
from glmlab.bench.provenance import REPO
from glmlab.bench.routing import capture_routing
from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.core import SamplingParams
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.engine.model_runner import load_model_for
from glmlab.kernels.moe.samples import RoutingSamples
from glmlab.speculative.config import SpecConfig
from glmlab.tokenizer import Tokenizer
from glmlab.train.corpus import read_text, split_files
from glmlab.train.draft import DRAFT_DIR

TEMPERATURES = (0.0, 0.7)


def test_prompts(tok: Tokenizer, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``length`` tokens, each ending at a line end of a test-split file."""
    newline = {i for i in range(tok.vocab_size) if "\n" in tok.decode([i])}
    cases = []
    for f in split_files("test"):
        ids = tok.encode(read_text(f))
        ends = [i + 1 for i, t in enumerate(ids) if i + 1 >= length and t in newline]
        cases += [ids[e - length:e] for e in ends]
    if not cases:
        raise ValueError(f"no test-split prompt of {length} tokens")
    random.Random(seed).shuffle(cases)
    return cases[:count]


@contextmanager
def draft_with_block(draft: Path, block: int):
    """The draft directory, or a temporary twin whose config says ``block_size`` = ``block``."""
    raw = json.loads((draft / "config.json").read_text())
    if raw["dflash_config"]["block_size"] == block:
        yield draft
        return
    tmp = Path(tempfile.mkdtemp(prefix="glmlab-draft-"))
    try:
        raw["dflash_config"]["block_size"] = block
        (tmp / "config.json").write_text(json.dumps(raw))
        (tmp / "model.safetensors").symlink_to((draft / "model.safetensors").resolve())
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def settings(mtp_steps: tuple[int, ...], blocks: tuple[int, ...]) -> list[SpecConfig]:
    return ([SpecConfig(algorithm="mtp", num_steps=s) for s in mtp_steps]
            + [SpecConfig(algorithm="dflash2", block_size=b) for b in blocks])


def measure(model, engine_cfg: EngineConfig, spec: SpecConfig, prompts: list[list[int]],
            new_tokens: int, temperature: float, seed: int = 0) -> dict:
    """One setting: the engine decodes every prompt speculatively; returns the summary row."""
    eng = Engine(model, replace(engine_cfg, speculative=spec))
    params = [SamplingParams(temperature=temperature, max_new_tokens=new_tokens,
                             ignore_eos=True, seed=seed + i) for i in range(len(prompts))]
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    while eng.has_work:
        eng.step()
    for r in rids:
        eng.forget(r)
    eng.assert_idle()
    s = eng.spec.summary()
    if s.get("simulated"):
        raise AssertionError("acceptance must be measured, not simulated")
    return {"bench": "spec_accept", "config": spec.name, "algorithm": spec.algorithm,
            "verify_width": spec.width, "temperature": temperature, "prompts": len(prompts),
            "prompt_len": len(prompts[0]), "new_tokens": new_tokens, "simulated": False,
            "cycles": s["cycles"], "accept_len": s["accept_len"],
            "accepted_drafts_per_cycle": s["accept_len"] - 1, "cycle_ms": s["cycle_ms"],
            "phase_ms": s["phase_ms"], "ms_per_accepted_token": s["ms_per_accepted_token"]}


def measure_all(model_spec: str, engine_cfg: EngineConfig, num_prompts: int = 8,
                prompt_len: int = 256, new_tokens: int = 64,
                mtp_steps: tuple[int, ...] = tuple(range(1, 8)), blocks: tuple[int, ...] = (4, 8),
                temperatures: tuple[float, ...] = TEMPERATURES, verbose: bool = True
                ) -> list[dict]:
    path = resolve_model(model_spec)
    model = load_model_for(path, engine_cfg)
    tok = Tokenizer.from_dir(path, model.cfg.eos_token_ids)
    prompts = test_prompts(tok, num_prompts, prompt_len)
    rows = []
    for spec in settings(mtp_steps, blocks if (path / DRAFT_DIR).is_dir() else ()):
        for temp in temperatures:
            if spec.algorithm == "dflash2":
                with draft_with_block(path / DRAFT_DIR, spec.block_size) as d:
                    row = measure(model, engine_cfg, replace(spec, draft_path=str(d)), prompts,
                                  new_tokens, temp)
            else:
                row = measure(model, engine_cfg, spec, prompts, new_tokens, temp)
            row |= {"model": str(model_spec), "split": "test", "device": engine_cfg.device}
            rows.append(row)
            if verbose:
                print(f"{row['config']:>12} T={temp}: accept_len {row['accept_len']:.2f} "
                      f"over {row['cycles']} cycles")
    return rows


def routing_samples(model_spec: str, engine_cfg: EngineConfig, out: Path, num_prompts: int = 8,
                    prompt_len: int = 256, decode_steps: int = 16) -> Path:
    path = resolve_model(model_spec)
    model = load_model_for(path, engine_cfg)
    tok = Tokenizer.from_dir(path, model.cfg.eos_token_ids)
    prompts = test_prompts(tok, num_prompts, prompt_len, seed=1)
    samples: RoutingSamples = capture_routing(
        model, prompts, decode_steps,
        source=f"{model_spec}: {num_prompts} test-split prompts of {prompt_len} tokens, "
               f"prefill + {decode_steps} greedy steps")
    return samples.save(out)


def committed_rows(tag: str = "small-cpu") -> list[dict]:
    """The rows ``main`` wrote to the repository's ``data/bench/spec-accept-<tag>.jsonl``."""
    path = REPO / "data" / "bench" / f"spec-accept-{tag}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--mtp-steps", default="1,2,3,4,5,6,7")
    p.add_argument("--blocks", default="4,8")
    p.add_argument("--out", default="data/bench")
    p.add_argument("--tag", default="small")
    p.add_argument("--routing-out", default="", help="also write routing samples here")
    args = p.parse_args(argv)
    cfg = EngineConfig(device=args.device, print_budget=False, cache_bytes=1 << 30)
    ints = lambda s: tuple(int(x) for x in s.split(",") if x)  # noqa: E731
    rows = measure_all(args.model, cfg, args.prompts, args.prompt_len, args.new_tokens,
                       ints(args.mtp_steps), ints(args.blocks))
    path = write_rows(rows, Path(args.out), f"spec-accept-{args.tag}")
    print(f"{len(rows)} rows -> {path}")
    if args.routing_out:
        print("routing samples ->", routing_samples(args.model, cfg, Path(args.routing_out),
                                                     args.prompts, args.prompt_len))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
