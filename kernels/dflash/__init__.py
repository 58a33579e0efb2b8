"""glmlab.kernels.dflash: the DFlash2 draft's block attention over a request's context, read from
the draft KV store by token slot (flash-decoding split over the context, never gathered); see
ref.py for the specification and attention_triton.py for the kernel."""
