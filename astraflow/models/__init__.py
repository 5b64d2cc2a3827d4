"""Models: where a policy's model lives and how it is loaded: a local folder, a Hugging Face
hub id, a gguf file imported once into a safetensors folder, or a tiny model built in code
(docs/models.md).

Modules:

- :mod:`.config`: config section ``models.<policy>``, and :func:`model_dir`, which resolves it.
- :mod:`.hub`: Hugging Face hub ids as model paths, from the cache or the hub.
- :mod:`.importer`: importing a gguf file or a hub id into a plain safetensors folder.
- :mod:`.load`: loading a model folder: the model and its tokenizer.
- :mod:`.prompt`: a conversation in a tokenizer's chat format: text and token ids.
- :mod:`.source`: what a ``models.<policy>.path`` names, and where imports are cached.
- :mod:`.tiny`: a character-level tokenizer and a tiny Qwen2 model, made in code."""
