"""Training throughput and MFU of an EAGLE-3 (or --method dflash: DFlash) drafter on synthetic aux states.

Default shape: a Llama-3.1-8B drafter (hidden 4096, 32 heads, 8 kv heads, intermediate 14336,
target vocab 128256, draft vocab 32000), sequences of 2048 tokens, TTT unroll 7, bf16 autocast.
It runs specdraft's own training step (`Trainer.train_step`: TTT loss, backward, clipping,
AdamW, schedule) on inputs already on the device; the target-head recompute that an offline
store needs (lm_head(norm(last_hidden)), V x H per token) is timed on its own.

    python benchmarks/train_throughput.py                 # GPU, 8B shapes
    python benchmarks/train_throughput.py --tiny          # CPU smoke run (seconds): tiny shapes, 2 steps
    torchrun --nproc-per-node 2 benchmarks/train_throughput.py --batch-size 2   # FSDP2, 2 GPUs

Prints one JSON line. Definitions:
  tokens_per_s = base positions per second over all ranks (global batch x length / step time;
                 each is unrolled ttt_steps times). losses: every step's loss (warm-up first), to
                 compare runs on 1 and N GPUs (the same global batch of synthetic samples).
  mfu = (6 · trainable params (fc and lm_head included) · tokens · ttt_steps + attention FLOPs)
        / (step time · peak · ranks), peak = 989e12 (H100/H200 dense bf16) per GPU. The formula
        charges fc at every step although only step 0 applies it; `mfu_fc_once` charges it once.
  attention FLOPs = 3 (fwd + bwd) · 4 · heads · head_dim · useful query-key pairs, where step k
        attends T(T+1)/2 causal + k·T diagonal pairs per sequence (a dense masked kernel
        computes (k+1)·T² scores; flex attention with the TTT block mask, the CUDA default,
        computes about the useful ones).
--attention-ab also times the TTT loss forward + backward with flex attention and with SDPA
(dense mask) and prints the largest gradient difference between them.

--method eagle3.1 trains the EAGLE-3.1 drafter (fc_norm + norm_output: its flops are EAGLE-3's
plus the norms, not counted). --method dflash trains a DFlash block drafter instead (z-lab's b16 shape: --draft-layers 5,
--block-size 16, --num-anchors 512 blocks per sequence; the target's embedding and lm_head frozen):
  tokens_per_s = context positions per second (global batch x length / step time);
  block_positions_per_s = drafted block positions (anchors x (block_size - 1)) per second.
  mfu = 6 · (q, o, MLP params · block tokens + k, v params · (context + block tokens)) per layer
        + 6 · fc · context tokens + 4 · V · H · drafted positions (the frozen lm_head: forward and
        input gradient) + attention FLOPs 3 · 4 · heads · head_dim · useful pairs (a block attends
        its anchor's context and its own block; the dense SDPA mask computes all of them).

Measured figures: benchmarks/RESULTS.md (train_throughput).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specdraft.train.config import TrainConfig
from specdraft.train.dflash_loss import Blocks
from specdraft.train.dist import setup_dist
from specdraft.train.loss import target_logits, ttt_loss
from specdraft.train.settings import METHODS
from specdraft.train.sources import Batch, TargetInfo
from specdraft.train.trainer import Trainer

PEAK_FLOPS = 989e12

SHAPES = {
    "8b": dict(
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        num_hidden_layers=32,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        draft_vocab_size=32000,
        aux_layers=(2, 16, 29),
        seq_len=2048,
    ),
    "tiny": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=1024,
        num_hidden_layers=8,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        draft_vocab_size=256,
        aux_layers=(2, 4, 5),
        seq_len=128,
    ),
}


class SyntheticData:
    """A TrainData whose batches are fixed random tensors already on the device."""

    def __init__(
        self, shape: dict, batch_size: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        g = torch.Generator().manual_seed(0)
        v, h, t = shape["vocab_size"], shape["hidden_size"], shape["seq_len"]
        n_aux = len(shape["aux_layers"])
        config = {
            k: shape[k] for k in shape if k not in ("draft_vocab_size", "aux_layers", "seq_len")
        }
        target = {
            "architecture": "synthetic",
            "num_layers": shape["num_hidden_layers"],
            "hidden_size": h,
            "vocab_size": v,
            "name_or_path": None,
        }  # the drafter's manifest needs a target record
        self.info = TargetInfo(
            config=config,
            aux_layers=shape["aux_layers"],
            embed_weight=torch.randn(v, h, generator=g) * 0.02,
            manifest_fields={"target": target},
        )
        self.lm_head = (torch.randn(v, h, generator=g) * 0.02).to(device, dtype)
        self.info.lm_head_weight = self.lm_head  # a DFlash drafter shares it
        self.counts = torch.randint(0, 1000, (v,), generator=g)
        # one row per sample of the global batch, the same on every rank (seeded on the CPU)
        self.input_ids = torch.randint(0, v, (batch_size, t), generator=g).to(device)
        self.loss_mask = torch.ones(batch_size, t, dtype=torch.bool, device=device)
        self.aux_hidden = torch.randn(batch_size, t, n_aux * h, generator=g).to(device, dtype)
        self.last_hidden = torch.randn(batch_size, t, h, generator=g).to(device, dtype)
        self.norm_weight = torch.ones(h, device=device, dtype=dtype)
        self.target_logits = self.recompute_logits()
        self.batch_size = batch_size

    def __len__(self) -> int:
        return 1 << 20

    def token_counts(self, sample_ids) -> torch.Tensor:
        return self.counts  # synthetic counts: the same whatever the split

    def recompute_logits(self) -> torch.Tensor:
        """What StoreData does per batch: the target's logits from last_hidden."""
        return target_logits(self.last_hidden, self.norm_weight, self.lm_head, 1e-5)

    def batch(self, sample_ids, max_length, device) -> Batch:
        rows = list(sample_ids)
        return Batch(
            rows,
            self.input_ids[rows],
            self.loss_mask[rows],
            self.aux_hidden[rows],
            self.target_logits[rows],
        )


def timed(fn, iters: int, device: torch.device) -> float:
    """Mean seconds per call of fn() over `iters` calls (CUDA synchronised)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def flops_per_step(
    shape: dict, model: torch.nn.Module, batch: int, ttt: int
) -> tuple[float, float, float]:
    """(dense FLOPs per the formula, the same with fc charged once, attention FLOPs)."""
    t = shape["seq_len"]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    fc = model.fc.weight.numel()
    tokens = batch * t
    pairs = sum(t * (t + 1) / 2 + k * t for k in range(ttt)) * batch
    attention = 3 * 4 * shape["num_attention_heads"] * shape["head_dim"] * pairs
    dense = 6 * trainable * tokens * ttt
    return dense + attention, dense - 6 * fc * tokens * (ttt - 1) + attention, attention


def dflash_flops_per_step(
    shape: dict, draft: torch.nn.Module, blocks: Blocks
) -> tuple[float, float]:
    """(FLOPs of one DFlash training step per the module doc's formula, attention FLOPs), for
    the step's anchor draw `blocks` ([B, N] anchors and keep)."""
    cfg, t = draft.cfg, shape["seq_len"]
    bs, kept = cfg.block_size, int(blocks.keep.sum())
    block_tokens, context = kept * bs, blocks.keep.shape[0] * t
    q_width, kv_width = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
    )
    h = cfg.hidden_size
    per_block_token = 2 * h * q_width + 3 * h * cfg.intermediate_size
    per_any_token = 2 * h * kv_width
    layers = cfg.num_hidden_layers * (
        per_block_token * block_tokens + per_any_token * (context + block_tokens)
    )
    dense = 6 * layers + 6 * draft.fc.weight.numel() * context
    head = 4 * cfg.vocab_size * h * kept * (bs - 1)
    pairs = float(((blocks.anchors + bs) * bs * blocks.keep).sum())
    attention = 3 * 4 * cfg.num_attention_heads * cfg.head_dim * pairs
    return dense + head + attention, attention


def shape_and_defaults(args: argparse.Namespace) -> dict:
    """The shape to run (SHAPES, with --seq-len); fills args' unset counts (--tiny: a smoke run's)."""
    shape = dict(SHAPES["tiny" if args.tiny else "8b"])
    shape["seq_len"] = args.seq_len or shape["seq_len"]
    args.ttt_steps = args.ttt_steps or (2 if args.tiny else 7)
    args.iters = args.iters or (1 if args.tiny else 10)
    args.warmup = args.warmup if args.warmup >= 0 else (1 if args.tiny else 3)
    args.num_anchors = args.num_anchors or (8 if args.tiny else 512)
    args.draft_layers = args.draft_layers or (2 if args.tiny else 5)
    return shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tiny", action="store_true", help="tiny shapes on the CPU, 2 steps (smoke run)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=0, help="default: 2048 (tiny: 128)")
    parser.add_argument("--ttt-steps", type=int, default=0, help="default: 7 (tiny: 2)")
    parser.add_argument("--iters", type=int, default=0, help="timed steps (default: 10; tiny: 1)")
    parser.add_argument(
        "--warmup", type=int, default=-1, help="untimed steps first (default: 3; tiny: 1)"
    )
    parser.add_argument("--precision", default="", help="bf16 | fp32 (default: bf16 on CUDA)")
    parser.add_argument("--method", default="eagle3", choices=METHODS)
    parser.add_argument("--block-size", type=int, default=16, help="dflash: tokens per block")
    parser.add_argument("--num-anchors", type=int, default=0, help="dflash (default 512; tiny 8)")
    parser.add_argument("--draft-layers", type=int, default=0, help="dflash (default 5; tiny 2)")
    parser.add_argument(
        "--attention-ab",
        action="store_true",
        help="also time the TTT loss with flex attention vs SDPA and compare gradients",
    )
    args = parser.parse_args()

    shape = shape_and_defaults(args)
    ranks = setup_dist(
        "cpu" if args.tiny else "auto"
    )  # one process, or one rank of torchrun (FSDP2 over the ranks)
    device = ranks.device
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    data = SyntheticData(shape, args.batch_size, device, dtype)
    config = TrainConfig(
        lr=1e-5,
        warmup_steps=0,
        total_steps=args.warmup + args.iters + 1,
        batch_size=args.batch_size,
        max_length=shape["seq_len"],
        ttt_steps=args.ttt_steps,
        draft_vocab_size=shape["draft_vocab_size"],
        val_fraction=0.0,
        precision=precision,
        device=device.type,
        method=args.method,
        block_size=args.block_size,
        num_anchors=args.num_anchors,
        draft_overrides=(
            {"mask_token_id": shape["vocab_size"] - 1, "num_hidden_layers": args.draft_layers}
            if args.method == "dflash"
            else {}
        ),
    )
    trainer = Trainer(config, data, ranks)
    ids = list(range(args.batch_size))
    losses = []

    def step():
        losses.append(trainer.train_step(ids)["loss"])

    timed(step, args.warmup, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step_s = timed(step, args.iters, device)
    head_s = timed(data.recompute_logits, args.iters, device)
    draft = trainer.model.draft
    extra = {}
    if args.method == "dflash":
        inputs = trainer.objective.inputs(data.batch(ids, 0, device), trainer.step)
        blocks = Blocks(inputs["anchors"], inputs["keep"])
        flops, attention = dflash_flops_per_step(shape, draft, blocks)
        flops_fc_once = flops
        positions = int(blocks.keep.sum()) * (args.block_size - 1)
        extra = {"block_size": args.block_size, "block_positions_per_s": positions / step_s}
    else:
        flops, flops_fc_once, attention = flops_per_step(
            shape, draft, args.batch_size, args.ttt_steps
        )
    tokens = args.batch_size * shape["seq_len"]
    v, h = shape["vocab_size"], shape["hidden_size"]
    if not ranks.main:
        return
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "ranks": ranks.world,
                "shape": "tiny" if args.tiny else "8b",
                "precision": precision,
                "batch_size": args.batch_size,
                "seq_len": shape["seq_len"],
                "method": args.method,
                "ttt_steps": args.ttt_steps,
                "trainable_params": sum(p.numel() for p in draft.parameters() if p.requires_grad),
                "step_s": step_s,
                "tokens_per_s": tokens / step_s,
                "tflops_per_s": flops / step_s / 1e12,
                "mfu": flops / step_s / (PEAK_FLOPS * ranks.world),
                "mfu_fc_once": flops_fc_once / step_s / (PEAK_FLOPS * ranks.world),
                "attention_flops_fraction": attention / flops,
                "target_head_s": head_s,
                "target_head_tflops_per_s": 2 * tokens * v * h / head_s / 1e12,
                "target_head_fraction_of_step": head_s / (head_s + step_s),
                "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30
                if device.type == "cuda"
                else None,
                "losses": losses,
                **extra,
            }
        )
    )
    if (
        args.attention_ab and ranks.world == 1 and args.method != "dflash"
    ):  # (a rank alone cannot run an FSDP-sharded drafter)
        print(json.dumps({"attention_ab": attention_ab(trainer, data, args, device)}))


def attention_ab(trainer: Trainer, data: SyntheticData, args, device: torch.device) -> dict:
    """TTT loss forward + backward with flex attention (block mask) vs SDPA (dense mask):
    seconds per call and the largest gradient difference relative to the gradient's scale."""
    draft, cfg = trainer.model.draft, trainer.config
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=cfg.precision == "bf16")
    result, grads = {}, {}
    for name, flex in (("flex", True), ("sdpa", False)):

        def loss_backward(flex=flex):
            draft.zero_grad(set_to_none=True)
            with autocast:
                out = ttt_loss(
                    draft,
                    data.input_ids,
                    data.aux_hidden,
                    data.target_logits,
                    data.loss_mask,
                    ttt_steps=cfg.ttt_steps,
                    flex=flex,
                )
            out.loss.backward()

        timed(loss_backward, args.warmup, device)
        result[f"{name}_loss_backward_s"] = timed(loss_backward, args.iters, device)
        grads[name] = {
            n: p.grad.float().clone() for n, p in draft.named_parameters() if p.grad is not None
        }
    result["grad_max_rel_diff"] = max(
        float(
            (grads["flex"][n] - grads["sdpa"][n]).abs().max()
            / grads["sdpa"][n].abs().max().clamp(min=1e-30)
        )
        for n in grads["sdpa"]
    )
    return result


if __name__ == "__main__":
    main()
