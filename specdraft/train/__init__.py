"""Training: `config` (TrainConfig, merging a --config file, flags and a checkpoint's settings; data
order, lr schedule), `loop` (the Trainer and the `train` entry point), `run_dir` (checkpoints,
pruning, resume, metrics log, final drafter), `dist` (ranks, signals), `loss` (the TTT loss, pure
functions) and `sources` (capture stores and online targets as training data).

Import the trainer as `from specdraft.train.loop import train` and its settings as
`from specdraft.train.config import TrainConfig`.
"""

from specdraft.train.loss import TTTMetrics, TTTOutput, target_logits, ttt_loss, ttt_unroll

__all__ = ["TTTMetrics", "TTTOutput", "target_logits", "ttt_loss", "ttt_unroll"]
