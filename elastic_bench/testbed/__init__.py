"""The testbed: a small long-context model trained by the project and shipped with it (``--model testbed``).

``vocab`` (word-level tokenizer), ``text`` (templates and words), ``generators`` (the task generators, two families:
sparsity-sensitive and sparsity-robust), ``tasks`` (registered ``testbed_*`` tasks), ``train`` (the training loop),
``evaluate`` (fast exact-match evaluation), ``data`` (router-training records), ``cli`` (``elastic-bench testbed``).
Importing this package imports no torch.
"""
