"""Simulated acceptance: the commit lengths have the requested mean, and runs say they simulated."""

from __future__ import annotations

import pytest

from glmlab.core import SamplingParams
from glmlab.model.session import Session
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.cycle import SpecDecoder
from glmlab.speculative.layout import SessionLayout
from glmlab.speculative.mtp import MTPDrafter
from glmlab.speculative.sim import SimulatedAcceptance, acceptance_rate


def test_fixed_mode_hits_the_seed_means_exactly():
    for mean, counts in ((7.03, {7: 97, 8: 3}), (7.37, {7: 63, 8: 37})):
        lens = SimulatedAcceptance(mean, 8, "fixed").commit_lens(100).tolist()
        assert {v: lens.count(v) for v in set(lens)} == counts


def test_sampled_mode_has_the_requested_mean():
    a = acceptance_rate(7.03, 7)
    assert sum(a**i for i in range(8)) == pytest.approx(7.03, abs=1e-9)
    lens = SimulatedAcceptance(7.03, 8, "sampled", seed=1).commit_lens(20000).float()
    assert float(lens.mean()) == pytest.approx(7.03, abs=0.03)
    assert int(lens.min()) >= 1 and int(lens.max()) <= 8


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="outside"):
        SimulatedAcceptance(9.0, 8)
    with pytest.raises(ValueError, match="simulate_accept_len"):
        SpecConfig(algorithm="mtp", num_steps=5, simulate_accept_len=7.37)  # width 6
    assert SpecConfig(num_steps=7).name == "MTP718"
    assert SpecConfig(algorithm="dflash2", block_size=8).name == "DFlash2-B8"


def test_simulated_cycles_commit_the_simulated_lengths(tiny_model):
    session = Session(tiny_model, 2, 96)
    layout = SessionLayout(session)
    sim = SimulatedAcceptance(7.37, 8, "fixed")
    dec = SpecDecoder(tiny_model, layout, MTPDrafter(tiny_model, layout, 7), simulate=sim)
    out = dec.generate({0: list(range(30, 50)), 1: [3, 4, 5]},
                       SamplingParams(max_new_tokens=30, ignore_eos=True))
    assert all(st.simulated for st in dec.stats)
    lens = [c for st in dec.stats for c in st.commit_lens]
    assert set(lens) <= {7, 8} and len(out[0]) == 30
    for i, prompt_len in enumerate((20, 3)):  # the cache holds exactly the committed tokens
        committed = prompt_len + sum(st.commit_lens[i] for st in dec.stats)
        assert session.lengths[i] == committed
