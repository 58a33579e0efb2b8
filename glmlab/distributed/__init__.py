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
- ``random_shard``: a rank's shard of a random checkpoint drawn in place (full size, no disk).

Their benchmarks live in ``glmlab.bench`` (``engine_tp``, ``ops_cp``, ``cp_report``).
"""
