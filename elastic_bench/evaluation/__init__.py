"""Evaluation: the runner that fills a run folder cell by cell (`runner`) and the lm-evaluation-harness bridge
(`lm_eval_bridge`)."""
