"""How the shipped testbed artifacts were made, and the tools to make them again: the model's training (`train`), its
exact-match evaluation (`evaluate`), the head ablation that gave the head gates and the key-matching probe (`heads`),
and the router-training records (`records`). A run needs none of it (`elastic_bench.testbed` is the runtime).
"""
