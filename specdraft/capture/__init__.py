"""Capture: run the target over a dataset and keep what training needs, a sharded safetensors store.

- `store`: the store's layout on disk, its settings (`StoreSettings`), sizes, and reading a
  finished store (`CaptureStore`); `CaptureError`.
- `forward`: running the target: the sample -> shard plan, length batches, one shard's tensors,
  the target's head and identity.
- `write`: writing a store and resuming an interrupted one (`write_store`).
- `stage`: the whole `specdraft capture` stage: load target, tokenizer and data (`load_inputs`),
  then `write_store` (`capture_dataset`).
- `convert` / `from_peer` / `peers` / `recorded`: `specdraft store convert` between specdraft's
  store and the peers' (speculators, SpecForge).
- `vllm`: the same store with the network run by vLLM (`--engine vllm`): `HeadTarget` (config and
  head weights from the files), `VllmCapture` (one engine, one shard at a time).
- `vllm_connector`: the KV connector vLLM loads to write each request's states (imports vLLM).
"""
