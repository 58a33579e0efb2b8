"""glmlab.kernels.dsa: the k-pool indexer and absorbed sparse MLA (specification in ref.py).

Light to import (torch only): the references, the KV byte layouts and the tile dispatch rule.
The fast kernels live in their own modules and import their compilers only when used:
``glmlab.kernels.dsa.sparse_mla_tilelang`` (Partial + Combine, TileLang, SM90) and
``glmlab.kernels.dsa.indexer_triton`` (FP8 pooled-key scores + top-k, Triton).
"""

from glmlab.kernels.dsa.dispatch import GpuArch, SparseMlaConfig, choose_block, tile_iterations
from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout
from glmlab.kernels.dsa.ref import (
    indexer_scores_fp8_ref,
    indexer_scores_ref,
    pool_keys_ref,
    quantize_pool_keys_ref,
    select_ref,
    sparse_mla_combine_ref,
    sparse_mla_partial_ref,
    sparse_mla_ref,
)

__all__ = [
    "GpuArch", "KVFormat", "MlaKVLayout", "SparseMlaConfig", "choose_block", "tile_iterations",
    "indexer_scores_fp8_ref", "indexer_scores_ref", "pool_keys_ref", "quantize_pool_keys_ref",
    "select_ref", "sparse_mla_combine_ref", "sparse_mla_partial_ref", "sparse_mla_ref",
]
