"""Routing samples: capture from the tiny model, the file format, splits and M-token routes."""

from __future__ import annotations

import torch

from glmlab import presets
from glmlab.bench.routing import capture_routing
from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.writer import write_random_checkpoint
from glmlab.kernels.moe.samples import (
    RoutingSample,
    RoutingSamples,
    local_ids,
    padded_rows,
    routes_for_m,
)
from glmlab.model.moe import Router


def test_capture_records_every_moe_layer_and_step(tmp_path):
    write_random_checkpoint(presets.tiny(), tmp_path / "ckpt", seed=0)
    model = load_model(tmp_path / "ckpt", dtype=torch.float32)
    prompts = [list(range(3, 23)), list(range(40, 60))]
    samples = capture_routing(model, prompts, decode_steps=2, source="test", chunk=8)
    moe_layers = [i for i, layer in enumerate(model.layers) if hasattr(layer.mlp, "gate")]
    assert moe_layers == [1, 2, 3] and all(isinstance(model.layers[i].mlp.gate, Router)
                                          for i in moe_layers)
    assert samples.layers == moe_layers and samples.num_experts == 8 and samples.top_k == 2
    steps = sorted({s.step for s in samples.samples})
    assert steps == list(range(5))  # 3 prefill chunks (8 + 8 + 4 tokens) + 2 decode steps
    rows = {s.step: s.ids.shape[0] for s in samples.samples if s.layer == moe_layers[0]}
    assert rows == {0: 16, 1: 16, 2: 8, 3: 2, 4: 2}
    path = samples.save(tmp_path / "r.safetensors")
    back = RoutingSamples.load(path)
    assert back.source == "test" and len(back) == len(samples)
    by_key = sorted(samples.samples, key=lambda s: (s.layer, s.step))
    for a, b in zip(back.samples, by_key, strict=True):
        assert (a.layer, a.step) == (b.layer, b.step) and torch.equal(a.ids, b.ids)


def _samples(num_layers=2, steps=8, rows=32, e=16, a=4):
    gen = torch.Generator().manual_seed(0)
    out = [RoutingSample(layer, step, torch.stack([torch.randperm(e, generator=gen)[:a]
                                                   for _ in range(rows)]))
           for layer in range(num_layers) for step in range(steps)]
    return RoutingSamples(tuple(out), e, a, "synthetic")


def test_split_holds_out_whole_samples_per_layer():
    train, held = _samples().split(0.25)
    assert len(held) == 4 and len(train) == 12
    assert {(s.layer, s.step) for s in held.samples} == {(0, 3), (0, 7), (1, 3), (1, 7)}


def test_routes_for_m_draw_rows_of_one_layer():
    samples = _samples()
    routes = routes_for_m(samples, 100, count=3, seed=1)
    assert [r.shape for r in routes] == [(100, 4)] * 3
    layer0 = {tuple(r) for s in samples.samples if s.layer == 0 for r in s.ids.tolist()}
    assert all(tuple(r) in layer0 for r in routes[0].tolist())
    big = routes_for_m(samples, 1000, count=1)[0]  # more rows than the layer has: resampled
    assert big.shape == (1000, 4)


def test_local_ids_and_padding():
    ids = torch.tensor([[0, 71, 72, 287], [5, 144, 143, 100]])
    assert local_ids(ids, 1, 72).tolist() == [[-1, -1, 0, -1], [-1, -1, 71, 28]]
    assert padded_rows(torch.tensor([[0, 1], [0, 2], [0, -1]]), 4, 16) == (5, 48)
