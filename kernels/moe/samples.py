"""Routing samples: the top-k expert ids a model chose, per MoE layer and forward step.

A sample is one router call: ``ids`` [T, A] for the T tokens of one step at one layer. Samples are
captured from real model runs (``glmlab.bench.routing.capture_routing``, a layer above the model)
or read from a file, and turned into M-token routes for
the tuner and benchmarks (``routes_for_m``) with the skew of real routing kept: the rows of one
route come from one layer (pooled over its steps), as in a real batch.

File format (``save``/``load``; NOTES.md): one safetensors file, tensor ``layer{L}.step{S}`` =
ids [T, A] int16 per sample, metadata ``format=glmlab-routing/1``, ``num_experts``, ``top_k``,
``source`` (free text: model, prompts, date). Nothing here knows about kernels or tiles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FORMAT = "glmlab-routing/1"
_NAME = re.compile(r"layer(\d+)\.step(\d+)")


@dataclass(frozen=True)
class RoutingSample:
    layer: int
    step: int
    ids: torch.Tensor  # [T, A] int64 on the CPU


@dataclass(frozen=True)
class RoutingSamples:
    samples: tuple[RoutingSample, ...]
    num_experts: int
    top_k: int
    source: str = ""

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def layers(self) -> list[int]:
        return sorted({s.layer for s in self.samples})

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {f"layer{s.layer}.step{s.step}": s.ids.to(torch.int16).contiguous()
                   for s in self.samples}
        meta = {"format": FORMAT, "num_experts": str(self.num_experts),
                "top_k": str(self.top_k), "source": self.source}
        save_file(tensors, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> RoutingSamples:
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: not a routing-sample file (format {meta.get('format')!r})")
        samples = []
        for name, ids in load_file(str(path)).items():
            layer, step = map(int, _NAME.fullmatch(name).groups())
            samples.append(RoutingSample(layer, step, ids.long()))
        samples.sort(key=lambda s: (s.layer, s.step))
        return cls(tuple(samples), int(meta["num_experts"]), int(meta["top_k"]),
                   meta.get("source", ""))

    def split(self, heldout_fraction: float = 0.25) -> tuple[RoutingSamples, RoutingSamples]:
        """(train, held-out) by whole samples: every k-th sample of each layer is held out."""
        if not 0 < heldout_fraction < 1:
            raise ValueError("heldout_fraction must be in (0, 1)")
        every = max(2, round(1 / heldout_fraction))
        train, held = [], []
        for layer in self.layers:
            mine = [s for s in self.samples if s.layer == layer]
            for i, s in enumerate(mine):
                (held if i % every == every - 1 else train).append(s)
        if not held or not train:
            raise ValueError(f"{len(self)} samples are too few to hold out {heldout_fraction:.0%}")
        return self._with(train), self._with(held)

    def _with(self, samples) -> RoutingSamples:
        return RoutingSamples(tuple(samples), self.num_experts, self.top_k, self.source)

    def expert_load(self) -> torch.Tensor:
        """Pairs routed to each expert over all samples: [E] int64."""
        ids = torch.cat([s.ids.reshape(-1) for s in self.samples])
        return torch.bincount(ids[ids >= 0], minlength=self.num_experts)


def routes_for_m(samples: RoutingSamples, m: int, count: int, seed: int = 0
                 ) -> list[torch.Tensor]:
    """``count`` routes of ``m`` tokens ([m, A] int64), each drawn from one layer's samples.

    Layers are visited round-robin; a route takes m rows without replacement from the pooled
    rows of its layer (with replacement only when the layer has fewer than m rows).
    """
    gen = torch.Generator().manual_seed(seed)
    pools = {layer: torch.cat([s.ids for s in samples.samples if s.layer == layer])
             for layer in samples.layers}
    routes = []
    for i in range(count):
        pool = pools[samples.layers[i % len(pools)]]
        if pool.shape[0] >= m:
            rows = torch.randperm(pool.shape[0], generator=gen)[:m]
        else:
            rows = torch.randint(0, pool.shape[0], (m,), generator=gen)
        routes.append(pool[rows])
    return routes


def uniform_routes(num_experts: int, top_k: int, m: int, count: int, seed: int = 0
                   ) -> list[torch.Tensor]:
    """Routes with top-k of uniform random scores (what random-gating tuners use)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(m, num_experts, generator=gen).topk(top_k, dim=-1).indices
            for _ in range(count)]


def uniform_samples(num_experts: int, top_k: int, rows: int, count: int, seed: int = 0
                    ) -> RoutingSamples:
    """``count`` one-layer samples of uniform top-k routes: the random-gating baseline."""
    routes = uniform_routes(num_experts, top_k, rows, count, seed)
    return RoutingSamples(tuple(RoutingSample(0, i, r) for i, r in enumerate(routes)),
                          num_experts, top_k, f"uniform top-k over {num_experts} (random gating)")


def local_ids(ids: torch.Tensor, rank: int, num_local: int) -> torch.Tensor:
    """Expert-parallel view: global ids -> this rank's local ids, other ranks' experts -> -1."""
    local = ids - rank * num_local
    return torch.where((local >= 0) & (local < num_local), local, torch.full_like(local, -1))


def padded_rows(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[int, int]:
    """(real pair rows, rows after padding every expert to block_m) for one route."""
    counts = torch.bincount(ids[(ids >= 0) & (ids < num_experts)].reshape(-1),
                            minlength=num_experts)
    return int(counts.sum()), int(((counts + block_m - 1) // block_m * block_m).sum())
