"""Training: `settings` (TrainConfig, each setting declared once with its help, flag and resume rule),
`config` (merging a --config file, flags and a checkpoint's settings; data order, lr schedule),
`loop` (the Trainer and the `train` entry point), `run_dir` (checkpoints, pruning, resume, metrics
log, final drafter), `dist` (ranks, signals), `loss` (the TTT loss, pure functions) and `sources`
(capture stores and online targets as training data).

Import the trainer as `from specdraft.train.loop import train` and its settings as
`from specdraft.train.config import TrainConfig`. Importing the package imports no torch (the CLI
reads `settings` to build its options).
"""
