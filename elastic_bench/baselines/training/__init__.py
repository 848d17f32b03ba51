"""Training the baselines' head gates for any model, on the one training engine (`elastic_bench.training.engine`).

- `duo`: ``elastic-bench train-duo``, DuoAttention's gates α (distillation from the model with full attention).
- `prulong`: ``elastic-bench train-prulong``, PruLong's hard-concrete masks (LM loss plus a Lagrangian toward a
  target sparsity).
- `passkeys`: their data, DuoAttention's synthetic multi-passkey retrieval on a haystack corpus.
- `mixing`: the training-time attention that mixes each KV head's full and streaming branches by its gate.
- `base`: what the two trainers share (configuration fields, the run, the exported gate files).

The exported ``full_attention_heads.tsv`` is what ``duo_attention pattern=DIR`` and ``prulong pattern=DIR`` read.
"""
