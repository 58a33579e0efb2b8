"""``LLM``: the offline API. A checkpoint (or preset) in, completions out, through one ``Engine``.

    llm = LLM("tiny", kv_dtype="fp8", radix="kv_and_state")
    outs = llm.generate(["Hello", "Bonjour"], SamplingParams(max_new_tokens=16))
    for chunk in llm.stream("Hello"): print(chunk.text, end="")

Engine options are ``EngineConfig`` fields. Prompts are text (encoded with the checkpoint's
tokenizer) or token-id lists; one ``SamplingParams`` for all, or one per prompt.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.engine.config import ComputeDtype, EngineConfig
from glmlab.engine.engine import Engine
from glmlab.engine.sampler import SamplingParams
from glmlab.tokenizer import Tokenizer
from glmlab.trace.tracer import NULL_TRACER, Tracer

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class Completion:
    index: int
    prompt_ids: list[int]
    output_ids: list[int]
    text: str
    finish_reason: str
    cached_tokens: int  # prompt tokens served from the radix tree
    num_preemptions: int


@dataclass(frozen=True)
class StreamChunk:
    index: int
    token_ids: tuple[int, ...]  # new tokens
    text: str  # new text
    finished: bool
    finish_reason: str | None


class LLM:
    def __init__(self, model: str | Path = "tiny", tracer: Tracer = NULL_TRACER,
                 **engine_options):
        self.cfg = EngineConfig(**engine_options)
        path = resolve_model(str(model))
        dtype = {ComputeDtype.BF16: torch.bfloat16, ComputeDtype.FP32: torch.float32}.get(
            self.cfg.dtype, torch.bfloat16 if self.cfg.device.startswith("cuda") else torch.float32)
        self.model = load_model(path, dtype=dtype, device=self.cfg.device)
        self.model.use_backends(self.cfg.backends)
        self.tokenizer = Tokenizer.from_dir(path, self.model.cfg.eos_token_ids)
        self.engine = Engine(self.model, self.cfg, self.tokenizer.decode,
                             self.tokenizer.eos_token_ids, tracer)

    def _add(self, prompts: Prompt | Sequence[Prompt],
             sampling: SamplingParams | Sequence[SamplingParams] | None) -> list[str]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling if isinstance(sampling, Sequence) else [sampling] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        rids = []
        try:
            for i, p in zip(ids, params, strict=True):
                rids.append(self.engine.add_request(i, p or SamplingParams()))
        except ValueError:
            for r in rids:
                self.engine.abort(r)
            raise
        return rids

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[Completion]:
        rids = self._add(prompts, sampling)
        todo = set(rids)
        with tqdm(total=len(rids), desc="generate", disable=not use_tqdm) as bar:
            while todo:
                for out in self.engine.step():
                    if out.finished and out.rid in todo:
                        todo.discard(out.rid)
                        bar.update(1)
        return [self._completion(i, r) for i, r in enumerate(rids)]

    def stream(self, prompts: Prompt | Sequence[Prompt],
               sampling: SamplingParams | Sequence[SamplingParams] | None = None,
               ) -> Iterator[StreamChunk]:
        """Yield new tokens and text per request as the engine produces them."""
        rids = self._add(prompts, sampling)
        index = {r: i for i, r in enumerate(rids)}
        texts = dict.fromkeys(rids, "")
        todo = set(rids)
        try:
            while todo:
                for out in self.engine.step():
                    if out.rid not in todo:
                        continue
                    text = self._text(out.rid)
                    if text.endswith("\ufffd") and not out.finished:
                        text = texts[out.rid]  # an incomplete UTF-8 sequence: wait for the rest
                    delta, texts[out.rid] = text[len(texts[out.rid]):], text
                    if out.finished:
                        todo.discard(out.rid)
                    reason = out.finish_reason.value if out.finish_reason else None
                    yield StreamChunk(index[out.rid], out.new_token_ids, delta, out.finished,
                                      reason)
        finally:  # a consumer that stops early must not leave requests holding the pools
            for r in todo:
                self.engine.abort(r)
            for r in rids:
                self.engine.forget(r)

    def _text(self, rid: str) -> str:
        req = self.engine.request(rid)
        text = self.tokenizer.decode(req.output_ids)
        return text[: text.index(req.stop_str)] if req.stop_str and req.stop_str in text else text

    def _completion(self, index: int, rid: str) -> Completion:
        req = self.engine.request(rid)
        out = Completion(index, req.prompt_ids, req.output_ids, self._text(rid),
                         req.finish_reason.value, req.cached_tokens, req.num_preemptions)
        self.engine.forget(rid)
        return out
