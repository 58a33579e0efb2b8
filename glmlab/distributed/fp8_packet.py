"""FP8 MoE activation transport: byte accounting and the choice of pack/unpack implementation.

The packet format itself (``PacketLayout``: FP8 values | fp32 scales | top-k weights | expert ids)
is defined once in ``glmlab.kernels.fp8.packet_ref``; the kernels and the numbers below read it
from there. This module knows nothing about process groups or models.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from glmlab.kernels.fp8.packet_ref import PacketLayout, pack_ref, unpack_grouped_ref


class PacketKernels(str, Enum):
    TORCH = "torch"  # the references: run anywhere
    TRITON = "triton"  # fused one-pass kernels (GPU, or the interpreter on CPU)


def packet_ops(kind: PacketKernels) -> tuple[Callable, Callable]:
    """(pack, unpack_grouped) with the signatures of ``pack_ref`` / ``unpack_grouped_ref``."""
    if PacketKernels(kind) is PacketKernels.TRITON:
        from glmlab.kernels.fp8.packet_triton import pack_triton, unpack_grouped_triton

        return pack_triton, unpack_grouped_triton
    return pack_ref, unpack_grouped_ref


def transport_bytes(hidden: int, top_k: int, group: int = 128) -> dict[str, float]:
    """Per-token all-gather payload of the two MoE transports, and what the packet saves.

    >>> transport_bytes(4096, 8)["packet_bytes"]
    4288
    """
    layout = PacketLayout(hidden, top_k, group)
    bf16, packet = layout.bf16_bytes_per_token(), layout.bytes_per_token
    return {
        "hidden": hidden,
        "top_k": top_k,
        "bf16_bytes": bf16,
        "packet_bytes": packet,
        "packet_payload_bytes": layout.payload_bytes,
        "ratio": packet / bf16,
        "saving": 1 - packet / bf16,
    }


def gathered_bytes(num_tokens: int, cp: int, bytes_per_token: int) -> int:
    """Bytes one rank receives from an all-gather of a T-token step (padded to cp rows each)."""
    return cp * (-(-num_tokens // cp)) * bytes_per_token
