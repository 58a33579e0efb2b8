"""ReplaySSM commit in one launch: advance each committed KDA state, in place at its slot, by the
first ``commit_lens[i]`` steps recorded in ring row ``rows[i]`` (``ref.kda_replay_ref``).

Speculative verify leaves the committed state alone and records each window step's inputs
(k, g fp32; v, beta in the activation dtype) in a per-row ring (``glmlab.speculative.replay``);
the commit replays the accepted prefix. The torch form builds several [N, H, K, V] fp32
temporaries per step (184 ms per cycle at the H200 reference point against a ~1.1 ms HBM
roofline); here each state slice crosses HBM once each way and everything else stays in
registers.

One program per (sequence, head, block of value columns) holds that [K, BV] fp32 slice of the
state (the delta rule never mixes value columns), runs the accepted steps in the order of
``kda.ref.kda_recurrent_ref`` and stores once, rounding to the state dtype once at the end, as the
recurrence rounds a multi-step run. The commit lengths are read on the device: no host sync, so a
commit can sit in a CUDA graph. Knows nothing about which request owns a slot or ring row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.decode.kda_window_triton import window_warps


@triton.jit
def _replay_commit_kernel(state_ptr, slots_ptr, rows_ptr, lens_ptr, k_ptr, v_ptr, g_ptr,
                          beta_ptr, H, D, stride_ss, K: tl.constexpr, V: tl.constexpr,
                          BV: tl.constexpr):
    seq, head, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    row = tl.load(rows_ptr + seq).to(tl.int64)
    # Steps to replay, clamped to the ring's width. The store validates lengths on its torch path
    # only (a check would be a device -> host sync), so an out-of-range length must stay memory
    # safe here; an unbound row (-1) replays nothing rather than reading before the ring.
    n_steps = tl.minimum(tl.maximum(tl.load(lens_ptr + seq).to(tl.int32), 0), D)
    n_steps = tl.where(row >= 0, n_steps, 0)
    changed = n_steps > 0
    rk, cv = tl.arange(0, K), vb * BV + tl.arange(0, BV)
    st = state_ptr + slot * stride_ss + head * K * V + rk[:, None] * V + cv[None, :]
    # A request that accepted nothing (abandoned cycle) neither reads nor writes its state: it
    # stays bitwise what it was, and costs no state traffic.
    s = tl.load(st, mask=changed, other=0.0).to(tl.float32)  # [K, BV]
    # A loop bound read on the device: steps past the accepted length are never run (no masked
    # work), and one compiled kernel serves every mix of lengths.
    for t in range(n_steps):
        step = (row * D + t) * H + head  # ring index [R, D, H] of (row, t, head)
        kk = tl.load(k_ptr + step * K + rk)
        s = s * tl.exp(tl.load(g_ptr + step * K + rk))[:, None]
        v = tl.load(v_ptr + step * V + cv).to(tl.float32)
        beta = tl.load(beta_ptr + step).to(tl.float32)
        u = beta * (v - tl.sum(s * kk[:, None], axis=0))
        s = s + kk[:, None] * u[None, :]
    tl.store(st, s.to(state_ptr.dtype.element_ty), mask=changed)


def replay_value_block(dv: int) -> int:
    """State columns per program: 32 (a 128 x 128 head in four programs), the best block the H200
    measured for the same recurrence in ``kda_window_triton`` at 128 x 128 heads with 4 warps;
    the whole head when it is narrower."""
    return min(32, dv)


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _check_inputs(recurrent, slots, rows, k, v, g, beta, commit_lens) -> None:
    """Raise a ValueError naming the first argument the kernel cannot take (shape, dtype,
    contiguity, device); nothing here reads a tensor's values (no host sync)."""
    if k.dim() != 4 or recurrent.dim() != 4:
        raise ValueError(f"k must be [R, D, H, K] and recurrent [S, H, K, V]; got "
                         f"k {tuple(k.shape)}, recurrent {tuple(recurrent.shape)}")
    r, d, h, dk = k.shape
    dv = recurrent.shape[-1]
    want = {"g": (g, (r, d, h, dk)), "v": (v, (r, d, h, dv)), "beta": (beta, (r, d, h)),
            "recurrent": (recurrent, (recurrent.shape[0], h, dk, dv))}
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)} to match k {tuple(k.shape)} and "
                             f"V={dv}; got {tuple(t.shape)}")
    n = slots.shape[0] if slots.dim() == 1 else -1
    for name, t in (("slots", slots), ("rows", rows), ("commit_lens", commit_lens)):
        if t.dim() != 1 or t.shape[0] != n:
            raise ValueError(f"{name} must be [N] like slots; got {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor; got {t.dtype}")
    if k.dtype != torch.float32 or g.dtype != torch.float32:
        raise ValueError(f"k and g must be fp32 (as the ring keeps them); got {k.dtype}, {g.dtype}")
    if v.dtype != beta.dtype or not v.dtype.is_floating_point:
        raise ValueError(f"v and beta must share the activation dtype; got {v.dtype}, {beta.dtype}")
    if recurrent.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"recurrent must be fp32 or bf16; got {recurrent.dtype}")
    if not all(t.is_contiguous() for t in (k, v, g, beta, slots, rows, commit_lens)):
        raise ValueError("k, v, g, beta, slots, rows and commit_lens must be contiguous")
    if recurrent.shape[0] and not recurrent[0].is_contiguous():
        raise ValueError("each state slot recurrent[s] must be contiguous")
    if not (_is_pow2(dk) and _is_pow2(dv)):
        raise ValueError(f"K={dk} and V={dv} must be powers of two (one register tile each)")
    devices = {t.device for t in (recurrent, slots, rows, k, v, g, beta, commit_lens)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")


def kda_replay_commit(recurrent: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor,
                      k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      commit_lens: torch.Tensor, block_v: int | None = None) -> None:
    """``ref.kda_replay_ref`` in one launch, in place on ``recurrent``.

    Args:
        recurrent: [S, H, K, V] committed states (fp32 or bf16; each slot contiguous).
        slots: [N] state slots to advance; rows: [N] their ring rows (-1: left untouched).
        k, g: [R, D, H, K] fp32 (k normalised); v: [R, D, H, V]; beta: [R, D, H] (v and beta in
            the activation dtype); all contiguous: the ring of ``ReplayRing`` for one layer.
        commit_lens: [N] integer, on the device, steps to replay (clamped to 0..D; 0 leaves the
            state untouched). Never read on the host.
        block_v: state columns per program (default ``replay_value_block``), dividing V.
    Launch grid: (N, H, V // block_v), ``window_warps`` warps (the same step and reductions as
    the window recurrence, whose warps were measured).
    """
    _check_inputs(recurrent, slots, rows, k, v, g, beta, commit_lens)
    _, width, heads, dk = k.shape
    dv = v.shape[-1]
    bv = block_v or replay_value_block(dv)
    if dv % bv or not _is_pow2(bv):
        raise ValueError(f"value block {bv} must be a power of two dividing V={dv}")
    n_seq = slots.shape[0]
    if n_seq == 0:
        return
    _replay_commit_kernel[(n_seq, heads, dv // bv)](
        recurrent, slots, rows, commit_lens, k, v, g, beta, heads, width, recurrent.stride(0),
        K=dk, V=dv, BV=bv, num_warps=window_warps(dk, bv))
