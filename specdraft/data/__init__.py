"""Training data, from input files to the tokens the drafter learns.

- `records`: read chats or texts (JSONL, `save_to_disk` directories, plain text) into `Records`;
  `DataError` / `BadRecord` for bad input.
- `render`: render records with the target's tokenizer into `Sample`s with loss masks; the
  template and tokenizer fingerprints and the data hash that manifests and stores record;
  `turns`: where each assistant turn is in the chat as the template renders it.
- `template`: a `--chat-template FILE` read as vLLM / SGLang read it and set on the tokenizer
  every stage renders with (capture, regenerate, train --online, serve, doctor).
- `labels`: which token is the label of which draft position (FC-07), label counts for the
  draft vocabulary.
- `vocab`: the draft vocabulary map (`d2t` / `t2d`): built from those counts, validated.
- `serving`: whether any engine serves the aux layers a store or a drafter is made for, on the
  target's class (the warning capture and train print before any work).
"""
