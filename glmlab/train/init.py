"""Initial weights for training from scratch, and which parameters the optimiser owns.

``glmlab.checkpoint.writer.init_random_`` draws weights that make every path of an *untrained*
model non-trivial (random mHC mixing, random correction biases); training wants the opposite
start: each mHC site close to a plain residual connection (comb near the identity, post = 1,
pre = 1/2), norms at 1, zero correction biases and LayerNorm biases, and residual-output
projections scaled by 1/sqrt(2L) so the streams do not grow with depth (GPT-2's rule). KDA's
decay parameters keep the writer's values (about -0.24 log decay per step, spread per channel).

Every tensor depends only on (seed, parameter name), as in the writer.
"""

from __future__ import annotations

import math
import zlib

import torch

from glmlab.model.glm import GLM5Model

_RESIDUAL_OUT = ("o_proj.weight", "down_proj.weight", "experts.w2")
NOT_TRAINED = ("e_score_correction_bias",)  # moved by load balance, not by gradients


def _gen(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def _value(name: str, shape: torch.Size, gen: torch.Generator, depth: int) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    randn = lambda: torch.randn(shape, generator=gen)  # noqa: E731
    if leaf == "A_log":
        return randn() * 0.3
    if leaf == "dt_bias":
        return randn() - 3.0
    if leaf.endswith("_conv1d"):
        return randn() / math.sqrt(shape[-1])
    if leaf == "fn":  # mHC projection: small, so the data-dependent part starts small
        return randn() * 0.1 / math.sqrt(shape[-1])
    if leaf == "base":
        return _mhc_base(shape[0])
    if leaf == "scale":
        return torch.ones(shape)
    if leaf in NOT_TRAINED or leaf == "bias" or leaf == "index_kpool_compress_ape":
        return torch.zeros(shape)
    if name.endswith("embed_tokens.weight"):
        return randn()
    if len(shape) == 1 or leaf == "o_norm":
        return torch.ones(shape)
    std = 1.0 / math.sqrt(shape[-1])
    if name.endswith(_RESIDUAL_OUT):
        std /= math.sqrt(2 * depth)
    return randn() * std


def _mhc_base(proj_dim: int) -> torch.Tensor:
    """pre 0 (sigmoid 1/2), post 0 (2 sigmoid = 1), comb logits 4 on the diagonal, 0 elsewhere."""
    n = int((math.sqrt(4 + 4 * proj_dim) - 2) / 2)  # proj_dim = (2 + n) n
    comb = torch.eye(n) * 4.0
    return torch.cat([torch.zeros(2 * n), comb.flatten()])


@torch.no_grad()
def init_for_training_(model: GLM5Model, seed: int = 0) -> GLM5Model:
    depth = model.cfg.num_layers + (1 if model.mtp is not None else 0)
    for name, p in model.named_parameters():
        p.data = _value(name, p.shape, _gen(seed, name), depth).to(p.device, p.dtype)
    return model


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Mark every float parameter but the correction biases as trainable; return them by name.

    (Serving modules create their weights with ``requires_grad=False``.)
    """
    out = []
    for name, p in model.named_parameters():
        train = p.is_floating_point() and not name.endswith(NOT_TRAINED)
        p.requires_grad_(train)
        if train:
            out.append((name, p))
    return out
