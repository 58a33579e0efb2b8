"""transformers 5.23's GLM-5.3-Flash as an independent oracle for glmlab's model.

transformers picks fla's Triton kernels for KDA whenever ``import fla`` succeeds at the moment its
GLM modeling module is imported; on a CPU those kernels fail ("0 active drivers"). The oracle must
run transformers' own pure-torch path, so ``fla`` is made unimportable for exactly that import and
the choice is verified afterwards.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

_MODELING = "transformers.models.glm5_next.modeling_glm5_next"


def _import_modeling_without_fla():
    if _MODELING in sys.modules:
        mod = sys.modules[_MODELING]
    else:
        saved = {k: v for k, v in sys.modules.items() if k == "fla" or k.startswith("fla.")}
        for k in saved:
            del sys.modules[k]
        sys.modules["fla"] = None  # makes `import fla` raise ImportError
        try:
            mod = importlib.import_module(_MODELING)
        finally:
            del sys.modules["fla"]
            sys.modules.update(saved)
    for fn in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"):
        impl = getattr(mod, fn)
        if "fla" in (getattr(impl, "__module__", "") or "") or not _is_torch_fallback(impl):
            raise RuntimeError(f"transformers bound {fn} to a non-torch kernel; oracle unusable")
    return mod


def _is_torch_fallback(wrapped) -> bool:
    closure = dict(
        zip(
            wrapped.__code__.co_freevars,
            (c.cell_contents for c in wrapped.__closure__ or ()),
            strict=False,
        )
    )
    return closure.get("is_new_implementation", False) is False


def load_hf_model(path: str | Path, dtype: torch.dtype = torch.float32):
    """``Glm5NextForConditionalGeneration`` from a checkpoint directory (eager attention, eval)."""
    from transformers.utils import logging

    mod = _import_modeling_without_fla()
    logging.set_verbosity_error()
    model, info = mod.Glm5NextForConditionalGeneration.from_pretrained(
        str(path), dtype=dtype, attn_implementation="eager", output_loading_info=True
    )
    # Only the vision tower (absent from glmlab checkpoints) may be missing, and only the MTP
    # layer (which transformers does not implement) may be left unused.
    text_missing = [k for k in info["missing_keys"] if not k.startswith("model.visual.")]
    mtp = f"model.language_model.layers.{model.config.text_config.num_hidden_layers}."
    text_unused = [k for k in info["unexpected_keys"] if not k.startswith(mtp)]
    if text_missing or text_unused or info.get("mismatched_keys"):
        raise RuntimeError(
            f"transformers could not map the checkpoint: missing {text_missing}, "
            f"unexpected {text_unused}, mismatched {info.get('mismatched_keys')}"
        )
    return model.eval()


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """Full-forward logits [S, V] (fp32) for one prompt, no cache."""
    out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()
