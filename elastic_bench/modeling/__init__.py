"""The model side: loading a model (`loading`), the method interface and registry (`interface`), the attention glue
that plugs a method into transformers' AttentionInterface (`attention`), the packed, evicting KV cache (`kv_cache`),
greedy generation with timed prefill and decode graphs (`generation`) and the decode step's compiled operations
(`fusion`)."""
