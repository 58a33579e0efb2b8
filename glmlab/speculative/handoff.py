"""What a PD decode instance's drafter needs of a prompt that another instance prefilled.

A prefill instance with speculation configured lets its drafter learn the prompt exactly as a
mixed engine does (``engine_phase``: MTP draft-extend, DFlash2 draft-KV projection), including the
last prompt row, which pairs the final position with the first sampled token. The decode instance
then starts with the drafter state a mixed engine has after its prefill, so its first cycle
proposes the same drafts. ``DraftHandoff`` names that state as rows of tensors, in the units the
cache uses for its own regions (``ModelCache.regions()``): ``token`` rows (addressed by token
slot) and ``state`` rows (addressed by the request's state slot).

What is sent and what is not, and why:

- MTP: the MTP layer is a DSA layer of the target cache, so its own KV (latent rows, pooled
  indexer keys) and its per-request indexer tail already travel with the cache's regions. What
  lives outside the cache is the chain's starting point: the MTP output hidden state at the last
  prompt row (``[D]``) and its argmax, the first draft. They are staged here per state slot
  (``mtp.hidden``, ``mtp.first``) and sent; D values per request are negligible next to the KV.
  Recomputing instead would need the target's final hidden state of every prompt position on
  decode (``[n, D]``, more bytes than the MTP layer's own latent rows) plus an MTP forward over the
  whole prompt there, which is exactly the work PD moves off the decode GPUs.
- DFlash2: the drafter holds no per-request state; its context is draft K/V at the target's token
  slots (``draft_kv``), so those rows are sent with the pages they belong to (``draft.k.i``,
  ``draft.v.i`` and, in FP8, their scales). The alternative, sending the captured target features
  and projecting on decode, moves ``len(target_layer_ids) * D`` values per token instead of
  ``2 * layers * kv_heads * head_dim`` and spends decode compute; the draft KV is the smaller and
  already final form.

``describe()`` names what a drafter expects to receive, so two instances whose drafters differ are
refused when they pair instead of decoding with foreign state.
"""

from __future__ import annotations

import torch

from glmlab.speculative.dflash import DFlashDrafter
from glmlab.speculative.mtp import MTPDrafter
from glmlab.speculative.types import Drafter

Regions = dict[str, tuple[torch.Tensor, str]]


class DraftHandoff:
    def __init__(self, drafter: Drafter, num_state_slots: int, device: torch.device | str):
        self.drafter = drafter
        self._hidden = self._first = None
        if isinstance(drafter, MTPDrafter):
            dim = drafter.model.cfg.hidden_size
            dtype = drafter.model.embed_tokens.weight.dtype
            self._hidden = torch.zeros(num_state_slots, dim, dtype=dtype, device=device)
            self._first = torch.zeros(num_state_slots, dtype=torch.int64, device=device)
        elif not isinstance(drafter, DFlashDrafter):
            raise TypeError(f"no PD hand-off is defined for a {type(drafter).__name__}")

    def regions(self) -> Regions:
        """The drafter's rows a prefill instance sends, by name, with their row unit."""
        if self._hidden is not None:
            return {"mtp.hidden": (self._hidden, "state"), "mtp.first": (self._first, "state")}
        kv, out = self.drafter.kv, {}
        for i in range(kv.layout.num_layers):
            out[f"draft.k.{i}"] = (kv.k[i], "token")
            out[f"draft.v.{i}"] = (kv.v[i], "token")
            if kv.layout.dtype == "fp8":
                out[f"draft.k_scale.{i}"] = (kv.k_scale[i], "token")
                out[f"draft.v_scale.{i}"] = (kv.v_scale[i], "token")
        return out

    def describe(self) -> str:
        """What the drafter consumes; two sides of a transfer must say the same."""
        if self._hidden is not None:
            return f"mtp layer {self.drafter.layer} hidden {self._hidden.shape[1]}"
        c, layout = self.drafter.draft.cfg, self.drafter.kv.layout
        return (f"dflash2 layers {c.num_layers} kv_heads {c.num_kv_heads} head_dim {c.head_dim} "
                f"kv {layout.dtype} target_layers {list(c.target_layer_ids)} "
                f"block {c.block_size}")

    def stage(self, slot: int) -> None:
        """Prefill side, after the drafter learned the whole prompt of the request in ``slot``:
        copy what lives outside the cache into the sent rows."""
        if self._hidden is not None:
            hidden, first = self.drafter.chain_start(slot)
            self._hidden[slot] = hidden
            self._first[slot] = first

    def adopt(self, slot: int) -> None:
        """Decode side, once the rows of ``slot`` have landed: the drafter continues from them."""
        if self._hidden is not None:
            self.drafter.set_chain_start(slot, self._hidden[slot].clone(),
                                         int(self._first[slot]))
