"""The mapping between checkpoint tensor names (docs/model.md section 4) and ``GLM5Model`` parameters.

Checkpoint names live under ``model.language_model.`` (``lm_head.weight`` has no prefix); the MTP
layer is ``layers.{num_layers}``. glmlab keeps the checkpoint's names except where its layout
differs on purpose:

  hc_{attn,ffn}_{fn,base,scale}                 <-> hc_{attn,ffn}.{fn,base,scale}
  self_attn.{q,k,v}_conv1d.weight, o_norm.weight <-> parameters without the ``.weight`` suffix
  mlp.experts.{e}.{gate,up}_proj.weight         <-> rows of the stacked ``mlp.experts.w13``
  mlp.experts.{e}.down_proj.weight              <-> ``mlp.experts.w2[e]``
  layers.{num_layers}.*                         <-> mtp.*

Linear weights may carry a ``<name>_scale_inv`` sibling (block-FP8).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from glmlab.config import ModelConfig

PREFIXES = ("model.language_model.", "model.")  # published multimodal layout, then text-only
SCALE_SUFFIX = "_scale_inv"

_TO_MODEL = [
    (re.compile(r"\.hc_(attn|ffn)_(fn|base|scale)$"), r".hc_\1.\2"),
    (re.compile(r"\.self_attn\.(q|k|v)_conv1d\.weight$"), r".self_attn.\1_conv1d"),
    (re.compile(r"\.self_attn\.o_norm\.weight$"), ".self_attn.o_norm"),
]
_TO_CKPT = [
    (re.compile(r"\.hc_(attn|ffn)\.(fn|base|scale)$"), r".hc_\1_\2"),
    (re.compile(r"\.self_attn\.(q|k|v)_conv1d$"), r".self_attn.\1_conv1d.weight"),
    (re.compile(r"\.self_attn\.o_norm$"), ".self_attn.o_norm.weight"),
]
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


@dataclass(frozen=True)
class ExpertRef:
    """Checkpoint tensor of one routed expert: which stack, which expert, which part."""

    stack: str  # model name of the stacked parameter (..mlp.experts.w13 or ..w2)
    expert: int
    part: str  # gate | up | down


def _layer_to_model(name: str, mtp_layer: int | None) -> str:
    """'layers.{i}.rest' -> 'layers.{i}.rest' or 'mtp.rest' for the MTP layer."""
    m = re.match(r"^layers\.(\d+)\.(.*)$", name)
    if m and mtp_layer is not None and int(m.group(1)) == mtp_layer:
        return "mtp." + m.group(2)
    return name


def to_model_name(ckpt_name: str, prefix: str, cfg: ModelConfig) -> str | ExpertRef | None:
    """Model parameter for a checkpoint tensor; None if the tensor is not part of the text model."""
    if ckpt_name == "lm_head.weight":
        return ckpt_name
    if not ckpt_name.startswith(prefix):
        return None
    name = _layer_to_model(ckpt_name[len(prefix) :], cfg.mtp_layer)
    m = _EXPERT.match(name)
    if m:
        stack = m.group(1) + (".w2" if m.group(3) == "down" else ".w13")
        return ExpertRef(stack=stack, expert=int(m.group(2)), part=m.group(3))
    for pattern, repl in _TO_MODEL:
        name = pattern.sub(repl, name)
    return name


def to_ckpt_name(model_name: str, cfg: ModelConfig, prefix: str = PREFIXES[0]) -> str:
    """Checkpoint name of a (non-expert) model parameter."""
    if model_name == "lm_head.weight":
        return model_name
    name = model_name
    if name.startswith("mtp."):
        name = f"layers.{cfg.mtp_layer}." + name[len("mtp.") :]
    for pattern, repl in _TO_CKPT:
        name = pattern.sub(repl, name)
    return prefix + name


def expert_ckpt_names(
    stack: str, num_experts: int, cfg: ModelConfig, prefix: str = PREFIXES[0]
) -> list[tuple[int, str, str]]:
    """(expert, part, checkpoint name) for every tensor that forms a stacked expert parameter."""
    base = to_ckpt_name(stack.rsplit(".", 1)[0], cfg, prefix)
    parts = ("down",) if stack.endswith(".w2") else ("gate", "up")
    return [(e, p, f"{base}.{e}.{p}_proj.weight") for e in range(num_experts) for p in parts]
