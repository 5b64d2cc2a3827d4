"""Models: where a policy's model lives and how it is loaded: a local folder, a Hugging Face
hub id, a gguf file imported once into a plain safetensors folder, or the tiny models built in
code for the quickstart, the tests and the benchmarks (docs/models.md).

Modules:

- :mod:`.config`: Config section ``models.<policy>``: where a policy's model lives, and
  :func:`model_dir`, which resolves it.
- :mod:`.hub`: Hugging Face hub ids as model paths: found in the Hugging Face cache, or fetched
  with ``huggingface_hub.snapshot_download`` where a hub is reachable.
- :mod:`.importer`: Importing a model into a plain safetensors folder: a gguf file (dequantized to
  fp32), a shortcut's gguf file, or a hub id.
- :mod:`.load`: Loading a model folder: the model and its tokenizer, ready for batched generation
  and training.
- :mod:`.prompt`: A conversation in a tokenizer's chat format: the text and the token ids a model
  sees.
- :mod:`.source`: What a ``models.<policy>.path`` names, and where imported models are cached.
- :mod:`.tiny`: A character-level tokenizer and a tiny Qwen2 model, made in code.
"""
