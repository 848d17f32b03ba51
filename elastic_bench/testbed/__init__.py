"""The testbed: a small long-context model trained by the project and shipped with it (``--model testbed``).

What a run needs: ``vocab`` (word-level tokenizer), ``text`` (templates and words), ``generators`` (the task
generators, two families: sparsity-sensitive and sparsity-robust) and ``tasks`` (the registered ``testbed_*`` tasks,
found by the task registry through the ``elastic_bench.tasks`` entry point); the checkpoint itself lies in
``elastic_bench/data/testbed/``. The tooling that trained it is `elastic_bench.testbed.training`. Importing this
package imports no torch.
"""

# The streaming geometry the testbed is trained and evaluated with (`elastic-bench demo`, `testbed train`, `testbed
# eval`, `testbed heads`): sink tokens and local-window tokens.
STREAMING_SINK, STREAMING_LOCAL = 16, 256
