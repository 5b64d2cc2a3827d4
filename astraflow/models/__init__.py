"""Small causal LMs built locally from a config and a tokenizer made in code (no downloads):
what the quickstart, the tests and the benchmarks train. Real users point engines and trainers
at their own Hugging Face model directories instead."""
