"""glmlab.serve: the HTTP service around the Engine, mixed or disaggregated (prefill + decode).

Pieces: ``api`` (FastAPI app: the three generation routes share one path), ``schemas`` (request
bodies -> one ``GenRequest``, whose records live in ``genbatch``), ``responses`` (SGLang / OpenAI answers from the engine's records),
``errors``; ``worker`` (an ``Engine`` driven on its own thread, ``engine_thread``), ``pd`` (the PD
protocol), ``prefill`` / ``decode`` (the two PD roles), ``bootstrap`` (pairing by
``bootstrap_room``), ``kvplan`` (which cache rows a request sends), ``transfer`` (NIXL WRITE),
``shard`` (one rank's cache and drafter rows as NIXL regions), ``ranks`` (a TP worker's leader and
its lockstep followers);
``config`` (layouts, worker configs, the engine config of a role), ``router`` (sglang-router),
``supervisor`` (the processes of one service, restarted or failed), ``front`` (the service's one
address: /health, /server_info, the rest to the router), ``limits`` (body cap, stream send
timeout), ``server`` (one worker process), ``metrics``, ``timeline`` (per-request traces).
``glmlab serve`` is ``glmlab/commands/serve.py``; its behaviour under faults, docs/serving.md.
"""
