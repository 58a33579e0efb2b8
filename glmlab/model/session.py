"""A model plus its cache for a fixed set of sequences: the smallest harness that runs the model.

``Session`` gives each of ``num_seqs`` sequences its own contiguous run of pages and one state slot,
then lets you feed tokens to any subset of them (a whole prompt, a chunk, or one token each) and
read the final hidden states. It is what notebooks and reference tests use to drive the model
directly; the serving engine replaces the fixed layout with real page/slot pools and scheduling.

``run_step`` is the one way a ``StepPlan`` runs through the model (the session, the engine's
``ModelRunner.forward`` and speculative cycles all call it).
"""

from __future__ import annotations

import torch

from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.core import SamplingParams
from glmlab.model.glm import GLM5Model
from glmlab.model.plan import ForwardPlan, StepPlan, StepResult
from glmlab.sampling import draw


@torch.inference_mode()
def run_step(model: GLM5Model, cache: ModelCache, plan: StepPlan) -> StepResult:
    """The model over ``plan``: hidden states of every row, captured features, fp32 logits of
    ``plan.logit_rows`` (every row when None)."""
    hidden, captured = model(plan.input_ids, plan.forward, cache,
                             capture_layers=plan.capture_layers)
    features = torch.cat(captured, dim=-1) if captured else hidden[:, :0]
    rows = hidden if plan.logit_rows is None else hidden[plan.logit_rows]
    return StepResult(hidden, features, model.logits(rows))


class Session:
    def __init__(
        self,
        model: GLM5Model,
        num_seqs: int = 1,
        max_len: int = 256,
        page_size: int = 64,
        dtypes: CacheDtypes | None = None,
    ):
        self.model = model
        device = model.embed_tokens.weight.device
        pages_per_seq = -(-max_len // page_size)
        self.max_len, self.page_size = pages_per_seq * page_size, page_size
        self.cache = ModelCache(
            model.cfg,
            num_seqs * self.max_len,
            num_seqs,
            page_size,
            dtypes or CacheDtypes.like(model.dtype),
            device,
            with_mtp=model.mtp is not None,
        )
        self.page_table = torch.arange(num_seqs * pages_per_seq, device=device).view(num_seqs, -1)
        self.lengths = [0] * num_seqs

    @torch.inference_mode()
    def forward(self, tokens: dict[int, list[int]]) -> list[torch.Tensor]:
        """Append ``tokens[seq]`` to each listed sequence; return their hidden states [n, D]."""
        seqs = list(tokens)
        new = [len(tokens[s]) for s in seqs]
        for s, n in zip(seqs, new, strict=True):
            if n == 0 or self.lengths[s] + n > self.max_len:
                raise ValueError(
                    f"sequence {s}: cannot add {n} tokens to {self.lengths[s]} "
                    f"(max_len {self.max_len})"
                )
        plan = ForwardPlan.build(
            new, [self.lengths[s] for s in seqs], seqs, self.page_table[seqs], self.page_size
        )
        device = self.page_table.device
        ids = torch.tensor([t for s in seqs for t in tokens[s]], dtype=torch.long, device=device)
        hidden, _ = self.model(ids, plan, self.cache)
        for s, n in zip(seqs, new, strict=True):
            self.lengths[s] += n
        return list(hidden.split(new))

    def logits(self, tokens: dict[int, list[int]]) -> list[torch.Tensor]:
        """Like ``forward`` but returns fp32 logits [n, V] per sequence."""
        with torch.inference_mode():
            return [self.model.logits(h) for h in self.forward(tokens)]

    def generate(
        self,
        seq: int,
        prompt: list[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...] = (),
    ) -> list[int]:
        """Prefill ``prompt`` into sequence ``seq`` then decode one token at a time."""
        if not prompt:
            raise ValueError("prompt is empty")
        # the engine's draw (glmlab.sampling): a function of (seed, position) and the logits
        seed = params.seed if params.seed is not None else int(torch.randint(1 << 62, ()))
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        out: list[int] = []
        logits = self.logits({seq: prompt})[0][-1]
        while True:
            token = draw(logits, params, seed, len(prompt) + len(out))
            out.append(token)
            if token in stop or len(out) >= params.max_new_tokens:
                return out
            logits = self.logits({seq: [token]})[0][-1]
