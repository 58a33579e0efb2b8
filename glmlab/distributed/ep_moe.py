"""MoE under context parallelism with the routed experts split across the CP group (EP = CP).

Every rank holds an interleaved token shard [Tp, D] and E/ep experts. Each token must reach the
ranks owning its top-k experts, so the shards are all-gathered, every rank runs its own experts
on the token-expert pairs routed to them (the contiguous grouped-GEMM layout), and the partial
outputs are reduce-scattered back to the shards. Three dispatches (``MoEDispatch``):

- ``BF16``: all-gather the hidden states, route every gathered token on every rank, experts read
  the hidden states as they are. The exact reference: same math as the single-device layer.
- ``BF16_THEN_FP8``: the reference deployment's baseline. Same gather, then every rank also
quantises all T
  tokens to FP8 (per token, per 128 channels), duplicating work cp times.
- ``FP8_PACKET``: each rank routes and quantises only its own shard, packs one packet per token
  (``glmlab.kernels.fp8.packet_ref``), and one all-gather moves ~52% of the BF16 bytes; unpacking
  writes the grouped layout directly and the experts reuse the sender's FP8 values as they are.

The two FP8 dispatches feed bitwise-identical grouped rows to the experts (same routing, same
quantised values); they differ only in what moves and where the work happens. The shared expert
runs on the local shard. The expert loop here is the torch reference of a contiguous grouped
GEMM; it does not know which rank a row came from.
"""

from __future__ import annotations

from enum import Enum

import torch
import torch.nn.functional as F
from torch import nn

from glmlab.distributed.fp8_packet import PacketKernels, packet_ops
from glmlab.distributed.interleave import CPComm
from glmlab.kernels.fp8.packet_ref import (
    GroupedRows,
    PacketLayout,
    dequant_act_fp8,
    group_rows_ref,
    grouped_destinations,
    split_packets,
)
from glmlab.kernels.fp8.ref import dequant_block_fp8, quant_act_fp8
from glmlab.kernels.moe.ref import clamped_swiglu
from glmlab.model.moe import Experts, MoE


class MoEDispatch(str, Enum):
    BF16 = "bf16"
    BF16_THEN_FP8 = "bf16-then-fp8"
    FP8_PACKET = "fp8-packet"


def shard_experts_(experts: Experts, rank: int, size: int) -> int:
    """Keep only this rank's experts [start, start + E/size) (in place); returns ``start``."""
    num = experts.w13.shape[0]
    if num % size:
        raise ValueError(f"{num} experts cannot be split over {size} ranks")
    per = num // size
    start = rank * per
    keep = slice(start, start + per)
    experts.w13 = nn.Parameter(experts.w13.data[keep].clone(), requires_grad=False)
    experts.w2 = nn.Parameter(experts.w2.data[keep].clone(), requires_grad=False)
    if experts.w13_scale is not None:
        experts.w13_scale = experts.w13_scale[keep].clone()
        experts.w2_scale = experts.w2_scale[keep].clone()
    return start


def grouped_experts_ref(rows: GroupedRows, experts: Experts, num_tokens: int,
                        dtype: torch.dtype) -> torch.Tensor:
    """Contiguous grouped MoE: expert e of ``experts`` runs rows [cu[e], cu[e+1]).

    FP8 rows are dequantised with their own scales (the values are used as sent), then each
    expert applies the clamped SwiGLU MLP and its rows are scaled by their top-k weight and
    summed into their token. Returns [num_tokens, D] in ``dtype``: this rank's partial output.
    """
    out = torch.zeros(num_tokens, experts.w13.shape[-1], dtype=dtype, device=rows.values.device)
    cu = rows.cu_expert_rows.tolist()
    for e in range(len(cu) - 1):
        a, b = cu[e], cu[e + 1]
        if a == b:
            continue
        x = rows.values[a:b]
        x = x.to(dtype) if rows.scales is None else dequant_act_fp8(x, rows.scales[a:b], dtype)
        gate, up = F.linear(x, _expert_weight(experts, "w13", e, dtype)).chunk(2, dim=-1)
        act = clamped_swiglu(gate, up, experts.limit)
        y = F.linear(act, _expert_weight(experts, "w2", e, dtype))
        out.index_add_(0, rows.tokens[a:b], (y * rows.weights[a:b, None]).to(dtype))
    return out


def _expert_weight(experts: Experts, stack: str, e: int, dtype: torch.dtype) -> torch.Tensor:
    w = getattr(experts, stack)[e]
    scale = getattr(experts, f"{stack}_scale")
    return w.to(dtype) if scale is None else dequant_block_fp8(w, scale[e], dtype, experts.block)


class EPMoE(nn.Module):
    """Drop-in for a ``MoE`` whose input is this rank's padded interleaved shard [Tp, D]."""

    def __init__(self, moe: MoE, comm: CPComm, dispatch: MoEDispatch,
                 packet_kernels: PacketKernels = PacketKernels.TORCH):
        super().__init__()
        self.gate, self.experts, self.shared_experts = moe.gate, moe.experts, moe.shared_experts
        self.comm, self.dispatch = comm, MoEDispatch(dispatch)
        self.expert_start = shard_experts_(moe.experts, comm.rank, comm.size)
        self.num_local = self.experts.w13.shape[0]
        self.layout = PacketLayout(self.experts.w13.shape[-1], self.gate.top_k)
        self.pack, self.unpack = packet_ops(packet_kernels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        rows = self.dispatch_rows(h)
        routed = grouped_experts_ref(rows, self.experts, self.comm.size * h.shape[0], h.dtype)
        return self.comm.reduce_scatter(routed) + self.shared_experts(h)

    def dispatch_rows(self, h: torch.Tensor) -> GroupedRows:
        """Move the shards and lay out this rank's token-expert pairs for its experts."""
        if self.dispatch is MoEDispatch.FP8_PACKET:
            weights, ids = self.gate(h)  # routed here, from the BF16 input, for local tokens only
            values, scales = quant_act_fp8(h, self.layout.group)
            packets = self.comm.all_gather(self.pack(self.layout, values, scales, weights, ids))
            ids_all = split_packets(self.layout, packets)[3]
            dest, cu = grouped_destinations(ids_all, self.expert_start, self.num_local)
            return self.unpack(self.layout, packets, dest, cu)
        h_all = self.comm.all_gather(h)
        weights, ids = self.gate(h_all)
        dest, cu = grouped_destinations(ids, self.expert_start, self.num_local)
        if self.dispatch is MoEDispatch.BF16_THEN_FP8:
            values, scales = quant_act_fp8(h_all, self.layout.group)
            return group_rows_ref(values, scales, weights, dest, cu)
        return group_rows_ref(h_all, None, weights, dest, cu)
