"""The accuracy harness: bits per byte on text files, and next-line exact match, under any engine
setting.

The model runs through the engine's ``ModelRunner`` (``glmlab.engine.model_runner``): loaded as
the ``EngineConfig`` says (compute dtype, block-FP8 weights dequantised or kept, backends), its
cache in the configured formats (BF16 / FP8 latent, FP8 indexer keys, FP32 / BF16 state), leases
taken from and returned to the engine's pools. Two settings need a different checkpoint, which
is derived in a temporary directory: ``weights="fp8"`` writes the block-FP8 twin of a bf16
checkpoint (the released recipe), ``attention="dense"`` raises ``index_topk`` past the context so
every DSA query keeps every causal position.

Bits per byte: each file is ``<|endoftext|>`` + its tokens; every token is predicted once, in
independent windows of ``window`` tokens (a window's first input is the previous window's last
token), each window fed in chunks of ``chunk`` tokens so the carried state (KDA state and conv,
indexer tail) is stored in its cache format and read back as in chunked prefill. bpb = total
-log2 p / UTF-8 bytes of the files.

Next-line exact match (test split): a prompt ends just before the newline that precedes a chosen
line; greedy decoding must produce that newline, the line exactly, and another newline.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from glmlab.checkpoint import load_model
from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.checkpoint.writer import save_checkpoint
from glmlab.config import ModelConfig
from glmlab.engine.config import EngineConfig
from glmlab.engine.model_runner import ModelRunner
from glmlab.model.plan import StepPlan
from glmlab.tokenizer import Tokenizer
from glmlab.train.corpus import read_text

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


@contextmanager
def derived_checkpoint(path: Path, weights: str, attention: str) -> Iterator[Path]:
    """``path`` itself, or a temporary twin with FP8 weights and/or dense DSA attention."""
    if weights not in ("bf16", "fp8") or attention not in ("sparse", "dense"):
        raise ValueError(f"weights must be bf16|fp8 and attention sparse|dense, got {weights!r}, "
                         f"{attention!r}")
    if weights == "bf16" and attention == "sparse":
        yield path
        return
    tmp = Path(tempfile.mkdtemp(prefix="glmlab-eval-"))
    try:
        raw = json.loads((path / "config.json").read_text())
        if attention == "dense":
            text = raw.get("text_config", raw)
            text["index_topk"] = int(text.get("max_position_embeddings", 1 << 20))
        if weights == "fp8":
            if raw.get("quantization_config"):
                raise ValueError(f"{path} already has FP8 weights: use --weights bf16")
            model = load_model(path, dtype=torch.float32)
            save_checkpoint(model, ModelConfig.from_hf(raw), tmp, fp8=True)
        else:
            (tmp / "config.json").write_text(json.dumps(raw, indent=2))
            for f in path.glob("*.safetensors*"):
                (tmp / f.name).symlink_to(f.resolve())
            for f in path.glob("model.safetensors.index.json"):
                shutil.copyfile(f, tmp / f.name)
        for name in _TOKENIZER_FILES:
            if (path / name).is_file():
                shutil.copyfile(path / name, tmp / name)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Scorer:
    """Runs token windows through a ``ModelRunner`` with leases from its pools."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner

    @contextmanager
    def leases(self, lengths: list[int]):
        cache, held = self.runner.cache, []
        try:
            for n in lengths:
                lease = cache.acquire([], n, brings_state=False)
                if lease is None:
                    raise ValueError(f"the engine's pools cannot hold {len(lengths)} windows of "
                                     f"{max(lengths)} tokens: lower --batch or raise "
                                     "--cache-bytes")
                held.append(lease)
            yield held
        finally:
            for lease in held:
                cache.release(lease, [], 0)

    def forward(self, leases, ids: list[list[int]], starts: list[int],
                rows: str = "all") -> torch.Tensor:
        """Append ``ids[i]`` at ``starts[i]``; fp32 logits of every row (or each last row)."""
        r = self.runner
        plan = r.forward_plan([x.pages for x in leases], [len(x) for x in ids], starts,
                              [x.slot for x in leases])
        flat = torch.tensor([t for x in ids for t in x], dtype=torch.long, device=r.device)
        last = plan.last_token_rows() if rows == "last" else None
        with torch.inference_mode():
            return r.forward(StepPlan(flat, plan, last)).logits

    def window_nll(self, windows: list[list[int]], chunk: int) -> float:
        """Sum of -ln p(w[j+1] | w[:j+1]) over windows (lists of L+1 ids), chunk by chunk."""
        total = 0.0
        with self.leases([len(w) - 1 for w in windows]) as held:
            longest = max(len(w) for w in windows) - 1
            for s in range(0, longest, chunk):
                part = [(i, w[s:min(s + chunk, len(w) - 1)], w[s + 1:s + chunk + 1])
                        for i, w in enumerate(windows) if s < len(w) - 1]
                logits = self.forward([held[i] for i, _, _ in part], [x for _, x, _ in part],
                                      [s] * len(part))
                targets = torch.tensor([t for _, _, y in part for t in y], device=logits.device)
                total += float(torch.nn.functional.cross_entropy(logits, targets,
                                                                 reduction="sum"))
        return total

    def greedy(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in prompts]
        with self.leases([len(p) + max_new for p in prompts]) as held:
            logits = self.forward(held, prompts, [0] * len(prompts), rows="last")
            for step in range(max_new):
                nxt = logits.argmax(-1).tolist()
                for o, t in zip(out, nxt, strict=True):
                    o.append(t)
                if step + 1 == max_new:
                    break
                logits = self.forward(held, [[t] for t in nxt],
                                      [len(p) + step for p in prompts])
        return out


def file_windows(tok: Tokenizer, text: str, window: int, separator: int) -> list[list[int]]:
    ids = [separator, *tok.encode(text)]
    return [ids[s:s + window + 1] for s in range(0, len(ids) - 1, window)]


def bits_per_byte(scorer: Scorer, tok: Tokenizer, files: list[Path], window: int, chunk: int,
                  batch: int, separator: int) -> dict:
    texts = [read_text(f) for f in files]
    windows = [w for t in texts for w in file_windows(tok, t, window, separator)]
    nll = sum(scorer.window_nll(windows[i:i + batch], chunk)
              for i in range(0, len(windows), batch))
    tokens = sum(len(w) - 1 for w in windows)
    n_bytes = sum(len(t.encode()) for t in texts)
    return {"bits_per_byte": nll / math.log(2) / n_bytes, "tokens": tokens, "bytes": n_bytes,
            "nll_per_token": nll / tokens, "files": len(files)}


def next_line_cases(files: list[Path], count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(text before the newline ahead of the line, the line) for ``count`` lines chosen
    deterministically among lines of 8..120 characters with a predecessor."""
    cases = []
    for f in files:
        text = read_text(f)
        starts = [i + 1 for i, ch in enumerate(text) if ch == "\n"]
        for s in starts:
            end = text.find("\n", s)
            line = text[s:end if end >= 0 else len(text)]
            if len(line.strip()) >= 8 and len(line) <= 120 and s >= 2:
                cases.append((text[:s - 1], line))
    random.Random(seed).shuffle(cases)
    return cases[:count]


def next_line_match(scorer: Scorer, tok: Tokenizer, files: list[Path], count: int,
                    context: int, batch: int, max_new: int = 48) -> dict:
    cases = next_line_cases(files, count)
    hits = 0
    for i in range(0, len(cases), batch):
        part = cases[i:i + batch]
        prompts = [tok.encode(before)[-(context - max_new):] for before, _ in part]
        for (_, line), ids in zip(part, scorer.greedy(prompts, max_new), strict=True):
            text = tok.decode(ids)
            hits += text.startswith("\n") and text[1:].split("\n")[0] == line \
                and "\n" in text[1:]
    return {"exact_match": hits / max(1, len(cases)), "lines": len(cases)}


def byte_unigram_bpb(train: list[str], evaluate: list[str]) -> float:
    """Cross entropy (bits/byte) of ``evaluate`` under train's byte frequencies (add-one)."""
    counts = _byte_counts(train) + 1
    logp = (counts / counts.sum()).log2()
    data = _byte_counts(evaluate)
    return float(-(data * logp).sum() / data.sum())


def _byte_counts(texts: list[str]) -> torch.Tensor:
    total = torch.zeros(256, dtype=torch.float64)
    for t in texts:
        raw = t.encode()
        if raw:
            total += torch.frombuffer(bytearray(raw), dtype=torch.uint8).long().bincount(
                minlength=256).double()
    return total


def evaluate(model: str, files: list[Path], engine: EngineConfig, weights: str = "bf16",
             attention: str = "sparse", window: int = 512, chunk: int = 64, batch: int = 8,
             completion_files: list[Path] | None = None, completion_lines: int = 0) -> dict:
    path = resolve_model(model)
    with derived_checkpoint(path, weights, attention) as ckpt:
        runner = ModelRunner.from_pretrained(ckpt, engine)
        tok = Tokenizer.from_dir(ckpt, runner.model.cfg.eos_token_ids)
        separator = tok.token_id("<|endoftext|>")
        if separator is None:
            raise ValueError(f"{path}: the tokenizer has no <|endoftext|>")
        scorer = Scorer(runner)
        out = bits_per_byte(scorer, tok, files, window, chunk, batch, separator)
        if completion_lines and completion_files:
            out["completion"] = next_line_match(scorer, tok, completion_files, completion_lines,
                                                window, batch)
        runner.cache.check_idle()
    out |= {"model": str(path), "weights": weights, "attention": attention, "window": window,
            "chunk": chunk, "engine": {k: v for k, v in engine.describe().items()
                                       if k in ("device", "dtype", "fp8_weights", "kv_dtype",
                                                "index_dtype", "state_dtype", "backends")}}
    return out
