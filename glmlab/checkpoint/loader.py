"""Load a GLM-5.3-Flash checkpoint in the published layout into a ``GLM5Model``.

Accepts the released layout (multimodal, ``model.language_model.*``, FP8 block-128 weights with
``weight_scale_inv``, the MTP layer as ``layers.45``), a bf16 twin of it, and what transformers'
``save_pretrained`` writes (same names, fp32-kept tensors stored in fp32). Vision tensors are
ignored.

Every expected tensor must be present with the right shape and a usable dtype; anything under the
text prefix that glmlab does not know is an error too, because a silently ignored tensor is a
silently different model. FP8 weights are either dequantised at load (``fp8="dequantize"``, the
reference path) or kept as E4M3 + scales (``fp8="keep"``) for block-FP8 kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch import nn

from glmlab.checkpoint.names import PREFIXES, SCALE_SUFFIX, ExpertRef, to_model_name
from glmlab.checkpoint.store import CheckpointError, TensorStore
from glmlab.config import ModelConfig
from glmlab.kernels.fp8.ref import dequant_block_fp8
from glmlab.model.glm import FP32_PARAMS, GLM5Model
from glmlab.model.layers import Linear
from glmlab.model.moe import Experts

FP8Mode = Literal["dequantize", "keep"]
_FLOAT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
_FP8 = "F8_E4M3"


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    fp8: FP8Mode = "dequantize",
    with_mtp: bool = True,
) -> GLM5Model:
    cfg = ModelConfig.from_hf(path)
    store = TensorStore(path)
    with torch.device("meta"):
        model = GLM5Model(cfg, with_mtp=with_mtp)
    _Loader(model, cfg, store, dtype, torch.device(device), fp8).run()
    return model.eval()


class _Loader:
    def __init__(self, model, cfg, store, dtype, device, fp8_mode):
        self.model, self.cfg, self.store = model, cfg, store
        self.dtype, self.device, self.fp8_mode = dtype, device, fp8_mode
        self.block = cfg.fp8.block if cfg.fp8 else (128, 128)
        self.prefix = self._detect_prefix()

    def _detect_prefix(self) -> str:
        names = set(self.store.names())
        for p in PREFIXES:
            if f"{p}embed_tokens.weight" in names:
                return p
        raise CheckpointError(
            f"{self.store.path}: no embedding tensor (looked for "
            + " or ".join(f"{p}embed_tokens.weight" for p in PREFIXES)
            + ")"
        )

    def run(self) -> None:
        plain, experts = self._plan()
        params = dict(self.model.named_parameters())
        expected_experts = {n for n, m in self.model.named_modules() if isinstance(m, Experts)}
        missing = [
            n for n in params if n not in plain and n.rsplit(".", 1)[0] not in expected_experts
        ]
        if self.cfg.tie_word_embeddings and "lm_head.weight" in missing:
            plain["lm_head.weight"] = plain[
                next(k for k in plain if k.endswith("embed_tokens.weight"))
            ]
            missing.remove("lm_head.weight")
        if missing:
            raise CheckpointError(f"{self.store.path}: missing tensors for {_short(missing)}")
        for name, ckpt in plain.items():
            self._load_plain(name, ckpt)
        for stack_module in sorted(expected_experts):
            self._load_experts(stack_module, experts)

    def _plan(self):
        """Sort checkpoint tensors into plain parameters and expert parts; reject unknown ones."""
        params = dict(self.model.named_parameters())
        plain, experts, unknown = {}, {}, []
        for ckpt in self.store.names():
            if ckpt.endswith(SCALE_SUFFIX):
                continue
            target = to_model_name(ckpt, self.prefix, self.cfg)
            if target is None:
                continue  # not part of the text model (vision tower, ...)
            if isinstance(target, ExpertRef):
                if target.stack.startswith("mtp.") and self.model.mtp is None:
                    continue
                experts[(target.stack, target.expert, target.part)] = ckpt
            elif target in params:
                plain[target] = ckpt
            elif target.startswith("mtp.") and self.model.mtp is None:
                continue
            elif ckpt.startswith(f"{self.prefix}layers.") and ".shared_head.head" in ckpt:
                continue  # some exports duplicate lm_head here; glmlab shares the main one
            else:
                unknown.append(ckpt)
        if unknown:
            raise CheckpointError(f"{self.store.path}: unexpected tensors {_short(unknown)}")
        return plain, experts

    def _target_dtype(self, name: str) -> torch.dtype:
        return torch.float32 if any(k in name for k in FP32_PARAMS) else self.dtype

    def _read(self, ckpt: str, shape: tuple[int, ...], fp8_ok: bool):
        """Read one tensor; returns (tensor, scale or None). Checks dtype and shape first."""
        st_dtype, st_shape = self.store.info(ckpt)
        if st_shape != tuple(shape):
            raise CheckpointError(
                f"tensor {ckpt} has shape {list(st_shape)}, expected {list(shape)}"
            )
        if st_dtype == _FP8:
            if not fp8_ok:
                raise CheckpointError(f"tensor {ckpt} is FP8 but glmlab expects bf16/fp32 there")
            return self.store.read(ckpt), self._read_scale(ckpt, shape)
        if st_dtype not in _FLOAT:
            raise CheckpointError(f"tensor {ckpt} has dtype {st_dtype}, expected BF16, F16 or F32")
        if ckpt + SCALE_SUFFIX in self.store.location:
            raise CheckpointError(f"tensor {ckpt} is {st_dtype} but has a {SCALE_SUFFIX} sibling")
        return self.store.read(ckpt), None

    def _read_scale(self, ckpt: str, shape: tuple[int, ...]) -> torch.Tensor:
        name = ckpt + SCALE_SUFFIX
        if name not in self.store.location:
            raise CheckpointError(f"FP8 tensor {ckpt} has no {name}")
        want = (-(-shape[0] // self.block[0]), -(-shape[1] // self.block[1]))
        st_dtype, st_shape = self.store.info(name)
        if st_shape != want or st_dtype not in _FLOAT:
            raise CheckpointError(f"{name} is {st_dtype}{list(st_shape)}, expected F32{list(want)}")
        return self.store.read(name).float()

    def _load_plain(self, name: str, ckpt: str) -> None:
        mod_name, attr = name.rsplit(".", 1)
        module = self.model.get_submodule(mod_name)
        shape = tuple(getattr(module, attr).shape)
        is_linear_weight = isinstance(module, Linear) and attr == "weight"
        t, scale = self._read(ckpt, shape, fp8_ok=is_linear_weight)
        if scale is not None and self.fp8_mode == "keep":
            module.set_fp8(t.to(self.device), scale.to(self.device), self.block)
            return
        if scale is not None:
            t = dequant_block_fp8(t, scale, self.dtype, self.block)
        value = t.to(device=self.device, dtype=self._target_dtype(name))
        setattr(module, attr, nn.Parameter(value, requires_grad=False))

    def _load_experts(self, module_name: str, parts: dict) -> None:
        module: Experts = self.model.get_submodule(module_name)
        e_count, two_i, d = module.w13.shape
        inter = two_i // 2
        stacks = {"w13": [], "w2": []}
        for e in range(e_count):
            row = []
            for part, stack, shape in (
                ("gate", "w13", (inter, d)),
                ("up", "w13", (inter, d)),
                ("down", "w2", (d, inter)),
            ):
                ckpt = parts.get((f"{module_name}.{stack}", e, part))
                if ckpt is None:
                    raise CheckpointError(
                        f"missing tensor for expert {e} {part}_proj of {module_name}"
                    )
                row.append((stack, *self._read(ckpt, shape, fp8_ok=True)))
            self._stack_expert(row, stacks)
        self._assign_experts(module, stacks)

    def _stack_expert(self, row, stacks) -> None:
        fp8 = [scale is not None for _, _, scale in row]
        if any(fp8) and not all(fp8):
            raise CheckpointError("an expert mixes FP8 and bf16 weights")
        (_, gate, gs), (_, up, us), (_, down, ds) = row
        keep = fp8[0] and self.fp8_mode == "keep"
        if keep and gate.shape[0] % self.block[0]:
            raise CheckpointError(
                f"fp8='keep' stacks gate and up rows, so moe_intermediate_size ({gate.shape[0]}) "
                f"must be a multiple of the FP8 block ({self.block[0]}); use fp8='dequantize'"
            )
        if fp8[0] and not keep:
            gate, up, down = (
                dequant_block_fp8(w, s, self.dtype, self.block)
                for w, s in ((gate, gs), (up, us), (down, ds))
            )
        w13 = torch.cat([gate, up]).to(self.device)
        stacks["w13"].append((w13, torch.cat([gs, us]).to(self.device) if keep else None))
        stacks["w2"].append((down.to(self.device), ds.to(self.device) if keep else None))

    def _assign_experts(self, module: Experts, stacks) -> None:
        w13 = torch.stack([w for w, _ in stacks["w13"]])
        w2 = torch.stack([w for w, _ in stacks["w2"]])
        if stacks["w13"][0][1] is not None:
            s13 = torch.stack([s for _, s in stacks["w13"]])
            s2 = torch.stack([s for _, s in stacks["w2"]])
            module.set_fp8(w13, s13, w2, s2, self.block)
            return
        module.w13 = nn.Parameter(w13.to(self.dtype), requires_grad=False)
        module.w2 = nn.Parameter(w2.to(self.dtype), requires_grad=False)


def _short(names: list[str], limit: int = 8) -> str:
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
