"""Training: `settings` (TrainConfig, each setting declared once with its help, flag and resume rule),
`config` (merging a --config file, flags and a checkpoint's settings; data order, lr schedule),
`loop` (the loop and the `train` entry point), `trainer` (the Trainer: the training step), `state`
(what a checkpoint holds of it, resume), `run_dir` (checkpoints, pruning, metrics log, final
drafter), `dist` (ranks, signals), `loss` (the TTT loss, pure functions), `metrics` (its counts and
rates), `sources` (the training-data interface, online targets), `store_data` (capture stores as
training data) and `errors`.

Import the trainer as `from specdraft.train.loop import train` and its settings as
`from specdraft.train.config import TrainConfig`. Importing the package imports no torch (the CLI
reads `settings` to build its options).
"""
