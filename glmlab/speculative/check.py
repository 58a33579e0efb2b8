"""Check a speculative setting against plain decoding on the same model: same tokens or not.

``lossless_check`` decodes the prompts twice on fresh sessions, once token by token
(``Session.generate``) and once with speculative cycles, and reports whether the outputs are equal
and how long the commits were. Greedy settings must match token for token; it is the check the
tests, the notebook and ``glmlab generate --speculative --check`` run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from glmlab.core import SamplingParams
from glmlab.model.glm import GLM5Model
from glmlab.model.session import Session
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.cycle import SpecDecoder
from glmlab.speculative.dflash import DFlashDraftModel
from glmlab.speculative.factory import make_decoder
from glmlab.speculative.layout import SessionLayout
from glmlab.speculative.oracle import OracleDrafter


@dataclass(frozen=True)
class LosslessReport:
    name: str
    lossless: bool
    outputs: dict[int, list[int]]
    reference: dict[int, list[int]]
    commit_hist: dict[int, int]  # commit length -> count over all cycles and requests
    cycles: int
    simulated: bool

    @property
    def mean_commit(self) -> float:
        total = sum(self.commit_hist.values())
        return sum(k * v for k, v in self.commit_hist.items()) / max(1, total)

    def __str__(self) -> str:
        hist = ", ".join(f"{k}: {v}" for k, v in sorted(self.commit_hist.items()))
        sim = " [simulated acceptance]" if self.simulated else ""
        return (f"{self.name}{sim}: lossless: {self.lossless} | {self.cycles} cycles, mean "
                f"acceptance length {self.mean_commit:.2f} | commit lengths {{{hist}}}")


def plain_greedy(model: GLM5Model, prompts: dict[int, list[int]], params: SamplingParams,
                 max_len: int) -> dict[int, list[int]]:
    session = Session(model, max(prompts) + 1, max_len)
    return {r: session.generate(r, p, params, model.cfg.eos_token_ids) for r, p in prompts.items()}


def lossless_check(model: GLM5Model, prompts: dict[int, list[int]], params: SamplingParams,
                   spec: SpecConfig, draft: DFlashDraftModel | None = None,
                   reference: dict[int, list[int]] | None = None,
                   oracle: bool = False) -> LosslessReport:
    """``oracle``: instead of ``spec``'s drafter, propose the reference tokens themselves (every
    draft is accepted: the full-acceptance path), at ``spec``'s verify width."""
    max_len = max(len(p) for p in prompts.values()) + params.max_new_tokens + 2 * spec.width
    ref = reference or plain_greedy(model, prompts, params, max_len)
    session = Session(model, max(prompts) + 1, max_len)
    layout = SessionLayout(session)
    if oracle:
        full = {r: prompts[r] + ref[r] for r in prompts}
        drafter = OracleDrafter(spec.width, full, model.cfg.vocab_size,
                                device=model.embed_tokens.weight.device)
        dec, name = SpecDecoder(model, layout, drafter, spec.commit), f"oracle-W{spec.width}"
    else:
        dec, name = make_decoder(model, layout, spec, draft=draft), spec.name
    out = dec.generate(prompts, params)
    hist = Counter(c for st in dec.stats for c in st.commit_lens)
    return LosslessReport(name, out == ref, out, ref, dict(hist), len(dec.stats), spec.simulated)
