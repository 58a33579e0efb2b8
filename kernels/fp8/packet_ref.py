"""Torch references for the FP8 MoE activation packet: one fixed-size record per token.

Under context parallelism each rank routes and quantises its own token shard, then a single
all-gather moves one packet per token instead of its BF16 hidden state (docs/techniques.md section 6).

Shapes (kernels/README.md): T tokens, D hidden, A active experts per token, G = ceil(D/128)
scale groups, M grouped rows (token-expert pairs routed to this rank's experts).

Packet layout, in 4-byte words so every field is a plain bit-view (``PacketLayout``)::

    | E4M3 values: D bytes | fp32 scales: G | fp32 top-k weights: A | int32 expert ids: A | pad |

padded to ``align`` bytes. For D = 4096, A = 8: 4096 + 128 + 32 + 32 = 4288 B, against 8192 B of
BF16. Nothing is converted on the way in or out: pack and unpack only move bits, so the values
the experts read are exactly those the sending rank quantised (no requantisation).

Unpacking writes straight into the contiguous grouped-GEMM layout (``GroupedRows``): the rows
routed to this rank's experts, sorted by local expert, then token, then top-k slot, with
``cu_expert_rows`` [E_local + 1] the start of each expert's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glmlab.kernels.fp8.ref import FP8

WORD = 4  # bytes per packet word (int32)


@dataclass(frozen=True)
class PacketLayout:
    """Byte layout of one token's packet (defined once; kernels and byte accounting use it)."""

    hidden: int  # D
    top_k: int  # A
    group: int = 128  # channels per activation scale
    align: int = 16  # packets are padded to this many bytes

    def __post_init__(self) -> None:
        if self.hidden % WORD or self.align % WORD:
            raise ValueError(f"hidden ({self.hidden}) and align ({self.align}) must be "
                             f"multiples of {WORD} bytes")

    @property
    def num_groups(self) -> int:
        return -(-self.hidden // self.group)

    # Word offsets of each field inside a packet.
    @property
    def scales_at(self) -> int:
        return self.hidden // WORD

    @property
    def weights_at(self) -> int:
        return self.scales_at + self.num_groups

    @property
    def ids_at(self) -> int:
        return self.weights_at + self.top_k

    @property
    def payload_bytes(self) -> int:
        """Bytes carrying information: values + scales + weights + ids."""
        return self.hidden + WORD * (self.num_groups + 2 * self.top_k)

    @property
    def bytes_per_token(self) -> int:
        """What one token costs on the wire (payload padded to ``align``)."""
        return -(-self.payload_bytes // self.align) * self.align

    @property
    def words(self) -> int:
        return self.bytes_per_token // WORD

    def bf16_bytes_per_token(self) -> int:
        """The baseline transport: the token's BF16 hidden state."""
        return 2 * self.hidden

    def fields(self) -> list[tuple[str, int, int]]:
        """(name, first byte, bytes) of every field, padding included."""
        spans = [("values_fp8", 0, self.hidden),
                 ("scales_f32", WORD * self.scales_at, WORD * self.num_groups),
                 ("weights_f32", WORD * self.weights_at, WORD * self.top_k),
                 ("ids_i32", WORD * self.ids_at, WORD * self.top_k)]
        pad = self.bytes_per_token - self.payload_bytes
        return spans + ([("pad", self.payload_bytes, pad)] if pad else [])


def _words(x: torch.Tensor) -> torch.Tensor:
    """Bit-view of a row-major [T, n] tensor as int32 words [T, n * itemsize / 4]."""
    return x.contiguous().view(torch.uint8).view(torch.int32)


def pack_ref(layout: PacketLayout, values: torch.Tensor, scales: torch.Tensor,
             weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Pack quantised tokens into packets.

    Args:
        values: [T, D] float8_e4m3fn.  scales: [T, G] fp32.  weights: [T, A] fp32.  ids: [T, A] int.
    Returns:
        [T, layout.words] int32 packets; padding words are zero.
    """
    t = values.shape[0]
    out = torch.zeros(t, layout.words, dtype=torch.int32, device=values.device)
    out[:, : layout.scales_at] = _words(values)
    out[:, layout.scales_at: layout.weights_at] = _words(scales.float())
    out[:, layout.weights_at: layout.ids_at] = _words(weights.float())
    out[:, layout.ids_at: layout.ids_at + layout.top_k] = ids.to(torch.int32)
    return out


def split_packets(layout: PacketLayout, packets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Views of the fields of [T, words] packets: values [T, D] fp8, scales [T, G] fp32,
    weights [T, A] fp32, ids [T, A] int32 (no copies when packets are contiguous)."""
    values = packets[:, : layout.scales_at].contiguous().view(torch.uint8).view(FP8)
    scales = packets[:, layout.scales_at: layout.weights_at].view(torch.float32)
    weights = packets[:, layout.weights_at: layout.ids_at].view(torch.float32)
    ids = packets[:, layout.ids_at: layout.ids_at + layout.top_k]
    return values, scales, weights, ids


@dataclass(frozen=True)
class GroupedRows:
    """Token-expert pairs of one rank's experts in the contiguous grouped-GEMM layout.

    values [M, D] (fp8 with ``scales`` [M, G], or a plain float dtype with ``scales`` None),
    weights [M] fp32 top-k weight of each pair, tokens [M] int64 row of the pair's token in the
    gathered batch, cu_expert_rows [E_local + 1] int64: expert e owns rows [cu[e], cu[e+1]).
    """

    values: torch.Tensor
    scales: torch.Tensor | None
    weights: torch.Tensor
    tokens: torch.Tensor
    cu_expert_rows: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.values.shape[0]


def grouped_destinations(ids: torch.Tensor, expert_start: int, num_local: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each (token, slot) goes in the grouped layout of experts [start, start + num_local).

    Args:
        ids: [T, A] global expert ids.
    Returns:
        dest [T, A] int32 grouped row or -1 (expert not on this rank), and cu_expert_rows
        [num_local + 1] int64. Rows are ordered by local expert, then token, then slot.
    """
    local = ids.long() - expert_start
    owned = (local >= 0) & (local < num_local)
    key = torch.where(owned, local, num_local).flatten()  # foreign pairs sort last
    order = torch.argsort(key, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=ids.device)
    counts = torch.bincount(key, minlength=num_local + 1)[:num_local]
    cu = torch.zeros(num_local + 1, dtype=torch.long, device=ids.device)
    cu[1:] = counts.cumsum(0)
    dest = torch.where(owned.flatten(), rank, -1).view(ids.shape).to(torch.int32)
    return dest, cu


def group_rows_ref(values: torch.Tensor, scales: torch.Tensor | None, weights: torch.Tensor,
                   dest: torch.Tensor, cu_expert_rows: torch.Tensor) -> GroupedRows:
    """Copy each token's row to every grouped row ``dest`` gives it (the unpack's second half).

    Args:
        values: [T, D] (fp8 or float).  scales: [T, G] or None.  weights: [T, A] fp32.
        dest: [T, A] from ``grouped_destinations``.
    """
    tok, slot = torch.nonzero(dest >= 0, as_tuple=True)
    rows = dest[tok, slot].long()
    m = int(cu_expert_rows[-1])
    out_v = values.new_empty(m, values.shape[1])
    out_v[rows] = values[tok]
    out_s = None
    if scales is not None:
        out_s = scales.new_empty(m, scales.shape[1])
        out_s[rows] = scales[tok]
    out_w = weights.new_empty(m, dtype=torch.float32)
    out_w[rows] = weights[tok, slot].float()
    out_t = torch.empty(m, dtype=torch.long, device=values.device)
    out_t[rows] = tok
    return GroupedRows(out_v, out_s, out_w, out_t, cu_expert_rows)


def unpack_grouped_ref(layout: PacketLayout, packets: torch.Tensor, dest: torch.Tensor,
                       cu_expert_rows: torch.Tensor) -> GroupedRows:
    """Gathered packets [T, words] -> this rank's ``GroupedRows`` (FP8 values + their scales)."""
    values, scales, weights, _ = split_packets(layout, packets)
    return group_rows_ref(values, scales, weights, dest, cu_expert_rows)


def dequant_act_fp8(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
                    group: int = 128) -> torch.Tensor:
    """[M, D] fp8 and per-row-per-group scales [M, G] -> [M, D] in ``dtype`` (product in fp32)."""
    d = values.shape[1]
    s = scales.float().repeat_interleave(group, dim=1)[:, :d]
    return (values.float() * s).to(dtype)
