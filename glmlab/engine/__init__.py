"""The serving engine: continuous batching over the hybrid cache (``engine.Engine``), its
scheduler, runner and sampler, the offline ``llm.LLM``, and an in-process prefill/decode pair
(``local_pd``). ``glmlab.LLM`` and ``glmlab.SamplingParams`` are the short names."""
