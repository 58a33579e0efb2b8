"""Side-by-side comparison of glmlab and transformers on one checkpoint (the parity report).

Used by the parity tests, the tour notebook and ``glmlab parity``; every number in a closing note
about model parity comes from here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from glmlab.checkpoint.loader import load_model
from glmlab.core import SamplingParams
from glmlab.model.dsa import DSAttention
from glmlab.model.glm import GLM5Model
from glmlab.model.session import Session
from glmlab.testing.oracle import hf_logits, load_hf_model


@dataclass(frozen=True)
class LogitsDiff:
    prompt_len: int
    max_abs: float
    max_rel: float  # max |a - b| / max |b|
    rel_rms: float
    argmax_agree: float
    min_selection_margin: float  # smallest gap at the top-k cut of any sparse query (inf if dense)

    def row(self) -> dict:
        return asdict(self)


def prompt_ids(length: int, seed: int, vocab: int = 256) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=g).tolist()


@torch.inference_mode()
def selection_margins(model: GLM5Model, ids: list[int]) -> float:
    """Smallest score gap between the last kept and first dropped pool, over every DSA layer and
    sparse query of a full forward of ``ids``. Tiny gaps would make top-k tie-breaking (which
    differs between implementations) decide the result, so parity tests require a clear margin."""
    captured: list[tuple[DSAttention, torch.Tensor]] = []
    hooks = [
        m.register_forward_pre_hook(lambda mod, args: captured.append((mod, args[0])))
        for m in model.modules()
        if isinstance(m, DSAttention) and m is not getattr(model.mtp, "self_attn", None)
    ]
    try:
        Session(model, max_len=len(ids)).forward({0: ids})
    finally:
        for h in hooks:
            h.remove()
    margin = float("inf")
    for attn, h in captured:
        margin = min(margin, _layer_margin(attn, h))
    return margin


def _layer_margin(attn: DSAttention, h: torch.Tensor) -> float:
    from glmlab.kernels.dsa.ref import indexer_scores_ref, pool_keys_ref

    d = attn.cfg
    q_lat = attn.q_a_layernorm(attn.q_a_proj(h))
    q, k, gate, w = attn.indexer.project(h, q_lat)
    num_pools = h.shape[0] // d.index_kpool
    if num_pools <= d.topk_pools:
        return float("inf")
    n = num_pools * d.index_kpool
    keys = pool_keys_ref(k[:n], gate[:n], attn.indexer.index_kpool_compress_ape)
    scores = indexer_scores_ref(q, keys, w, d.index_head_dim**-0.5)  # [T, P]
    ends = torch.arange(num_pools) * d.index_kpool + d.index_kpool - 1
    margin = float("inf")
    for t in range(h.shape[0]):
        valid = scores[t][ends <= t]
        if valid.numel() > d.topk_pools:
            top = valid.topk(d.topk_pools + 1).values
            margin = min(margin, float(top[-2] - top[-1]))
    return margin


def compare_logits(
    path: str | Path, lengths: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0
) -> list[LogitsDiff]:
    hf = load_hf_model(path, dtype=dtype)
    ours = load_model(path, dtype=dtype)
    rows = []
    for i, n in enumerate(lengths):
        ids = prompt_ids(n, seed + i)
        a = Session(ours, max_len=n).logits({0: ids})[0]
        b = hf_logits(hf, ids)
        diff = (a - b).abs()
        rows.append(
            LogitsDiff(
                prompt_len=n,
                max_abs=float(diff.max()),
                max_rel=float(diff.max() / b.abs().max()),
                rel_rms=float((a - b).norm() / b.norm()),
                argmax_agree=float((a.argmax(-1) == b.argmax(-1)).float().mean()),
                min_selection_margin=selection_margins(ours, ids),
            )
        )
    return rows


@torch.inference_mode()
def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """transformers' own generate(): greedy, its cache, no early stop."""
    out = hf.generate(
        torch.tensor([ids]),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()


def compare_greedy(
    path: str | Path, ids: list[int], n: int = 32, dtype: torch.dtype = torch.float32
) -> tuple[list[int], list[int]]:
    hf = load_hf_model(path, dtype=dtype)
    ours = load_model(path, dtype=dtype)
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)
    mine = Session(ours, max_len=len(ids) + n).generate(0, ids, params)
    return mine, hf_greedy(hf, ids, n)
