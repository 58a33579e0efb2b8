"""Benchmarks and load generators; each writes JSONL rows to ``data/bench/`` (``ops.write_rows``).

- ``engine``: offline engine throughput, FP8-KV agreement, PD slot accounting;
- ``engine_tp``: a TP/EP engine on N ranks, closed loop, rung by rung (mixed or in-process PD);
- ``spec``: speculative cycle phase times (MTP vs DFlash2);
- ``model``: prefill / decode of the bare model per backend;
- ``ops`` (``ops_moe``, ``ops_dsa``, ``ops_cp``): kernel and CP-prefill timings; ``cp_report``
  reads the CP rows next to the reference deployment's prefill ladder;
- ``serving``, ``client``, ``workloads``, ``metrics``: ``glmlab bench`` against an HTTP server;
- ``routing``: MoE routing samples captured from a model run (for ``glmlab tune moe``);
- ``reference_point`` (``reference_decode``, ``reference_prefill``, ``reference_layout``,
  ``reference_rows``, ``reference_report``, ``layer_timer``): the reference deployment's decode and
  prefill points on one emulated rank; ``ops_comm``: NCCL collective times for the comm model.
"""
