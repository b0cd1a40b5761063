"""specdraft's trainer and speculators' side by side: one capture store, one drafter size, the same
steps; both drafters scored by the same code.

Data (as tests/assets/pycode25m_draft/build.py makes the committed drafter's, smaller): windows of
Python source from this interpreter's site-packages, the target's greedy continuations
(`specdraft regenerate`), `specdraft capture`, then `specdraft store convert --to speculators` for
speculators. Held-out: the committed drafter's prompts (tests/assets/pycode25m_draft/prompts.jsonl).

Training: specdraft's `train` (what `specdraft train` runs) and speculators 0.9.0's trainer (its CLI
entry, `speculators.train.cli.main`), each with its own defaults but the given steps, TTT steps,
learning rate, warm-up, draft vocabulary, one draft layer of the target's sizes, about the same
tokens per step (specdraft: --batch-size samples; speculators packs --tokens-per-step tokens), float32,
one CPU thread each. speculators runs under another Python (`--speculators-python`, a venv with
speculators 0.9.0: .ci/speculators_tier.sh) through this script's `--speculators-worker`, which
makes its trainer run on the CPU with two patches, both for code that assumes an accelerator:
  - `trainer.get_local_rank` returns "cpu": Trainer moves the model and each batch with
    `.to(self.local_rank)`, the integer 0 = the accelerator (speculators/train/trainer.py:225, 355, 530);
  - `torch.accelerator.synchronize` is a no-op: its step timer syncs before every mark and raises
    without an accelerator (trainer.py:80, 91); CPU kernels finish before they return.
and one for --max-steps, which ends only the epoch it is reached in (trainer.py:519, 602): each
later epoch would train one more step, so those epochs skip training (`Trainer.train_epoch`),
and --epochs is the fewest that hold the steps (plus one).
Its `torch.autocast("cuda")` (trainer.py:228, 540; device_type "cuda" when no accelerator) disables
itself on the CPU with a warning; float32 throughout. `--loss-implementation eager`: its fused loss
needs Triton. Its vocabulary mapping comes from a token_freq.pt written by its own
`save_token_frequency_distribution` (its data preparation skips it by default).

Scores, the same code for both drafters, both loaded by specdraft's loader:
  replayed τ of chains of 3 and 5: the drafter alone on the target's greedy continuations of the
    held-out prompts (train.loss.ttt_loss with replay, as doctor's offline run);
  engine τ: specdraft's engine, chains of 3 and 5, greedy, on the same prompts;
  tokens_per_s: training tokens (non-pad positions) per second over the steps after the first,
    each trainer's data loading included, validation and checkpoints excluded.

    python benchmarks/side_by_side.py --work /tmp/sbs --speculators-python /tmp/nf-spec-ci-venv/bin/python
    python benchmarks/side_by_side.py --tiny   # stories260K, 3 steps; speculators: null (with the reason) without it

Prints one JSON line; measured figures: benchmarks/RESULTS.md (side_by_side).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "tests" / "assets" / "pycode25m_draft"
PYCODE = ROOT.parent / "shared" / "models" / "pycode-25m"
CHAINS = (3, 5)


def cli(*args: str) -> None:
    """`python -m specdraft.cli ARGS` (this checkout), echoed."""
    print("$ specdraft " + " ".join(args), file=sys.stderr, flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(
        [sys.executable, "-m", "specdraft.cli", *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def training_prompts(count: int) -> list[str]:
    """Windows of site-packages Python source, as build.py draws the committed drafter's (its
    file order and seed; its held-out files excluded)."""
    import site
    import sysconfig

    sys.path.insert(0, str(ASSETS))
    from build import windows  # tests/assets/pycode25m_draft/build.py

    roots = sorted({sysconfig.get_paths()["purelib"], *site.getsitepackages()})
    files = sorted({f for root in roots for f in Path(root).rglob("*.py")})
    rng = random.Random(0)
    rng.shuffle(files)
    return windows(files[:-256][: 3 * count], rng)[:count]


def prepare(work: Path, target: str, texts: list[str], new_tokens: int) -> tuple[Path, Path]:
    """The specdraft store and its speculators conversion under `work` (kept between runs)."""
    store, spec_store = work / "store", work / "store-speculators"
    if not spec_store.exists():
        work.mkdir(parents=True, exist_ok=True)
        (work / "prompts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        cli(
            "regenerate",
            str(work / "prompts.jsonl"),
            str(work / "regen.jsonl"),
            "--target",
            target,
            "--no-chat",
            "--batch-size",
            "256",
            "--prompt-tokens",
            "64",
            "--max-new-tokens",
            str(new_tokens),
        )
        cli(
            "capture",
            target,
            str(work / "regen.jsonl"),
            str(store),
            "--no-chat",
            "--skip-bad",
            "--dtype",
            "fp32",
            "--max-length",
            str(64 + new_tokens),
        )
        cli("store", "convert", str(store), str(spec_store), "--to", "speculators")
    return store, spec_store


def train_specdraft(store: Path, out: Path, args: argparse.Namespace) -> dict:
    """specdraft's trainer on `store`; its drafter directory and training tokens/s."""
    from specdraft.capture.store import CaptureStore
    from specdraft.train.config import TrainConfig
    from specdraft.train.loop import train

    meta = CaptureStore(store).meta
    config = TrainConfig(
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        total_steps=args.steps,
        batch_size=args.batch_size,
        max_length=args.tokens_per_step,
        ttt_steps=args.ttt_steps,
        draft_vocab_size=args.draft_vocab_size,
        eval_every=args.steps + 1,
        save_every=args.steps,
        val_fraction=1 - args.train_ratio,
        seed=0,
    )
    ends: list[float] = []
    train(config, store, out, progress=False, on_step=lambda step: ends.append(time.perf_counter()))
    # steps 2 .. N-1: the last step's time holds the final validation and checkpoint
    tokens = (len(ends) - 2) * args.batch_size * meta["num_tokens"] / meta["num_samples"]
    return {
        "draft": str(out / "draft"),
        "steps": len(ends),
        "tokens_per_s": tokens / (ends[-2] - ends[0]),
    }


def train_speculators(
    store: Path, spec_store: Path, out: Path, target: str, args: argparse.Namespace
) -> dict:
    """speculators' trainer on the converted store, in `--speculators-python`; its result line.
    Its aux layers are the store's (on a Llama, speculators' ids are specdraft's indices)."""
    from specdraft.capture.store import CaptureStore

    layers = [str(k) for k in CaptureStore(store).meta["aux_layers"]]
    worker = [
        args.speculators_python,
        str(Path(__file__).resolve()),
        "--speculators-worker",
        "--",
        "--verifier-name-or-path",
        target,
        "--data-path",
        str(spec_store),
        "--save-path",
        str(out),
        "--hidden-states-dtype",
        "float32",
        "--num-workers",
        "0",
        "--total-seq-len",
        str(args.tokens_per_step),
        "--ttt-steps",
        str(args.ttt_steps),
        "--draft-vocab-size",
        str(args.draft_vocab_size),
        "--lr",
        str(args.lr),
        "--scheduler-warmup-steps",
        str(args.warmup_steps),
        "--max-steps",
        str(args.steps),
        "--train-data-ratio",
        str(args.train_ratio),
        "--logger",
        "",
        "--on-missing",
        "raise",
        "--draft-attn-impl",
        "sdpa",
        "--full-attention-indices",
        "0",
        "--loss-implementation",
        "eager",
        "--log-freq",
        "1",
        "--num-layers",
        "1",
        "--seed",
        "0",
        "--target-layer-ids",
        *layers,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    done = subprocess.run(worker, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"speculators' trainer failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def speculators_worker(argv: list[str]) -> None:
    """Run speculators' trainer on the CPU (the patches in the module docstring); print its
    drafter directory (the last epoch's checkpoint), steps and tokens/s from its step timer."""
    import speculators.train.trainer as trainer_module
    from datasets import load_from_disk
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    def train_epoch(self, epoch: int, **kwargs) -> None:
        if self.global_step < self.config.max_steps:
            one_epoch(self, epoch, **kwargs)

    one_epoch = trainer_module.Trainer.train_epoch
    trainer_module.Trainer.train_epoch = train_epoch
    trainer_module.get_local_rank = lambda: "cpu"
    torch.accelerator.synchronize = lambda device=None: None
    torch.set_num_threads(1)
    value = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    data = Path(value["--data-path"])
    rows = load_from_disk(str(data)).with_format("torch")
    save_token_frequency_distribution(rows, data / "token_freq.pt")
    train_tokens = float(sum(rows["seq_len"])) * float(value["--train-data-ratio"])
    epochs = math.ceil(int(value["--max-steps"]) * int(value["--total-seq-len"]) / train_tokens) + 1
    profiles: list[dict] = []  # its step timer's record of every step (log_freq 1)

    def profile(self, num_tokens: int) -> dict | None:
        record = step_profile(self, num_tokens)
        profiles.append(record)
        return record

    step_profile = trainer_module._StepTimer.profile
    trainer_module._StepTimer.profile = profile
    sys.argv = [sys.argv[0], *argv, "--epochs", str(epochs)]
    main(TrainConfig.resolve())
    later = profiles[1:]
    tokens = sum(p["tokens_per_s"] * p["step_ms"] / 1000 for p in later)
    save = Path(value["--save-path"])
    last = max((p for p in save.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    print(
        json.dumps(
            {
                "draft": str(last),
                "steps": len(profiles),
                "tokens_per_s": tokens / (sum(p["step_ms"] for p in later) / 1000),
            }
        )
    )


def heldout_prompts(target: str, count: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(target) / "tokenizer.json"))
    with open(ASSETS / "prompts.jsonl") as f:
        return [tokenizer.encode(json.loads(line)["text"]).ids[:64] for line in f][:count]


def score(draft_dir: str, target: str, prompts: list[list[int]], new_tokens: int) -> dict:
    """Replayed and engine τ of chains of 3 and 5 for one drafter (specdraft's loader and code)."""
    from pycode_speed import decode  # benchmarks/, the script's directory

    from specdraft.checkpoint import load_draft
    from specdraft.engine.load import load_engine
    from specdraft.engine.spec_config import SpecConfig
    from specdraft.targets import load_target
    from specdraft.train.loss import ttt_loss
    from specdraft.train.metrics import TTTMetrics

    plain = load_engine(target, None, None, max_seq_len=512)
    continuations = [plain.generate(p, new_tokens).token_ids for p in prompts]
    tgt = load_target(target)
    draft = load_draft(
        draft_dir, dtype=torch.float32, target_num_layers=tgt.num_layers
    ).model.eval()
    if not draft.cfg.owns_embedding:
        draft.load_target_embedding(tgt.embed_tokens.weight.detach().float())
    result: dict[str, float | None] = {}
    for k in CHAINS:
        metrics = TTTMetrics.zeros(k)
        with torch.no_grad():
            for p, c in zip(prompts, continuations, strict=True):
                ids = torch.tensor([p + c])
                mask = torch.tensor([[0] * len(p) + [1] * len(c)], dtype=torch.bool)
                out = tgt.forward(ids, aux_layers=list(draft.cfg.aux_layers))
                metrics.add(
                    ttt_loss(
                        draft,
                        ids,
                        out.aux_hidden.float().clone(),
                        out.logits.clone(),
                        mask,
                        ttt_steps=k,
                        replay=True,
                    )
                )
        result[f"replayed_tau_chain{k}"] = metrics.replayed_tau()
        engine = load_engine(target, draft_dir, SpecConfig.chain(k), max_seq_len=512)
        result[f"engine_tau_chain{k}"] = decode(engine, prompts, new_tokens)[2]
    return {k: v if v is None else round(v, 3) for k, v in result.items()}


def speculators_missing(python: str) -> str | None:
    """Why `python` cannot run speculators' trainer (None: it can)."""
    probe = subprocess.run(
        [python, "-c", "import speculators.train.cli"],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    if probe.returncode != 0:
        return (
            f"speculators does not import under {python}: {probe.stderr.strip().splitlines()[-1:]}"
        )
    return None


def run(args: argparse.Namespace, target: str, work: Path) -> dict:
    torch.set_num_threads(1)
    store, spec_store = prepare(work, target, args.texts, args.new_tokens)
    prompts = heldout_prompts(target, args.heldout)
    runs = {"specdraft": lambda: train_specdraft(store, work / "specdraft-run", args)}
    missing = speculators_missing(args.speculators_python)
    if missing is None:
        runs["speculators"] = lambda: train_speculators(
            store, spec_store, work / "speculators-run", target, args
        )
    else:
        print(f"speculators skipped: {missing}", flush=True)
    line: dict = {"speculators": None, "speculators_skipped": missing, "steps": args.steps}
    for name, trained in runs.items():
        result = trained()
        line[name] = {
            "steps": result["steps"],
            "train_tokens_per_s": round(result["tokens_per_s"], 1),
            **score(result["draft"], target, prompts, args.new_tokens),
        }
        print(json.dumps({name: line[name]}), flush=True)
    return line


def main() -> None:
    if "--speculators-worker" in sys.argv:
        speculators_worker(sys.argv[sys.argv.index("--") + 1 :])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(PYCODE))
    parser.add_argument("--work", type=Path, help="data and runs (the data is kept between runs)")
    parser.add_argument("--speculators-python", default=sys.executable)
    parser.add_argument("--train-prompts", type=int, default=256)
    parser.add_argument(
        "--new-tokens", type=int, default=64, help="continuation tokens (training and held-out)"
    )
    parser.add_argument("--heldout", type=int, default=32, help="held-out prompts scored")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--ttt-steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8, help="specdraft's samples per step")
    parser.add_argument(
        "--tokens-per-step", type=int, default=1024, help="speculators' packed length"
    )
    parser.add_argument("--draft-vocab-size", type=int, default=1024)
    parser.add_argument("--train-ratio", type=float, default=0.95)
    parser.add_argument(
        "--tiny", action="store_true", help="stories260K, 24 documents, 3 steps (CPU smoke run)"
    )
    args = parser.parse_args()
    if not args.tiny:
        if args.work is None:
            parser.error("--work is required (or --tiny)")
        args.texts = training_prompts(args.train_prompts)
        print(json.dumps(run(args, args.target, args.work)))
        return
    from tiny_pair import tiny_demo_dir  # benchmarks/, the script's directory

    from specdraft.stories260k import SAMPLE_FILE, bundled_dir

    with tempfile.TemporaryDirectory(prefix="side-by-side-") as tmp:
        root = tiny_demo_dir(Path(tmp))
        docs = [d for d in (bundled_dir() / SAMPLE_FILE).read_text().split("\n\n") if d.strip()]
        args.texts, args.steps, args.warmup_steps, args.new_tokens, args.heldout = (
            docs[:24],
            3,
            1,
            8,
            2,
        )
        args.draft_vocab_size, args.tokens_per_step, args.batch_size, args.ttt_steps = (
            256,
            128,
            2,
            5,
        )
        print(json.dumps(run(args, str(root / "target"), Path(tmp) / "work")))


if __name__ == "__main__":
    main()
