"""Prefill/decode disaggregation: the per-request rule (``rule``), its settings
(``config``) and the two-leg stream the dispatch layer opens for a disaggregated pool
(``stream``)."""
