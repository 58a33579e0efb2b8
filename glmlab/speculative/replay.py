"""KDA recurrent state across a verify window: ReplaySSM rings and post-step snapshots.

A verify forward runs each request's KDA recurrence over its D = S + 1 window tokens, but only the
first ``commit_len`` (1..D) of them are accepted. Two ways to end the cycle with exactly the state
after ``commit_len`` steps (docs/techniques.md section 2):

- ``SNAPSHOT`` (sglang's baseline): the verify recurrence stores the post-step state after every
  step, ``[slots, D, H, K, V]`` per KDA layer, and the commit copies entry ``commit_len - 1``.
- ``REPLAY`` (ReplaySSM, "fold every commit"): the verify stores only each step's raw inputs
  (k, v, log-decay g, beta) in a per-slot ring and never writes the state; the commit replays the
  accepted steps into the committed state in place. ``replay_steps`` uses exactly the operations of
  ``kernels/kda/ref.py:kda_recurrent_ref`` in the same order, so the committed state is bitwise the
  recurrence's (tested). Per slot and layer that is D*H*(K + V + K + 1) numbers instead of D*H*K*V.
  ``ReplayRing(commit_impl="triton")`` runs the same steps as one kernel per layer
  (``kernels/decode/kda_replay_triton.py``): no per-step [N, H, K, V] temporaries, no host sync.

Both hold what the recurrence consumes: k already L2-normalised in fp32 (glmlab normalises in the
layer; sglang keeps pre-norm k in the activation dtype because its kernel fuses the norm), g in
fp32, v and beta in the activation dtype. The classes own buffers indexed by state slot and know
nothing about conv state, indexer tails or which request owns a slot
(``glmlab.speculative.commit``).
"""

from __future__ import annotations

from enum import Enum

import torch

from glmlab.config import ModelConfig
from glmlab.kernels.kda.ref import kda_recurrent_ref


class CommitMode(str, Enum):
    REPLAY = "replay"
    SNAPSHOT = "snapshot"


COMMIT_IMPLS = ("torch", "triton")


def check_commit_impl(name: str) -> str:
    if name not in COMMIT_IMPLS:
        raise ValueError(f"commit_impl must be one of {COMMIT_IMPLS}, not {name!r}")
    return name


def _step(s, k, v, g, beta):
    """One recurrence step on fp32 rows; the op order of kda_recurrent_ref (do not reorder)."""
    s = s * g.exp()[..., None]
    u = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", s, k))
    return s + k[..., :, None] * u[..., None, :]


def replay_steps(states: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, num_steps: torch.Tensor) -> torch.Tensor:
    """Advance each state by its first ``num_steps[i]`` recorded steps.

    Args:
        states: [N, H, K, V] committed states (any float dtype).
        k, g: [N, D, H, K] (k normalised); v: [N, D, H, V]; beta: [N, D, H].
        num_steps: [N] int64 in 0..D.
    Returns:
        [N, H, K, V] in ``states.dtype``: computed in fp32, rounded once at the end, as the
        recurrence rounds a multi-step run.
    """
    s = states.float()
    k, v, g, beta = (t.float() for t in (k, v, g, beta))
    steps = num_steps.to(s.device)
    for t in range(int(steps.max()) if steps.numel() else 0):
        active = (steps > t)[:, None, None, None]
        s = torch.where(active, _step(s, k[:, t], v[:, t], g[:, t], beta[:, t]), s)
    return s.to(states.dtype)


def put_rows(store: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    """``store[rows, :values.shape[1]] = values``: one ``index_copy_`` (a plain strided copy)
    when the values fill the store's second dimension, as a full verify window does, instead of
    an indexed put (several times slower on the GPU at verify width 8 x 132 requests)."""
    if values.shape[1] == store.shape[1]:
        store.index_copy_(0, rows, values.to(store.dtype))
    else:
        store[rows, : values.shape[1]] = values.to(store.dtype)


class ReplayRing:
    """Per-slot ring of the raw per-step KDA inputs of the last verify window (REPLAY mode).

    Per KDA layer: ``k`` and ``g`` [slots, D, H, K] fp32, ``v`` [slots, D, H, V] and ``beta``
    [slots, D, H] in the activation dtype. The verify writes steps 0..D-1; the commit reads the
    accepted prefix; rejected entries are simply overwritten by the next verify.
    """

    mode = CommitMode.REPLAY

    def __init__(self, cfg: ModelConfig, num_slots: int, width: int, act_dtype: torch.dtype,
                 device: torch.device | str = "cpu", commit_impl: str = "torch"):
        """``commit_impl``: "torch" (``replay_steps``, bitwise the recurrence) or "triton"
        (``kernels/decode/kda_replay_triton.py``: one launch per layer, in place, lengths read
        on the device; equal to the recurrence up to fp32 summation order)."""
        kd, self.width = cfg.kda, width
        h, dk = kd.num_heads, kd.head_dim
        self.commit_impl = check_commit_impl(commit_impl)
        self._kernel = None
        if commit_impl == "triton":  # imported here: Triton is an optional extra
            from glmlab.kernels.decode.kda_replay_triton import kda_replay_commit

            self._kernel = kda_replay_commit

        def buf(*shape, dtype):
            return {i: torch.zeros(num_slots, width, *shape, dtype=dtype, device=device)
                    for i in cfg.kda_layers}

        self.k, self.g = buf(h, dk, dtype=torch.float32), buf(h, dk, dtype=torch.float32)
        self.v, self.beta = buf(h, dk, dtype=act_dtype), buf(h, dtype=act_dtype)

    def verify(self, layer: int, rows: torch.Tensor, q, k, v, g, beta,
               states: torch.Tensor) -> torch.Tensor:
        """q, k, g [N, D, H, K], v [N, D, H, V], beta [N, D, H]; returns o [N, D, H, V] fp32.
        ``rows``: this store's rows of the N requests."""
        self.record(layer, rows, k, v, g, beta)
        o, _ = kda_recurrent_ref(q, k, v, g, beta, states)
        return o

    def record(self, layer: int, rows: torch.Tensor, k, v, g, beta) -> None:
        """Store the window's step inputs only (a fused kernel computes the outputs)."""
        for store, x in ((self.k, k), (self.g, g), (self.v, v), (self.beta, beta)):
            put_rows(store[layer], rows, x)

    def commit(self, layer: int, recurrent: torch.Tensor, slots: torch.Tensor,
               rows: torch.Tensor, commit_lens: torch.Tensor) -> None:
        """recurrent: the cache's [state slots, H, K, V] tensor of ``layer``, updated in place at
        ``slots`` from this store's ``rows``."""
        if self._kernel is not None:
            self._kernel(recurrent, *(t.contiguous() for t in (slots, rows)), self.k[layer],
                         self.v[layer], self.g[layer], self.beta[layer], commit_lens.contiguous())
            return
        recurrent[slots] = replay_steps(recurrent[slots], self.k[layer][rows],
                                        self.v[layer][rows], self.g[layer][rows],
                                        self.beta[layer][rows], commit_lens)

    @staticmethod
    def bytes_per_slot(cfg: ModelConfig, width: int, act_dtype: torch.dtype) -> int:
        kd, act = cfg.kda, torch.finfo(act_dtype).bits // 8
        per_step = kd.num_heads * (4 * kd.head_dim + act * kd.head_dim + 4 * kd.head_dim + act)
        return len(cfg.kda_layers) * width * per_step


class StateSnapshots:
    """Post-step KDA states of the last verify window (SNAPSHOT mode).

    Per KDA layer: ``[slots, D, H, K, V]`` in the recurrent-state dtype. The commit copies the
    snapshot after the last accepted step into the committed state.
    """

    mode = CommitMode.SNAPSHOT

    def __init__(self, cfg: ModelConfig, num_slots: int, width: int, state_dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        kd, self.width = cfg.kda, width
        shape = (num_slots, width, kd.num_heads, kd.head_dim, kd.head_dim)
        self.states = {i: torch.zeros(shape, dtype=state_dtype, device=device)
                       for i in cfg.kda_layers}

    def verify(self, layer: int, rows: torch.Tensor, q, k, v, g, beta,
               states: torch.Tensor) -> torch.Tensor:
        q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
        s, out, post = states.float(), [], []
        for t in range(k.shape[1]):
            s = _step(s, k[:, t], v[:, t], g[:, t], beta[:, t])
            out.append(torch.einsum("bhkv,bhk->bhv", s, q[:, t]))
            post.append(s)
        self.states[layer][rows, : k.shape[1]] = torch.stack(post, 1).to(self.states[layer].dtype)
        return torch.stack(out, dim=1)

    def commit(self, layer: int, recurrent: torch.Tensor, slots: torch.Tensor,
               rows: torch.Tensor, commit_lens: torch.Tensor) -> None:
        last = (commit_lens.to(slots.device) - 1).clamp(min=0)
        picked = self.states[layer][rows, last]
        keep = (commit_lens.to(slots.device) == 0)[:, None, None, None]
        recurrent[slots] = torch.where(keep, recurrent[slots], picked.to(recurrent.dtype))

    @staticmethod
    def bytes_per_slot(cfg: ModelConfig, width: int, state_dtype: torch.dtype) -> int:
        kd = cfg.kda
        per_step = kd.num_heads * kd.head_dim * kd.head_dim * (torch.finfo(state_dtype).bits // 8)
        return len(cfg.kda_layers) * width * per_step
