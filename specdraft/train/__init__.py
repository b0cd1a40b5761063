"""Training: the TTT loss (`loss.py`, pure functions) and the trainer (`loop.py`).

Import the trainer as `from specdraft.train.loop import TrainConfig, train`.
"""

from specdraft.train.loss import TTTMetrics, TTTOutput, target_logits, ttt_loss, ttt_unroll

__all__ = ["TTTMetrics", "TTTOutput", "target_logits", "ttt_loss", "ttt_unroll"]
