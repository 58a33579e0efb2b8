"""Verification: greedy prefix matching; rejection sampling reproduces the target distribution."""

from __future__ import annotations

import math

import pytest
import torch

from glmlab.core import SamplingParams
from glmlab.speculative.verify import accept, greedy_accept, rejection_accept

V, S = 5, 3


def _chi2_limit(df: int, z: float = 3.09) -> float:
    """Upper 99.9% point of chi-square(df) (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(-1, keepdim=True)


def _cycle(anchor, target, proposal, sampled_drafts, claimed, gen):
    """One draft + verify cycle per row of a toy Markov target; returns the Accepted result."""
    drafts, qs, prev = [], [], anchor
    for _ in range(S):
        q = proposal[prev]
        d = torch.multinomial(q, 1, generator=gen)[:, 0] if sampled_drafts else q.argmax(-1)
        drafts.append(d)
        qs.append(q)
        prev = d
    drafts = torch.stack(drafts, 1)
    window = torch.cat([anchor[:, None], drafts], 1)
    q_claimed = None if not sampled_drafts else torch.stack(qs, 1) if claimed is None else \
        claimed.expand(len(anchor), S, V)
    return rejection_accept(target[window], drafts, q_claimed, gen)


def _first_two(target, proposal, sampled_drafts, claimed=None, runs=30000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    anchor = torch.zeros(runs, dtype=torch.long)
    first = _cycle(anchor, target, proposal, sampled_drafts, claimed, gen)
    x1 = first.tokens[:, 0]
    second = _cycle(x1, target, proposal, sampled_drafts, claimed, gen)
    x2 = torch.where(first.accept_lens >= 1, first.tokens[:, 1], second.tokens[:, 0])
    counts = torch.bincount(x1 * V + x2, minlength=V * V).double()
    expect = (target[0][:, None] * target).flatten().double() * runs
    keep = expect > 0
    chi2 = float(((counts - expect)[keep] ** 2 / expect[keep]).sum())
    return chi2, int(keep.sum()) - 1, first.accept_lens.float().mean().item()


TARGET = _normalise(torch.rand(V, V, generator=torch.Generator().manual_seed(1)) ** 3 + 0.02)
PROPOSAL = _normalise(torch.rand(V, V, generator=torch.Generator().manual_seed(2)) ** 3 + 0.02)


@pytest.mark.parametrize("sampled_drafts", [True, False], ids=["sampled-q", "point-mass"])
def test_rejection_sampling_reproduces_target(sampled_drafts):
    # point-mass drafts propose the target's own mode, so long accepts are common too
    proposal = PROPOSAL if sampled_drafts else TARGET
    chi2, df, mean_accept = _first_two(TARGET, proposal, sampled_drafts)
    assert chi2 < _chi2_limit(df), (chi2, df)
    assert 0 < mean_accept < S  # both accepting and rejecting paths were exercised


def test_wrong_proposal_is_detected():
    """The check has power: claiming a uniform q for drafts drawn from another q is caught."""
    chi2, df, _ = _first_two(TARGET, PROPOSAL, True, claimed=torch.full((V,), 1.0 / V))
    assert chi2 > _chi2_limit(df), (chi2, df)


def test_identical_proposal_accepts_everything():
    gen = torch.Generator().manual_seed(3)
    res = _cycle(torch.zeros(2000, dtype=torch.long), TARGET, TARGET, True, None, gen)
    assert bool((res.accept_lens == S).all())


def test_greedy_longest_prefix_and_bonus():
    logits = torch.full((3, S + 1, V), -1.0)
    best = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [0, 0, 0, 0]])
    logits.scatter_(-1, best[..., None], 1.0)
    drafts = torch.tensor([[1, 2, 3], [1, 4, 3], [1, 0, 0]])
    res = greedy_accept(logits, drafts)
    assert res.accept_lens.tolist() == [3, 1, 0]
    assert res.commit_lens.tolist() == [4, 2, 1]
    assert [res.emitted(i) for i in range(3)] == [[1, 2, 3, 4], [1, 2], [0]]


def test_mixed_batch_and_seeded_requests():
    logits = torch.randn(3, S + 1, V, generator=torch.Generator().manual_seed(4))
    drafts = logits[:, :-1].argmax(-1)
    params = [SamplingParams(), SamplingParams(temperature=1.0, top_k=2, seed=7),
              SamplingParams(temperature=0.7, seed=9)]

    def run():
        gens = [None] + [torch.Generator().manual_seed(p.seed) for p in params[1:]]
        return accept(logits, drafts, None, params, gens)

    a, b = run(), run()
    assert torch.equal(a.accept_lens, b.accept_lens) and torch.equal(a.tokens, b.tokens)
    assert int(a.accept_lens[0]) == S  # greedy row: drafts are the argmax
    top2 = logits[1].topk(2, dim=-1).indices
    emitted = a.emitted(1)
    assert all(t in top2[j].tolist() for j, t in enumerate(emitted))
