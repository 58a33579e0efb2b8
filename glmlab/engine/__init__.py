"""The serving engine: ``Engine.from_pretrained(path, EngineConfig)`` (``engine``) batches requests
continuously over the hybrid cache; ``model_runner.ModelRunner`` loads the checkpoint for the
config, owns the pools and runs every forward; ``scheduler`` picks each step's tokens;
``detokenizer`` turns a request's ids into text deltas and finds its stop strings; ``llm.LLM`` is
the offline API and ``local_pd`` an in-process prefill/decode pair. Shared records and the sampler
are ``glmlab.core``; ``glmlab.LLM`` and ``glmlab.SamplingParams`` are the short names."""
