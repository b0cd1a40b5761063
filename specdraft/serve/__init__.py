"""specdraft's OpenAI-compatible server and the engines' launch flags. Import the modules
themselves:

- `server`: the FastAPI app over specdraft's engine (`build_app`, `create_app`, `serve`,
  `serve_in_thread`), its worker thread (`worker`: one at a time; `batch_worker`: continuous
  batching) and /metrics.
- `protocol`: OpenAI's request parsing and response shapes, without the server.
- `engine_args`: the speculative settings read out of an SGLang or vLLM launch command.
"""
