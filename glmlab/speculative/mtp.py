"""The checkpoint's MTP layer as a chain drafter: top-k 1, S serial steps, verify width S + 1.

The MTP layer predicts token t+2 from the target's final hidden state at t and the token at t+1
(docs/model.md section 2.8); its DSA cache row t holds that pair. With n committed tokens and the
anchor a = token n (sampled, not yet in the target cache), one cycle is (sglang's EAGLE worker,
top-k 1):

    draft-extend (end of the last cycle): MTP rows over the newly committed positions, inputs
        (h_t, token_{t+1}); the last row is (h_{n-1}, a), whose output m_{n-1} gives d_1;
    draft: S-1 serial single-token steps; step j writes MTP row n+j-1 from (m_{n+j-2}, d_j) and
        gives d_{j+1} (later steps feed the MTP's own output hidden, as the target's is unknown);
    verify [a, d_1 .. d_S] with the target; commit c tokens; draft-extend over rows n .. n+c-1.

MTP516 is S = 5 (width 6), MTP718 is S = 7 (width 8). Rows the chain wrote past the committed length
are overwritten by the next extend before any query reads them, but the chain also advances the
MTP layer's indexer tail (a per-request state), so the drafter saves it before the chain and puts it
back afterwards. Drafts are argmax tokens (point mass): sampled requests are verified with
target-only chain sampling.

Two draft-extends, chosen by whether ``TargetStates`` carry the verify's ``VerifyWindow``:

- after a verify (``window`` set): the extend covers the verify's own positions p .. p+D-1 for
  every request, a *uniform* step of width D (the model's fused path, no host syncs, as the verify)
  instead of the ragged p .. p+c-1. Row j feeds (h_{p+j}, the emitted token after it) for j < c,
  and token 0 past c (any valid id: those rows are garbage). Garbage rows need no undo, by the
  verify's argument (``glmlab.speculative.commit``): the chain and the next extend rewrite an MTP
  latent row or pool key before any query reads it. The exception is the MTP layer's indexer tail,
  which the step advances over D tokens: the verify's ``SpecStateStore`` records the layer's rows
  during the step and rolls the tail to c afterwards, as it does for the target's DSA layers. The
  chain start (m, d_1) is row c-1, gathered on the device;
- otherwise (a prompt in ``SpecDecoder.start``, engine prefill chunks: ragged lengths, no window,
  no recorder): one ragged step over exactly the new positions, the model's general path.
"""

from __future__ import annotations

import torch

from glmlab.model.glm import GLM5Model
from glmlab.speculative.types import (
    CacheLayout,
    Proposal,
    SpecRequest,
    TargetStates,
    VerifyWindow,
)


class MTPDrafter:
    capture_layers: tuple[int, ...] = ()

    def __init__(self, model: GLM5Model, layout: CacheLayout, num_steps: int):
        if model.mtp is None:
            raise ValueError("the MTP drafter needs a model loaded with its MTP layer")
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.model, self.layout, self.num_steps = model, layout, num_steps
        self.width = num_steps + 1
        self.layer = model.cfg.mtp_layer
        self._hidden: dict[int, torch.Tensor] = {}  # row -> m (MTP output at the last row) [D]
        self._first: dict[int, int] = {}  # row -> d_1 (argmax of m's logits)

    @torch.inference_mode()
    def extend(self, reqs: list[SpecRequest], states: TargetStates) -> None:
        """Draft-extend: MTP rows for the committed positions; remembers the last row's output."""
        if states.window is not None:
            self._extend_window(reqs, states.positions, states.window)
            return
        device = self.model.embed_tokens.weight.device
        plan = self.layout.plan([r.row for r in reqs], [len(t) for t in states.tokens],
                                states.positions)
        hidden = torch.cat(states.hidden)
        ids = torch.tensor([t for nxt in states.next_tokens for t in nxt], device=device)
        m = self.model.mtp_forward(hidden, ids, plan, self.layout.cache)
        self._remember(reqs, m[plan.last_token_rows()])

    def _extend_window(self, reqs: list[SpecRequest], positions: list[int],
                       window: VerifyWindow) -> None:
        """The extend over the verify's whole window: one uniform step, then the MTP layer's
        indexer tail rolled to the commit lengths (module docstring)."""
        n, d = window.next_ids.shape
        cache, store = self.layout.cache, window.store
        plan = self.layout.plan([r.row for r in reqs], [d] * n, positions, verify=store)
        lens = window.commit_lens.to(window.next_ids.device).long()
        kept = torch.arange(d, device=lens.device)[None, :] < lens[:, None]  # [N, D]
        ids = torch.where(kept, window.next_ids, 0).flatten()  # past c: any valid id, garbage rows
        m = self.model.mtp_forward(window.hidden.flatten(0, 1), ids, plan, cache).view(n, d, -1)
        store.commit_index_tails(cache, plan.state_slots, lens, (self.layer,))
        self._remember(reqs, m[torch.arange(n, device=lens.device), lens - 1])  # rows c_i - 1

    def _remember(self, reqs: list[SpecRequest], last: torch.Tensor) -> None:
        """Each request's chain start: m = ``last[i]`` (the MTP output at its last learned row)
        and d_1 = argmax of its logits (the one host read of the extend)."""
        first = self.model.logits(last).argmax(-1).tolist()
        for i, r in enumerate(reqs):
            self._hidden[r.row], self._first[r.row] = last[i], first[i]

    @torch.inference_mode()
    def propose(self, reqs: list[SpecRequest]) -> Proposal:
        rows = [r.row for r in reqs]
        device = self.model.embed_tokens.weight.device
        tail = self.layout.cache.index_tail[self.layer]
        saved = tail[rows].clone()  # the chain advances the MTP indexer tail; undone below
        drafts = [torch.tensor([self._first[r] for r in rows], device=device)]
        hidden = torch.stack([self._hidden[r] for r in rows])
        for j in range(1, self.num_steps):
            plan = self.layout.plan(rows, [1] * len(rows), [r.committed + j - 1 for r in reqs])
            hidden = self.model.mtp_forward(hidden, drafts[-1], plan, self.layout.cache)
            drafts.append(self.model.logits(hidden).argmax(-1))
        tail[rows] = saved
        return Proposal(torch.stack(drafts, dim=1))

    def chain_start(self, row: int) -> tuple[torch.Tensor, int]:
        """(m, d_1) of ``row``: the MTP output at its last learned row and the first draft
        (a PD prefill instance sends them, ``glmlab.speculative.handoff``)."""
        return self._hidden[row], self._first[row]

    def set_chain_start(self, row: int, hidden: torch.Tensor, first: int) -> None:
        """Continue ``row`` from a chain start learned elsewhere (its MTP KV is in the cache)."""
        self._hidden[row], self._first[row] = hidden, first

    def release(self, reqs: list[SpecRequest]) -> None:
        for r in reqs:
            self._hidden.pop(r.row, None)
            self._first.pop(r.row, None)
