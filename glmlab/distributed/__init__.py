"""glmlab.distributed: parallelism applied to the single-device model as a transformation.

- ``parallel``: process groups (cp, tp, ep) over torch.distributed and ``launch`` for N ranks;
- ``interleave``: interleaved token shards and the CP all-gather / reduce-scatter;
- ``cp``: ``CPPrefill``, interleaved context-parallel prefill (DSA local queries, KDA in order);
- ``kda_tp``: KDA heads split over the group;
- ``ep_moe``: MoE with experts split over the CP group, BF16 or FP8-packet dispatch;
- ``fp8_packet``: byte accounting and kernel choice for the FP8 activation packets;
- ``check``: the same prefill single-device and under CP, for comparisons; ``cli``: ``glmlab dist``;
- ``tp``: ``apply_tp``, tensor (heads, MLP channels) + expert parallelism on replicated tokens;
- ``engine_tp``: the engine under TP, every rank in step (``LeaderEngine`` / ``follow``);
- ``tp_check``: the same requests through one engine and a TP engine, for comparisons;
- ``random_shard``: a rank's shard of a random checkpoint drawn in place (full size, no disk),
  TP/EP (``random_tp_model``) or CP prefill (``random_cp_prefill``);
- ``draft_tp``: a DFlash2 draft split over TP like the target's layers;
- ``standin``: rank r of a layout alone on one device, a process group that communicates nothing
  and records every collective; ``standin_check`` compares it with real gloo ranks;
- ``comm_table`` / ``comm_model``: collective times per (kind, ranks) with their sources, and the
  price of a recorded step (docs/reference-point.md).

Their benchmarks live in ``glmlab.bench`` (``engine_tp``, ``ops_cp``, ``cp_report``, ``ops_comm``,
``reference_point``).
"""
