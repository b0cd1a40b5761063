"""Training-time test (TTT): the unrolled draft, its loss and its per-step metrics.

Pure functions over tensors; nothing here knows about epochs, optimizers or files.

Alignment (DESIGN.md §2, "Token alignment"), for a sequence x_0 .. x_{T-1}:
draft step k at base position t reads token x_{t+1+k}, the target's aux states at t (k = 0)
or its own step-(k-1) pre-norm output at t (k >= 1), RoPE position t+k, and predicts
x_{t+2+k}; it is trained to match the target's distribution at position t+1+k and is
supervised iff loss_mask[t+2+k] (the label is an assistant token) and the target's argmax
there is inside the draft vocabulary.

Attention is what the engine's cache holds when it drafts step k from base position t:
step-0 keys at positions <= t (causal) and the step-j keys (j = 1..k) of the same base
position t only (one diagonal per step). All T base positions run at once: step k passes
the keys of steps 0..k-1 as `past_kv` and the mask [causal | diag | ... | diag].
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from specdraft.data.labels import draft_loss_mask
from specdraft.draft import KV, DraftOutput, Eagle3Draft
from specdraft.train.metrics import TTTOutput


def target_logits(
    last_hidden: torch.Tensor,
    norm_weight: torch.Tensor,
    lm_head_weight: torch.Tensor,
    eps: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """The target's logits from its last pre-norm hidden state (Llama-style RMSNorm + lm_head).

    last_hidden: [..., H] (specdraft index L, before the final norm), any float dtype.
    norm_weight: [H]; lm_head_weight: [V, H]; eps: the target's rms_norm_eps; softcap: the
    target's final_logit_softcapping (Gemma 2: logits = softcap * tanh(logits / softcap)) or None.
    Returns [..., V] float32, computed as transformers does: the norm in float32, cast back
    to the hidden dtype, scaled by the weight, then the head in the weights' dtype.
    Raises ValueError when the widths disagree.
    """
    h = last_hidden.shape[-1]
    if norm_weight.shape != (h,) or lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != h:
        raise ValueError(
            f"target head shapes norm {tuple(norm_weight.shape)}, lm_head "
            f"{tuple(lm_head_weight.shape)} do not fit hidden width {h}"
        )
    x = last_hidden.float()
    x = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(last_hidden.dtype)
    x = norm_weight * x
    logits = F.linear(x.to(lm_head_weight.dtype), lm_head_weight).float()
    return logits if softcap is None else torch.tanh(logits / softcap) * softcap


def step_weights(ttt_steps: int, step_weight: float) -> list[float]:
    """Loss weight of each unroll step: step_weight ** k for k = 0..ttt_steps-1."""
    return [step_weight**k for k in range(ttt_steps)]


def ttt_attention_mask(seq_len: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool mask [1, 1, T, (step+1)·T] for draft step `step` (True = attend).

    Columns are the keys of steps 0..step in order: step 0 causal (key position <= query's
    base position), every later step diagonal (the query's own base position only).
    """
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    diag = torch.eye(seq_len, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diag] * step, dim=1)[None, None]


def shift_left(x: torch.Tensor, n: int, fill: int | float | bool = 0) -> torch.Tensor:
    """x[:, t + n] at index t along dim 1, `fill` past the end. x: [B, T, ...]."""
    if n == 0:
        return x
    pad = x.new_full((x.shape[0], min(n, x.shape[1]), *x.shape[2:]), fill)
    return torch.cat([x[:, n:], pad], dim=1)


@functools.cache
def ttt_block_mask(seq_len: int, step: int, device: torch.device | str) -> BlockMask:
    """`ttt_attention_mask` as a flex-attention BlockMask (cached): flex computes only the
    blocks it keeps, the causal half of step 0's keys and the diagonals of later steps', where
    the dense masked kernel computes all (step+1)·T² scores."""

    def mask_mod(b, h, q_idx, kv_idx):
        key_position = kv_idx % seq_len
        return torch.where(kv_idx < seq_len, key_position <= q_idx, key_position == q_idx)

    return create_block_mask(mask_mod, None, None, seq_len, (step + 1) * seq_len, device=device)


# torch.compile's flex-attention kernel needs head_dim >= 16 (inductor: "NYI: embedding
# dimension of the query, key, and value must be at least 16"); eager flex has no backward on the CPU.
FLEX_MIN_HEAD_DIM = 16


def flex_by_default(device: torch.device, head_dim: int) -> bool:
    """Whether the TTT unroll uses flex attention by default: on CUDA, for head_dim >= 16."""
    return device.type == "cuda" and head_dim >= FLEX_MIN_HEAD_DIM


def ttt_unroll(
    draft: Eagle3Draft,
    input_ids: torch.Tensor,
    aux_hidden: torch.Tensor,
    ttt_steps: int,
    flex: bool | None = None,
) -> list[DraftOutput]:
    """Run the draft `ttt_steps` times over every base position of a batch (vectorized).

    input_ids:  [B, T] long target ids x_0..x_{T-1} (right-padded; padding never reaches a
                supervised position because later positions only see earlier ones).
    aux_hidden: [B, T, n_aux·H_target] the target's aux states at each position.
    flex:       attend with flex attention and `ttt_block_mask` instead of SDPA with the dense
                `ttt_attention_mask` (the same function of the inputs); default `flex_by_default`.
    Returns one DraftOutput per step; step k's logits at t predict x_{t+2+k}.
    """
    b, t = input_ids.shape
    device = input_ids.device
    flex = flex_by_default(device, draft.cfg.head_dim) if flex is None else flex
    positions = torch.arange(t, device=device)
    outputs: list[DraftOutput] = []
    for k in range(ttt_steps):
        out = draft(
            shift_left(input_ids, 1 + k),
            aux_hidden if k == 0 else outputs[-1].hidden,
            (positions + k).expand(b, t),
            first_step=k == 0,
            attn_mask=ttt_block_mask(t, k, device) if flex else ttt_attention_mask(t, k, device),
            past_kv=KV.cat([o.kv for o in outputs]) if outputs else None,
        )
        outputs.append(out)
    return outputs


def ttt_loss(
    draft: Eagle3Draft,
    input_ids: torch.Tensor,
    aux_hidden: torch.Tensor,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    ttt_steps: int = 7,
    step_weight: float = 0.8,
    flex: bool | None = None,
    replay: bool = False,
) -> TTTOutput:
    """TTT loss and metrics of one batch.

    input_ids:     [B, T] long; loss_mask: [B, T] (nonzero = assistant token, the label).
    aux_hidden:    [B, T, n_aux·H_target] aux states (offline store or online target).
    target_logits: [B, T, V] the target's logits (any float dtype; used in float32).
    Step k at base t is supervised iff t+2+k < T, loss_mask[t+2+k] and the target's argmax at
    t+1+k is in the draft vocabulary; its loss is KL(p || q) over the draft vocabulary, p the
    target's softmax renormalised over the draft vocabulary (ids arange(Vd) + d2t).
    flex: the attention path of `ttt_unroll` (default: flex attention on CUDA).
    replay: also count a chain engine's rounds over each row (`replay_rounds`; a host loop over
    the positions, for validation).
    Raises ValueError when ttt_steps < 1 or the shapes disagree.
    """
    _check_inputs(input_ids, target_logits, loss_mask, ttt_steps)
    target = _target_side(draft, target_logits)
    outputs = ttt_unroll(draft, input_ids, aux_hidden, ttt_steps, flex)
    steps = _step_counts(draft, outputs, target, loss_mask)
    step_loss_sums, total_t = torch.stack(steps.sums), torch.stack(steps.total)
    rounds, round_accepted = _replayed(steps.drafted, target.argmax, loss_mask, ttt_steps, replay)
    device = total_t.device
    return TTTOutput(
        loss=weighted_loss(step_loss_sums, total_t, step_weight),
        step_loss_sums=step_loss_sums,
        step_losses=(step_loss_sums.detach() / total_t.clamp(min=1)),
        correct=torch.stack(steps.correct),
        total=total_t,
        cond_correct=torch.stack(steps.cond_correct),
        cond_total=torch.stack(steps.cond_total),
        rounds=rounds.to(device),
        round_accepted=round_accepted.to(device),
        blocks=torch.zeros((), dtype=torch.long, device=device),
        block_accepted=torch.zeros_like(round_accepted, device=device),
    )


@dataclass
class _StepCounts:
    """Per TTT step k (one entry each): the KL sum over supervised positions (differentiable),
    the counts of `TTTOutput` (scalars), and the draft's argmax as target ids [B, T]."""

    sums: list[torch.Tensor] = field(default_factory=list)
    correct: list[torch.Tensor] = field(default_factory=list)
    total: list[torch.Tensor] = field(default_factory=list)
    cond_correct: list[torch.Tensor] = field(default_factory=list)
    cond_total: list[torch.Tensor] = field(default_factory=list)
    drafted: list[torch.Tensor] = field(default_factory=list)


def _step_counts(
    draft: Eagle3Draft, outputs: list[DraftOutput], target: _TargetSide, loss_mask: torch.Tensor
) -> _StepCounts:
    """Each unroll step's KL sum and counts against the target side `target` (`ttt_loss`)."""
    steps = _StepCounts()
    chain_ok = torch.ones_like(target.in_vocab)  # supervised and correct at every earlier step
    for k, out in enumerate(outputs):
        mask = supervision_mask(loss_mask, target.in_vocab, k)
        q_log = out.logits.float().log_softmax(-1)
        cross = (shift_left(target.p, 1 + k) * q_log).sum(-1)
        kl = shift_left(target.neg_entropy, 1 + k) - cross  # [B, T]
        steps.sums.append(torch.where(mask, kl, 0.0).sum())
        with torch.no_grad():
            steps.drafted.append(draft.draft_to_target(out.logits.argmax(-1)))
            hit = steps.drafted[-1] == shift_left(target.argmax, 1 + k)
            hit &= mask
            cond = chain_ok & mask
            steps.correct.append(hit.sum())
            steps.total.append(mask.sum())
            steps.cond_correct.append((hit & cond).sum())
            steps.cond_total.append(cond.sum())
            chain_ok = cond & hit
    return steps


def _check_inputs(
    input_ids: torch.Tensor, target_logits: torch.Tensor, loss_mask: torch.Tensor, ttt_steps: int
) -> None:
    """ValueError unless ttt_steps >= 1 and target_logits [B, T, V], loss_mask [B, T] fit
    input_ids [B, T]."""
    if ttt_steps < 1:
        raise ValueError(f"ttt_steps = {ttt_steps}: need at least 1")
    if target_logits.shape[:2] != input_ids.shape or loss_mask.shape != input_ids.shape:
        raise ValueError(
            f"shapes disagree: input_ids {tuple(input_ids.shape)}, target_logits "
            f"{tuple(target_logits.shape)}, loss_mask {tuple(loss_mask.shape)}"
        )


@torch.no_grad()
def _replayed(
    drafted: list[torch.Tensor],
    argmax: torch.Tensor,
    loss_mask: torch.Tensor,
    ttt_steps: int,
    replay: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rounds [] int64, round_accepted [K] int64) of a chain engine over every row of a batch
    (`replay_rounds`), from each step's drafted target ids [B, T] and the target's argmax [B, T];
    zeros without `replay`."""
    rounds = torch.zeros((), dtype=torch.long)
    round_accepted = torch.zeros(ttt_steps, dtype=torch.long)
    if not replay:
        return rounds, round_accepted
    hits = (torch.stack(drafted) == greedy_choices(argmax, ttt_steps)).cpu()  # [K, B, T]
    for b in range(loss_mask.shape[0]):
        n, per_pos = replay_rounds(hits[:, b], loss_mask[b].bool().cpu())
        rounds += n
        round_accepted += torch.tensor(per_pos)
    return rounds, round_accepted


def greedy_choices(argmax: torch.Tensor, num_steps: int) -> torch.Tensor:
    """[K, ..., T] long: row k at base t holds the target's greedy choice for token t+2+k, its
    argmax at position t+1+k (`argmax` [..., T]), or -1 past the sequence: what draft step k
    from base t must propose at T = 0 (DESIGN.md §2 token alignment)."""
    rows = (argmax[None] if argmax.dim() == 1 else argmax).clone()
    rows[..., -1] = -1  # the last position's argmax chooses a token past the sequence
    return torch.stack([shift_left(rows, 1 + k, -1) for k in range(num_steps)]).reshape(
        num_steps, *argmax.shape
    )


def replay_rounds(hits: torch.Tensor, supervised: torch.Tensor) -> tuple[int, list[int]]:
    """Walk a chain engine's rounds over one sequence at T = 0.

    hits: [K, T] bool, hits[k, t]: draft step k from base position t proposes token t+2+k
    correctly. supervised: [T] bool, the tokens the engine generates (each run of them is one
    answer). A run starting at token a is entered at base a - 1 (there the drafter reads the
    token the prefill produced); a round at base t accepts the leading hits of column t whose
    tokens lie in the run, and the next round's base is t + n + 1 (n drafts plus the target's
    bonus token); rounds go on while token t+2 is in the run. Returns (rounds, accepted_per_pos [K]).

    Rounds and positions are not alike: rounds crowd where drafts fail (each advances one or
    two tokens there), so per-round acceptance is below the per-position product of alphas
    (pycode-25m in vLLM: p_1 0.67 a round, 0.82 a position).
    """
    num_steps, length = hits.shape
    sup = supervised.tolist()
    column = hits.T.tolist()
    rounds, accepted = 0, [0] * num_steps
    a = 0
    while a < length:
        if not sup[a]:
            a += 1
            continue
        end = next((j for j in range(a, length) if not sup[j]), length)  # the run is a..end-1
        t = max(a - 1, 0)
        while t + 2 < end:
            n = 0
            while n < num_steps and t + 2 + n < end and column[t][n]:
                accepted[n] += 1
                n += 1
            rounds += 1
            t += n + 1
        a = end
    return rounds, accepted


def supervision_mask(loss_mask: torch.Tensor, in_vocab: torch.Tensor, step: int) -> torch.Tensor:
    """[B, T] bool: base positions t supervised at TTT step `step`.

    loss_mask: [B, T] (nonzero = assistant token); in_vocab: [B, T] bool, the target's argmax
    at each position is in the draft vocabulary. Supervised iff loss_mask[t+2+step] and
    in_vocab[t+1+step] (both inside the sequence).
    """
    return draft_loss_mask(loss_mask, step) & shift_left(in_vocab, 1 + step, False)


@torch.no_grad()
def supervised_counts(
    draft: Eagle3Draft, target_logits: torch.Tensor, loss_mask: torch.Tensor, ttt_steps: int
) -> torch.Tensor:
    """[K] int64: supervised positions per TTT step of a batch, i.e. `ttt_loss(...).total`,
    without running the draft (only its vocabulary map), so that a trainer knows a whole
    optimizer step's counts before the first micro-batch's backward.

    target_logits: [B, T, V] any float dtype; loss_mask: [B, T].
    """
    in_vocab = draft.t2d[target_logits.argmax(-1)]
    return torch.stack([supervision_mask(loss_mask, in_vocab, k).sum() for k in range(ttt_steps)])


@dataclass
class _TargetSide:
    """Per target position j (all [B, T, ...], no grad): what the draft must match there."""

    p: torch.Tensor  # [B, T, Vd] float32 softmax over the draft vocabulary
    neg_entropy: torch.Tensor  # [B, T] float32 sum p log p
    argmax: torch.Tensor  # [B, T] long target id of the target's argmax
    in_vocab: torch.Tensor  # [B, T] bool: the target's argmax is in the draft vocabulary


@torch.no_grad()
def _target_side(draft: Eagle3Draft, target_logits: torch.Tensor) -> _TargetSide:
    target_ids = torch.arange(draft.cfg.draft_vocab_size, device=draft.d2t.device) + draft.d2t
    logits = target_logits.float()
    argmax = logits.argmax(-1)
    p = logits[..., target_ids].softmax(-1)
    return _TargetSide(p, torch.special.xlogy(p, p).sum(-1), argmax, draft.t2d[argmax])


def weighted_loss(
    step_loss_sums: torch.Tensor, counts: torch.Tensor, step_weight: float
) -> torch.Tensor:
    """sum_k step_weight**k * step_loss_sums[k] / max(counts[k], 1); scalar, differentiable.

    step_loss_sums: [K] float; counts: [K] the number of positions each sum runs over (a
    distributed trainer passes counts summed over ranks, times the world size, so that the
    averaged gradients equal one process's).
    """
    weights = torch.tensor(
        step_weights(len(step_loss_sums), step_weight),
        dtype=step_loss_sums.dtype,
        device=step_loss_sums.device,
    )
    return (weights * step_loss_sums / counts.to(step_loss_sums.dtype).clamp(min=1)).sum()
