"""End-to-end benchmarks of models under methods (``elastic-bench bench prefill``)."""
