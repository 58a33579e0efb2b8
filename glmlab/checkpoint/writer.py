"""Write checkpoints in the published layout: random weights for any config, or a model's own.

``write_random_checkpoint`` is how every test, notebook and benchmark gets a model (no hub at run
time). Weights are drawn so activations stay O(1) through the stack and every path is non-trivial:
the constants transformers would initialise (``A_log``, ``dt_bias``, mHC ``base``/``scale``, the
correction bias, the k-pool ``ape``) are randomised too. Each tensor's values depend only on the
seed and its name, not on iteration order or device.

With ``fp8=True`` the tensors the release stores as FP8 (DSA projections except ``kv_b_proj``,
dense MLPs, shared and routed experts) are written as E4M3 with block-128 ``weight_scale_inv``.
"""

from __future__ import annotations

import copy
import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from glmlab.checkpoint.names import SCALE_SUFFIX, expert_ckpt_names, to_ckpt_name
from glmlab.checkpoint.store import INDEX_FILE
from glmlab.checkpoint.tokenizer import write_tokenizer_files
from glmlab.config import ModelConfig
from glmlab.kernels.fp8.ref import quant_block_fp8
from glmlab.model.dsa import DSAttention
from glmlab.model.glm import GLM5Model
from glmlab.model.mlp import MLP
from glmlab.model.moe import Experts

_FP8_DSA = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj")


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    return torch.Generator(device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def _random_value(name: str, shape: torch.Size, gen: torch.Generator, device) -> torch.Tensor:
    """A plausible random value for one parameter, chosen by its role (name)."""

    def normal(std, mean=0.0):  # in place: one layer's expert stack is 18 GiB in fp32
        return torch.randn(shape, generator=gen, device=device).mul_(std).add_(mean)

    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A_log":
        return normal(0.3)
    if leaf == "dt_bias":
        return normal(1.0, -3.0)  # slow-ish decay: g ~ -5*sigmoid(-3) ~ -0.24 per step
    if leaf.endswith("_conv1d"):
        return normal(0.5)
    if leaf == "fn":
        return normal(0.5 / math.sqrt(shape[-1]))
    if leaf == "base":
        return normal(0.5)
    if leaf == "scale":
        return torch.rand(shape, generator=gen, device=device) + 0.5
    if leaf == "e_score_correction_bias":
        return normal(0.1)
    if leaf == "index_kpool_compress_ape":
        return normal(0.5)
    if name.endswith("embed_tokens.weight"):
        return normal(1.0)
    if leaf == "bias":  # LayerNorm bias
        return normal(0.1)
    if len(shape) == 1 or leaf == "o_norm":  # norm weights
        return normal(0.1, 1.0)
    return normal(1.0 / math.sqrt(shape[-1]))  # [.., out, in] projections


@torch.no_grad()
def init_random_(model: GLM5Model, seed: int = 0) -> GLM5Model:
    for name, p in model.named_parameters():
        device = p.device if p.device.type != "meta" else torch.device("cpu")
        value = _random_value(name, p.shape, _generator(seed, name, device), device)
        p.data = value.to(p.dtype) if p.device.type != "meta" else value
    return model


def random_parameter(name: str, shape: tuple[int, ...], seed: int,
                     device: torch.device | str) -> torch.Tensor:
    """The fp32 value ``init_random_`` gives parameter ``name`` on ``device``, without building
    the rest of the model (a tensor-parallel rank draws the parameters it keeps)."""
    device = torch.device(device)
    return _random_value(name, torch.Size(shape), _generator(seed, name, device), device)


def fp8_parameter_names(model: GLM5Model) -> set[str]:
    """Parameters a ``fp8=True`` checkpoint stores as block-FP8 (``checkpoint_tensors``)."""
    return _fp8_params(model)


def stored_in_fp32(name: str) -> bool:
    """Whether a checkpoint keeps parameter ``name`` in fp32 (the rest is written as bf16)."""
    return _is_fp32_in_release(name)


def _fp8_params(model: GLM5Model) -> set[str]:
    """Model parameters the release stores as block-FP8."""
    names = set()
    for mod_name, m in model.named_modules():
        if isinstance(m, DSAttention):
            names |= {f"{mod_name}.{p}.weight" for p in _FP8_DSA}
        elif isinstance(m, MLP):
            names |= {f"{mod_name}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        elif isinstance(m, Experts):
            names |= {f"{mod_name}.w13", f"{mod_name}.w2"}
    return names


def checkpoint_tensors(
    model: GLM5Model, cfg: ModelConfig, fp8: bool, dtype: torch.dtype = torch.bfloat16
) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) pairs in the published layout, produced one by one."""
    quantize = _fp8_params(model) if fp8 else set()
    block = cfg.fp8.block if cfg.fp8 else (128, 128)
    for name, p in model.named_parameters():
        if p.dtype == torch.float8_e4m3fn:
            raise ValueError("export of an FP8-kept model is not supported; load it dequantised")
        if name.endswith((".w13", ".w2")):
            yield from _expert_tensors(name, p, cfg, name in quantize, dtype, block)
            continue
        ckpt = to_ckpt_name(name, cfg)
        value = p.detach()
        keep_fp32 = value.dtype == torch.float32 and _is_fp32_in_release(name)
        if name in quantize:
            q, s = quant_block_fp8(value, block)
            yield ckpt, q
            yield ckpt + SCALE_SUFFIX, s
        else:
            yield ckpt, value if keep_fp32 else value.to(dtype)


def _is_fp32_in_release(name: str) -> bool:
    return name.endswith(("dt_bias", "A_log", ".base", ".scale", "e_score_correction_bias"))


def _expert_tensors(name, stack, cfg, quantize, dtype, block):
    inter = cfg.moe.intermediate_size
    for e, part, ckpt in expert_ckpt_names(name, stack.shape[0], cfg):
        w = stack[e] if part == "down" else stack[e, :inter] if part == "gate" else stack[e, inter:]
        if quantize:
            q, s = quant_block_fp8(w.detach(), block)
            yield ckpt, q
            yield ckpt + SCALE_SUFFIX, s
        else:
            yield ckpt, w.detach().to(dtype)


def save_checkpoint(
    model: GLM5Model,
    cfg: ModelConfig,
    out: str | Path,
    fp8: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = 5 << 30,
) -> Path:
    """Write config.json, safetensors (sharded past ``max_shard_bytes``) and tokenizer files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(cfg.source)
    if fp8:
        config["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(cfg.fp8.block if cfg.fp8 else (128, 128)),
        }
    else:
        config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_shards(checkpoint_tensors(model, cfg, fp8, dtype), out, max_shard_bytes)
    write_tokenizer_files(
        out,
        list(cfg.eos_token_ids) or [256],
        cfg.pad_token_id if cfg.pad_token_id is not None else 256,
    )
    return out


def _write_shards(tensors, out: Path, max_bytes: int) -> None:
    shards, current, size, total = [], {}, 0, 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = t.contiguous().cpu()
        size += nbytes
        total += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def write_random_checkpoint(
    config: dict | ModelConfig,
    out: str | Path,
    seed: int = 0,
    fp8: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    max_shard_bytes: int = 5 << 30,
) -> Path:
    """A random checkpoint for any config, in the published layout (bf16 or the real FP8 one)."""
    cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_hf(config)
    with torch.device(device):
        model = GLM5Model(cfg)
    init_random_(model.to(torch.float32), seed)
    return save_checkpoint(model, cfg, out, fp8=fp8, dtype=dtype, max_shard_bytes=max_shard_bytes)
