"""What a TTT unroll counts: one batch's loss and raw counts (`TTTOutput`, from `loss.ttt_loss`)
and their sums over batches (`TTTMetrics`), from which every rate is computed: per-step
accuracy, conditional acceptance alpha_k, simulated accept length tau, a chain engine's
replayed acceptance (`loss.replay_rounds`) and a block drafter's acceptance at its sampled anchors
(`dflash_loss.block_acceptance`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TTTOutput:
    """Loss and raw metric counts of one TTT unroll over a batch (K = unroll steps).

    loss:            scalar float32, differentiable: sum_k w_k * step_loss_sums[k] / total[k].
    step_loss_sums:  [K] float32, differentiable: per-step KL(p_target || q_draft) summed over
                     supervised positions (a distributed trainer normalises by global counts).
    step_losses:     [K] float32, detached: per-step mean KL over supervised positions (0 if none).
    correct, total:  [K] int64: supervised positions whose draft argmax (mapped through d2t)
                     equals the target argmax, and all supervised positions, per step.
    cond_correct, cond_total: [K] int64: the same restricted to base positions supervised at
                     steps 0..k whose steps 0..k-1 were all correct (alpha_k's numerator and
                     denominator).
    rounds, round_accepted: [] and [K] int64: a K-step chain engine's verification rounds at
                     T = 0 walked over the supervised runs (each round's base the token after the
                     last accepted one), and the rounds whose drafts 1..k+1 were all accepted
                     (`loss.replay_rounds`; zeros unless ttt_loss / dflash_loss(replay=True)).
    blocks, block_accepted: [] and [K] int64: a DFlash batch's blocks at its sampled anchors and
                     those whose drafts 1..k+1 all equal the target's greedy tokens
                     (`dflash_loss.block_acceptance`; zeros for EAGLE-3). Anchors drawn
                     uniformly, not the ones an engine's rounds reach: above rounds' rates.
    """

    loss: torch.Tensor
    step_loss_sums: torch.Tensor
    step_losses: torch.Tensor
    correct: torch.Tensor
    total: torch.Tensor
    cond_correct: torch.Tensor
    cond_total: torch.Tensor
    rounds: torch.Tensor
    round_accepted: torch.Tensor
    blocks: torch.Tensor
    block_accepted: torch.Tensor


@dataclass
class TTTMetrics:
    """Raw counts aggregated over batches; every rate is computed from them (never averaged).

    Each field is [K] int64 (see TTTOutput). `loss_sums` [K] float64 sums of per-position KL.
    """

    correct: torch.Tensor
    total: torch.Tensor
    cond_correct: torch.Tensor
    cond_total: torch.Tensor
    loss_sums: torch.Tensor
    rounds: torch.Tensor
    round_accepted: torch.Tensor
    blocks: torch.Tensor
    block_accepted: torch.Tensor

    @classmethod
    def zeros(cls, ttt_steps: int) -> TTTMetrics:
        z = torch.zeros(ttt_steps, dtype=torch.long)
        return cls(
            z.clone(),
            z.clone(),
            z.clone(),
            z.clone(),
            torch.zeros(ttt_steps, dtype=torch.float64),
            torch.zeros((), dtype=torch.long),
            z.clone(),
            torch.zeros((), dtype=torch.long),
            z.clone(),
        )

    def add(self, out: TTTOutput) -> None:
        """Accumulate one batch's counts (moved to the CPU)."""
        self.correct += out.correct.cpu()
        self.total += out.total.cpu()
        self.cond_correct += out.cond_correct.cpu()
        self.cond_total += out.cond_total.cpu()
        self.loss_sums += out.step_loss_sums.detach().double().cpu()
        self.rounds += out.rounds.cpu()
        self.round_accepted += out.round_accepted.cpu()
        self.blocks += out.blocks.cpu()
        self.block_accepted += out.block_accepted.cpu()

    def accuracy(self) -> list[float]:
        """Per-step accuracy over supervised positions (0.0 where a step had none)."""
        return _rates(self.correct, self.total)

    def alpha(self) -> list[float]:
        """Conditional acceptance alpha_k = P(step k correct | steps < k all correct)."""
        return _rates(self.cond_correct, self.cond_total)

    def tau(self) -> float:
        """Simulated accept length 1 + sum_k prod_{i<=k} alpha_i (tokens per verification), a
        per-position estimate; `replayed_tau` counts the rounds an engine would run."""
        tau, prod = 1.0, 1.0
        for a in self.alpha():
            prod *= a
            tau += prod
        return tau

    def replayed_acceptance(self) -> list[float]:
        """p_k of a ttt_steps-step chain engine at T = 0: rounds whose drafts 1..k+1 were all
        accepted / rounds (empty without replayed rounds)."""
        rounds = int(self.rounds)
        return [int(a) / rounds for a in self.round_accepted] if rounds else []

    def replayed_tau(self) -> float | None:
        """Accept length of that chain engine, 1 + accepted drafts / rounds (None without rounds)."""
        rounds = int(self.rounds)
        return 1 + int(self.round_accepted.sum()) / rounds if rounds else None

    def block_acceptance(self) -> list[float]:
        """p_k of a block drafter's blocks at sampled anchors, each scored as an engine's round
        there: blocks whose drafts 1..k+1 were all right / blocks (empty without blocks)."""
        blocks = int(self.blocks)
        return [int(a) / blocks for a in self.block_accepted] if blocks else []

    def block_tau(self) -> float | None:
        """1 + accepted drafts / blocks of those blocks (None without blocks)."""
        blocks = int(self.blocks)
        return 1 + int(self.block_accepted.sum()) / blocks if blocks else None

    def step_losses(self) -> list[float]:
        """Per-step mean KL over supervised positions."""
        return [float(s) / max(int(n), 1) for s, n in zip(self.loss_sums, self.total)]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary: rates and the raw counts they come from."""
        return {
            "accuracy": self.accuracy(),
            "alpha": self.alpha(),
            "tau": self.tau(),
            "step_losses": self.step_losses(),
            "correct": self.correct.tolist(),
            "total": self.total.tolist(),
            "cond_correct": self.cond_correct.tolist(),
            "cond_total": self.cond_total.tolist(),
            "replayed_rounds": int(self.rounds),
            "replayed_acceptance": self.replayed_acceptance(),
            "replayed_tau": self.replayed_tau(),
            "blocks": int(self.blocks),
            "block_acceptance": self.block_acceptance(),
            "block_tau": self.block_tau(),
        }


def _rates(num: torch.Tensor, den: torch.Tensor) -> list[float]:
    return [int(a) / int(b) if int(b) else 0.0 for a, b in zip(num, den)]
