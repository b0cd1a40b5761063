"""Regenerate: replace the answers of a dataset with the target's own outputs (EAGLE-3 trains
best on them).

- `backends`: who writes the answers: `LocalBackend` (transformers `generate`) and
  `EndpointBackend` (an OpenAI-compatible server); `Sampling`, `Prompt`, `RegenerationError`.
- `output`: the resumable JSONL output and its settings sidecar.
- `turns`: what is asked for each record and written back (chats turn by turn, continuations).
- `run`: regenerating a dataset into the output (`regenerate`), and the whole `specdraft
  regenerate` stage (`RegenConfig`, `regenerate_file`).
"""
