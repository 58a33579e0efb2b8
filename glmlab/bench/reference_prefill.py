"""The reference prefill point on one emulated rank: interleaved CP4 (TP4 KDA heads, EP4 experts).

The published prefill instance runs TP4 / EP1 / CP4 with FP8 MoE activation packets. glmlab's CP
prefill (``glmlab.distributed.cp.CPPrefill``) splits the routed experts over the CP group
(ep = cp), so rank r here holds 72 of the 288 experts, a quarter of the KDA heads, and every other
weight whole: ``random_cp_prefill`` draws it layer by layer with stand-in groups. A 64K prompt is
one step: rank r's 16K interleaved tokens, whose DSA queries select and attend over the gathered
64K latent rows and pooled indexer keys, whose KDA layers run the whole gathered sequence for the
rank's heads (reduce-scattered back), and whose MoE layers gather FP8 packets of every token.

Ops: the fast path's GEMMs, norms, mHC and router kernels, fla's chunked KDA and the TileLang
sparse MLA; KDA and DSA steps take their prefill paths (``kda_step`` / ``dsa_index`` torch: the
fused uniform-step kernels are for decode windows), the CP DSA selection is the chunked torch
reference and the CP expert GEMMs the grouped torch reference. ``measure`` returns rank r's time
for the step, the collectives it issued and the time per sublayer kind. Knows nothing about rows.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from glmlab.bench.layer_timer import LayerTimer
from glmlab.cache.storage import CacheDtypes
from glmlab.distributed.cp import CPConfig
from glmlab.distributed.ep_moe import MoEDispatch
from glmlab.distributed.fp8_packet import PacketKernels
from glmlab.distributed.parallel import ParallelLayout
from glmlab.distributed.random_shard import random_cp_prefill
from glmlab.distributed.standin import CollectiveRecorder, emulated_groups
from glmlab.model.backends import Backends
from glmlab.model.plan import ForwardPlan
from glmlab.presets import preset


def prefill_backends(fast: bool) -> Backends:
    if not fast:
        return Backends()
    return dataclasses.replace(Backends.fast(), kda_step="torch", dsa_index="torch")


@dataclass
class PrefillResult:
    tokens: int
    cp: int
    step_ms: float
    calls: list
    sublayer_ms: dict[str, float]
    warmup_tokens: int


class PrefillBench:
    def __init__(self, preset_name: str, cp: int, rank: int, recorder: CollectiveRecorder,
                 device: str, dtype: torch.dtype, fp8_mode: str, dtypes: CacheDtypes,
                 fast: bool, seed: int = 0):
        groups = emulated_groups(ParallelLayout(cp=cp, tp=cp, ep=cp), rank, recorder)
        kernels = PacketKernels.TRITON if fast else PacketKernels.TORCH
        self.runner = random_cp_prefill(preset(preset_name), groups,
                                        CPConfig(MoEDispatch.FP8_PACKET, kernels), seed=seed,
                                        fp8=True, fp8_mode=fp8_mode, dtype=dtype, device=device)
        self.runner.model.use_backends(prefill_backends(fast))
        self.cp, self.recorder, self.dtypes = cp, recorder, dtypes
        self.device = torch.device(device)

    def _step(self, tokens: int) -> float:
        page = 64
        cache = self.runner.new_cache(-(-tokens // page) * page, 1, page, self.dtypes)
        plan = ForwardPlan.build([tokens], [0], [0],
                                 torch.arange(cache.num_pages, device=self.device)[None], page)
        ids = torch.randint(0, self.runner.model.cfg.vocab_size, (tokens,),
                            generator=torch.Generator().manual_seed(tokens)).to(self.device)
        _sync(self.device)
        t = time.perf_counter()
        with torch.inference_mode():
            self.runner.forward(ids, plan, cache)
        _sync(self.device)
        ms = (time.perf_counter() - t) * 1e3
        del cache
        return ms

    def measure(self, tokens: int, warmup_tokens: int) -> PrefillResult:
        """One warm-up step of ``warmup_tokens`` (kernels compile), then the timed step with its
        collectives recorded and its sublayers timed (CUDA events in hooks: no synchronisation)."""
        with self.recorder.paused():
            if warmup_tokens:
                self._step(warmup_tokens)
        self.recorder.clear()
        with LayerTimer(self.runner.model) as timer:
            ms = self._step(tokens)
            sub = timer.by_kind()
        return PrefillResult(tokens, self.cp, ms, self.recorder.take(), sub, warmup_tokens)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
