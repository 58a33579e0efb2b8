"""One body's sub-requests on a worker: open them all, fold their records, merge their streams.

A ``GenBatch`` holds one ``GenRequest`` per prompt, each with ``params.n`` samples. A prompt is
ONE engine request whenever the worker can (``worker.one_prefill``): ``params.n`` samples forked
after one prefill, their records under ``sample_rid(rid, i)``; in PD the prefill computes and
sends the prompt once, in the room of sample 0, and decode forks the samples from the one import
(pd.py). Otherwise (a grammar, or speculation in PD) each sample is its own sub-request, with
its own bootstrap room (room + i, as SGLang's workers expand them) and the seed the fork would
give it (``sample_seed``), so a seeded request samples the same either way.

Every sub-request is validated by the engine before any answer starts (an ``InvalidRequest``
closes the ones already opened). ``Sub.results()`` folds records into its ``Result``;
``merge`` interleaves several of them for a stream. Knows the worker's open/records API.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from glmlab.core import sample_rid
from glmlab.sampling import sample_seed
from glmlab.serve.responses import Result
from glmlab.serve.schemas import GenBatch, GenRequest


@dataclass
class Sub:
    result: Result
    records: object  # the worker's Records (async iterator with aclose)
    sample: int = 0  # which of the prompt's n samples (metrics count a prompt at sample 0)

    async def results(self, on_done: Callable[..., None] | None = None
                      ) -> AsyncIterator[Result]:
        """``on_done(sub, ttft, e2e, gaps)``: gaps = (seconds since the previous record
        with tokens, its token count) for every later one (inter-token latency)."""
        loop = asyncio.get_running_loop()
        start, first, last, gaps = loop.time(), None, None, []
        try:
            async for out in self.records:
                if out.new_token_ids:
                    now = loop.time()
                    if first is None:
                        first = now
                    else:
                        gaps.append((now - last, len(out.new_token_ids)))
                    last = now
                self.result.add(out)
                yield self.result
                if self.result.finish_reason is not None:
                    break
        finally:
            await self.records.aclose()
            if on_done is not None:
                on_done(self, None if first is None else first - start,
                        loop.time() - start, gaps)


def per_sample(req: GenRequest) -> list[GenRequest]:
    """The n samples of ``req`` as n requests of one sample each (PD, or a grammar)."""
    p = req.params
    out = []
    for i in range(p.n):
        seed = p.seed if p.seed is None else sample_seed(p.seed, i)
        params = dataclasses.replace(p, n=1, seed=seed)
        boot = req.bootstraps[i] if req.bootstraps else req.bootstrap
        out.append(dataclasses.replace(req, rid=sample_rid(req.rid, i), params=params,
                                       bootstrap=boot, bootstraps=(boot,)))
    return out


async def open_batch(worker, batch: GenBatch, encode: Callable[[str], list[int]]) -> list[Sub]:
    """Open every sub-request of ``batch`` (choice index = prompt x n + sample)."""
    subs: list[Sub] = []
    n = batch.n
    try:
        for p_i, req in enumerate(batch.requests):
            ids = list(req.input_ids) if req.input_ids is not None else encode(req.text)
            if n > 1 and worker.one_prefill(req):
                metas = [{} for _ in range(n)]
                recs = await worker.open_samples(req, ids, metas)
                pairs = list(zip(range(n), recs, metas, strict=True))
            else:
                pairs = []
                for j, one in enumerate(per_sample(req) if n > 1 else [req]):
                    meta: dict = {}
                    pairs.append((j, await worker.open(one, ids, meta), meta))
            for j, recs, meta in pairs:
                result = Result(sample_rid(req.rid, j), len(ids), index=p_i * n + j,
                                prompt_ids=tuple(ids), meta=meta)
                subs.append(Sub(result, recs, j))
    except BaseException:
        for s in subs:
            await s.records.aclose()
        raise
    return subs


async def merge(streams: list[AsyncIterator[Result]]) -> AsyncIterator[Result]:
    """Results from several sub-request streams as each arrives; closing it closes them all."""
    if len(streams) == 1:
        async for r in streams[0]:
            yield r
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream):
        try:
            async for r in stream:
                await queue.put(copy.copy(r))  # this record's delta, before the next one
        except BaseException as e:  # noqa: BLE001 - handed to the reader
            await queue.put(e)
        finally:
            await queue.put(done)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    left = len(tasks)
    try:
        while left:
            item = await queue.get()
            if item is done:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            await s.aclose()
