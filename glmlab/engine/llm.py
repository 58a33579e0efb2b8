"""``LLM``: the offline API. A checkpoint (or preset) in, completions out, through one ``Engine``.

    llm = LLM("tiny", kv_dtype="fp8", radix="kv_and_state")
    outs = llm.generate(["Hello", "Bonjour"], SamplingParams(max_new_tokens=16))
    for index, out in llm.stream("Hello"): print(out.text_delta, end="")

Engine options are ``EngineConfig`` fields; the engine is ``Engine.from_pretrained``. Prompts are
text (encoded with the checkpoint's tokenizer) or token-id lists; one ``SamplingParams`` for all,
or one per prompt. Text, stop strings and logprobs are the engine's ``RequestOutput`` records;
this module only collects them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from glmlab.core import RequestOutput, SamplingParams, TokenLogprob
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
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
    logprobs: list[TokenLogprob] | None = None  # one per output token, when asked
    matched_stop: int | str | None = None


class LLM:
    def __init__(self, model: str | Path = "small", tracer: Tracer = NULL_TRACER,
                 **engine_options):
        self.engine = Engine.from_pretrained(model, EngineConfig(**engine_options), tracer)
        self.cfg, self.model, self.tokenizer = self.engine.cfg, self.engine.model, \
            self.engine.tokenizer
        if self.tokenizer is None:
            raise FileNotFoundError(f"{model}: no tokenizer.json (LLM needs one)")

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
                self.engine.forget(r)
            raise
        return rids

    def stream(self, prompts: Prompt | Sequence[Prompt],
               sampling: SamplingParams | Sequence[SamplingParams] | None = None,
               ) -> Iterator[tuple[int, RequestOutput]]:
        """(prompt index, the engine's record) per request and step, as they are produced."""
        rids = self._add(prompts, sampling)
        index = {r: i for i, r in enumerate(rids)}
        todo = set(rids)
        try:
            while todo:
                for out in self.engine.step():
                    if out.rid in todo:
                        if out.finished:
                            todo.discard(out.rid)
                        yield index[out.rid], out
        finally:  # a consumer that stops early must not leave requests holding the pools
            for r in todo:
                self.engine.abort(r)
            for r in rids:
                self.engine.forget(r)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[Completion]:
        rids = self._add(prompts, sampling)
        index = {r: i for i, r in enumerate(rids)}
        texts, lps = [""] * len(rids), [[] for _ in rids]
        done: dict[int, Completion] = {}
        with tqdm(total=len(rids), desc="generate", disable=not use_tqdm) as bar:
            while len(done) < len(rids):
                for out in self.engine.step():
                    i = index.get(out.rid)
                    if i is None:
                        continue
                    texts[i] += out.text_delta
                    lps[i].extend(out.logprobs or ())
                    if out.finished:
                        done[i] = self._completion(i, out, texts[i], lps[i])
                        bar.update(1)
        return [done[i] for i in range(len(rids))]

    def _completion(self, index: int, out: RequestOutput, text: str,
                    logprobs: list[TokenLogprob]) -> Completion:
        req = self.engine.request(out.rid)
        asked = req.params.logprobs is not None
        done = Completion(index, req.prompt_ids, req.output_ids, text, out.finish_reason.value,
                          req.cached_tokens, req.num_preemptions, logprobs if asked else None,
                          out.matched_stop)
        self.engine.forget(out.rid)
        return done
