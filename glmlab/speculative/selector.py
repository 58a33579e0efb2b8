"""DFlash2's candidate selector: pick a coherent chain from per-slot candidate lists.

A DFlash block forward predicts every slot independently. The selector re-ranks the target head's
top-K candidates per slot with a low-rank *edge* score between consecutive slots (docs/techniques.md
section 1.1):

    unary[e, c]    = target-head logit of candidate c at slot e
    score[e, p, c] = unary[e, c] + < A[pred_p] * (P h_e), B[cand_c] >

with A, B in R^{V x r} (predecessor / successor codebooks), P: D -> r, h_e the draft hidden state at
slot e, and pred_p the candidate chosen at slot e-1 (the anchor for slot 0). The walk takes the best
(greedy) or a sampled (softmax of score / temperature) candidate at slot 0, then at each later slot
the best or a sampled successor of the candidate actually chosen. It returns the tokens and
``q_rows``, the K-way distribution each choice was drawn from (one-hot for greedy rows), which is
what lossless rejection sampling needs. sglang computes every predecessor's successor and follows
the map; drawing only along the followed path gives the same path distribution.
"""

from __future__ import annotations

import torch
from torch import nn

from glmlab.model.layers import Linear


class CandidateSelector(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.pred_codebook = nn.Parameter(torch.empty(vocab_size, rank))  # A
        self.succ_codebook = nn.Parameter(torch.empty(vocab_size, rank))  # B
        self.proj = Linear(hidden_size, rank)  # P

    def scores(self, logits: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Candidate ids and scores.

        Args:
            logits: [N, E, V] target-head logits of the E predicted slots.
            hidden: [N, E, D] draft hidden states of those slots.  anchor: [N] token ids.
        Returns:
            cand [N, E, K] ids; first [N, K] slot-0 scores (predecessor = anchor);
            edges [N, E-1, K, K] scores of slot e+1's candidates given slot e's candidate.
        """
        unary, cand = logits.float().topk(self.top_k, dim=-1)  # [N, E, K]
        ph = self.proj(hidden).float()  # [N, E, r]
        a, b = self.pred_codebook.float(), self.succ_codebook.float()
        first = unary[:, 0] + torch.einsum("nr,nkr->nk", a[anchor] * ph[:, 0], b[cand[:, 0]])
        pred = a[cand[:, :-1]] * ph[:, 1:, None, :]  # [N, E-1, K, r]
        edges = unary[:, 1:, None, :] + torch.einsum("nepr,necr->nepc", pred, b[cand[:, 1:]])
        return cand, first, edges

    @staticmethod
    def walk(cand: torch.Tensor, first: torch.Tensor, edges: torch.Tensor,
             temperatures: list[float], generators: list[torch.Generator | None]
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Follow one chain per row: tokens [N, E] and q_rows [N, E, K] (the proposal used)."""
        n, e_len, k = cand.shape
        rows = torch.arange(n, device=cand.device)
        choice = torch.zeros(n, e_len, dtype=torch.long, device=cand.device)
        q_rows = torch.zeros(n, e_len, k, device=cand.device)
        c = first.argmax(-1)  # greedy rows, all at once
        choice[:, 0] = c
        for e in range(1, e_len):
            c = edges[rows, e - 1, c].argmax(-1)
            choice[:, e] = c
        q_rows.scatter_(-1, choice[..., None], 1.0)
        for i, temp in enumerate(temperatures):  # sampled rows, each with its own generator
            if temp <= 0:
                continue
            score = first[i]
            for e in range(e_len):
                probs = (score / temp).softmax(-1)
                c_i = torch.multinomial(probs, 1, generator=generators[i])[0]
                choice[i, e], q_rows[i, e] = c_i, probs
                if e + 1 < e_len:
                    score = edges[i, e, c_i]
        return cand.gather(-1, choice[..., None])[..., 0], q_rows

    @staticmethod
    def dense_proposal(cand: torch.Tensor, q_rows: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """q_rows over each slot's candidates -> [N, E, V] proposal distributions."""
        out = torch.zeros(*cand.shape[:2], vocab_size, device=cand.device)
        return out.scatter_(-1, cand, q_rows)
