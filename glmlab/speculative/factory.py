"""Build a drafter and a ``SpecDecoder`` from a ``SpecConfig``: the one place the settings land.

Used by the engine, ``glmlab generate --speculative``, the bench and the notebooks, so a setting
means the same thing everywhere. A DFlash2 drafter needs a draft checkpoint (``draft_path``) or a
ready ``DFlashDraftModel``; its draft KV is sized to the layout's token slots.
"""

from __future__ import annotations

from glmlab.model.glm import GLM5Model
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.cycle import SpecDecoder
from glmlab.speculative.dflash import DFlashDrafter, DFlashDraftModel
from glmlab.speculative.dflash_io import load_draft
from glmlab.speculative.draft_kv import DraftKVLayout, DraftKVStore
from glmlab.speculative.mtp import MTPDrafter
from glmlab.speculative.sim import SimulatedAcceptance
from glmlab.speculative.types import CacheLayout, Drafter


def make_drafter(model: GLM5Model, layout: CacheLayout, spec: SpecConfig,
                 draft: DFlashDraftModel | None = None, tokenizer=None) -> Drafter:
    if spec.algorithm == "mtp":
        return MTPDrafter(model, layout, spec.num_steps)
    if draft is None:
        if spec.draft_path is None:
            raise ValueError("dflash2 needs a draft checkpoint (draft_path)")
        draft = load_draft(spec.draft_path, model.cfg, dtype=model.dtype,
                           device=model.embed_tokens.weight.device, tokenizer=tokenizer)
    if draft.cfg.block_size != spec.block_size:
        raise ValueError(f"the draft was trained for block size {draft.cfg.block_size}, "
                         f"not {spec.block_size}")
    c = draft.cfg
    kv = DraftKVStore(DraftKVLayout(c.num_layers, c.num_kv_heads, c.head_dim, spec.draft_kv_dtype),
                      layout.cache.num_token_slots, model.embed_tokens.weight.device)
    return DFlashDrafter(model, draft, layout, kv)


def make_decoder(model: GLM5Model, layout: CacheLayout, spec: SpecConfig,
                 draft: DFlashDraftModel | None = None, tokenizer=None, seed: int = 0,
                 store_rows: int | None = None) -> SpecDecoder:
    drafter = make_drafter(model, layout, spec, draft, tokenizer)
    sim = (SimulatedAcceptance(spec.simulate_accept_len, spec.width, spec.simulate_mode, seed)
           if spec.simulated else None)
    return SpecDecoder(model, layout, drafter, spec.commit, simulate=sim, store_rows=store_rows)
