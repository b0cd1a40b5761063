"""specdraft's trainer and speculators' side by side: one capture store, one drafter size, the same
steps; both drafters scored by the same code.

Two modes (--device):
  cpu (default): windows of Python source from this interpreter's site-packages (as
    tests/assets/pycode25m_draft/build.py draws the committed drafter's, fewer), the target's
    64-token greedy continuations (`specdraft regenerate`), `specdraft capture --dtype fp32`;
    held-out: the committed drafter's prompts (tests/assets/pycode25m_draft/prompts.jsonl); float32,
    one CPU thread each; 64 steps, TTT 5, lr 1e-3, 6 warm-up steps, draft vocabulary 1024,
    batch 8 (speculators: packed to 1,024 tokens).
  cuda: the full-size drafter's data and settings: `build.py --size full --stop-after-regenerate`
    (6,000 windows, 192-token continuations, its held-out prompts in <work>/prompts.jsonl), then
    `specdraft capture --device cuda --max-length 512`; train_config_full.json's hyper-parameters
    (lr 1e-3, 100 warm-up steps, batch 32, TTT 7, draft vocabulary 4096, MLP 1408 = the target's)
    for --steps (2000); bf16 autocast with fp32 master weights in both trainers (specdraft
    --precision bf16; speculators' default --hidden-states-dtype bfloat16); speculators packs
    batch x the store's mean sample length tokens a step and keeps its GPU defaults (flex
    attention, fused Triton loss, 12 loader workers).
Either way `specdraft store convert --to speculators` gives speculators its copy of the store, and
each trainer keeps its own defaults but these settings and one draft layer of the target's sizes.

Each trainer runs in a process of its own (benchmarks/side_by_side_workers.py: how tokens/s and
peak memory are measured, and the patches speculators' trainer gets). speculators runs under
--speculators-python (default: this Python), importing speculators 0.9.0 from its environment
or PYTHONPATH. On the GPU machine, no venv: the wheels of benchmarks/speculators_wheels.txt
(4.2 MB; `pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl -r
benchmarks/speculators_wheels.txt` here), carried as .whl and installed there with
`pip install --no-index --no-deps --target /tmp/site .whl/*.whl`, then
PYTHONPATH=$PWD:/tmp/site; openai, which it imports but uses only online, is
benchmarks/openai_stub.

Scores, the same code for both drafters, both loaded by specdraft's loader on --device, float32:
  replayed τ of chains of 3 and 5: the drafter alone on the target's greedy continuations of the
    held-out prompts (train.loss.ttt_loss with replay, as doctor's offline run);
  engine τ: specdraft's engine, chains of 3 and 5, greedy, on the same prompts.

Stages (--stages, comma-separated; default all): data (made once under --work, then kept),
specdraft, speculators (each retrains, its result kept in <work>/results.json), score (scores
every trained drafter in results.json and prints the whole line); so one run can be split over
calls of limited length on the same --work. On the H200, one run in the background over
repeated calls of one command: benchmarks/side_by_side_h200.sh.

    python benchmarks/side_by_side.py --work /tmp/sbs --speculators-python /tmp/nf-spec-ci-venv/bin/python
    python benchmarks/side_by_side.py --device cuda --work /root/sbs --target .carry/pycode-25m \
        --stages data,specdraft   # then --stages speculators, then --stages score
    python benchmarks/side_by_side.py --tiny   # stories260K, 3 steps; speculators: null (with the reason) without it

Prints one JSON line; measured figures: benchmarks/RESULTS.md (side_by_side).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "tests" / "assets" / "pycode25m_draft"
FULL_CONFIG = ASSETS / "train_config_full.json"
PYCODE = ROOT.parent / "shared" / "models" / "pycode-25m"
CHAINS = (3, 5)
STAGES = ("data", "specdraft", "speculators", "score")
# per device: the settings not given on the command line
DEFAULTS = {
    "cpu": {
        "steps": 64,
        "ttt_steps": 5,
        "lr": 1e-3,
        "warmup_steps": 6,
        "batch_size": 8,
        "tokens_per_step": 1024,
        "draft_vocab_size": 1024,
        "new_tokens": 64,
        "skip_steps": 1,
    },
    "cuda": {"steps": 2000, "new_tokens": 192, "skip_steps": 10},
}
FULL_KEYS = {"lr", "warmup_steps", "batch_size", "ttt_steps", "draft_vocab_size"}


def child_env() -> dict[str, str]:
    """This environment with this checkout first on PYTHONPATH (what else it names is kept)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1")


def cli(*args: str) -> None:
    """`python -m specdraft.cli ARGS` (this checkout), echoed."""
    print("$ specdraft " + " ".join(args), file=sys.stderr, flush=True)
    subprocess.run(
        [sys.executable, "-m", "specdraft.cli", *args],
        check=True,
        env=child_env(),
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


def prepare_cpu(work: Path, target: str, args: argparse.Namespace) -> None:
    """The CPU mode's data: regenerate and capture (fp32) `args.texts`."""
    (work / "prompts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in args.texts))
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
        str(args.new_tokens),
    )
    capture(work, target, "--dtype", "fp32", "--max-length", str(64 + args.new_tokens))


def capture(work: Path, target: str, *options: str) -> None:
    """`specdraft capture` of <work>/regen.jsonl into <work>/store (plain text, bad records
    skipped) with the mode's options."""
    cli(
        "capture",
        target,
        str(work / "regen.jsonl"),
        str(work / "store"),
        "--no-chat",
        "--skip-bad",
        *options,
    )


def prepare_cuda(work: Path, target: str) -> None:
    """The GPU mode's data: build.py --size full's regenerate step, then its capture (bf16
    default), as the full-size drafter's build runs them."""
    build = [sys.executable, str(ASSETS / "build.py"), "--target", target, "--work", str(work)]
    print("$ " + " ".join(build), file=sys.stderr, flush=True)
    subprocess.run(
        [*build, "--size", "full", "--stop-after-regenerate", "--device", "cuda"],
        check=True,
        env=child_env(),
        stdout=subprocess.DEVNULL,
    )
    capture(work, target, "--device", "cuda", "--max-length", "512")


def prepare(work: Path, target: str, args: argparse.Namespace) -> None:
    """The specdraft store (<work>/store) and its speculators conversion, made once."""
    if (work / "store-speculators").exists():
        return
    work.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda":
        prepare_cuda(work, target)
    else:
        prepare_cpu(work, target, args)
    cli(
        "store",
        "convert",
        str(work / "store"),
        str(work / "store-speculators"),
        "--to",
        "speculators",
    )


def store_meta(work: Path) -> dict:
    from specdraft.capture.store import CaptureStore

    return CaptureStore(work / "store").meta


def worker(command: list[str], name: str, work: Path) -> dict:
    """Run a trainer worker (this script with a worker flag); its JSON result line. Its stderr
    (progress, warnings) goes to <work>/<name>.log as it runs, its stdout to <work>/<name>.out."""
    with open(work / f"{name}.log", "w") as err, open(work / f"{name}.out", "w") as out:
        done = subprocess.run(command, env=child_env(), stdout=out, stderr=err, check=False)
    lines = (work / f"{name}.out").read_text().strip().splitlines()
    if done.returncode != 0:
        tail = (work / f"{name}.log").read_text()[-4000:]
        raise RuntimeError(f"{name}'s trainer failed (rc {done.returncode}):\n{tail}")
    return json.loads(lines[-1])


def train_specdraft(work: Path, args: argparse.Namespace) -> dict:
    """specdraft's trainer on <work>/store (into <work>/specdraft-run, made anew)."""
    base = json.loads(FULL_CONFIG.read_text()) if args.device == "cuda" else {}
    config = {
        **base,
        **{k: getattr(args, k) for k in FULL_KEYS},
        "total_steps": args.steps,
        "max_length": 512 if args.device == "cuda" else args.tokens_per_step,
        "eval_every": args.steps + 1,
        "save_every": args.steps,
        "val_fraction": 1 - args.train_ratio,
        "seed": 0,
        "precision": "bf16" if args.device == "cuda" else "fp32",
        "device": args.device,
    }
    out = work / "specdraft-run"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--specdraft-worker"]
    command += [json.dumps(config), str(work / "store"), str(out), str(args.skip_steps)]
    return worker(command, "specdraft", work)


def speculators_args(work: Path, target: str, args: argparse.Namespace) -> list[str]:
    """speculators' CLI arguments for this run (its aux layers are the store's: on a Llama,
    speculators' ids are specdraft's indices)."""
    meta = store_meta(work)
    tokens = args.tokens_per_step or round(
        args.batch_size * meta["num_tokens"] / meta["num_samples"]
    )
    given = {
        "--verifier-name-or-path": target,
        "--data-path": str(work / "store-speculators"),
        "--save-path": str(work / "speculators-run"),
        "--total-seq-len": str(tokens),
        "--ttt-steps": str(args.ttt_steps),
        "--draft-vocab-size": str(args.draft_vocab_size),
        "--lr": str(args.lr),
        "--scheduler-warmup-steps": str(args.warmup_steps),
        "--max-steps": str(args.steps),
        "--train-data-ratio": str(args.train_ratio),
        "--logger": "",
        "--on-missing": "raise",
        "--full-attention-indices": "0",
        "--num-layers": "1",
        "--seed": "0",
        "--log-freq": "50",  # its step timer syncs the GPU on logged steps (trainer.py:60)
    }
    if args.device == "cpu":  # no accelerator: its flex attention and Triton loss cannot run
        given.update(
            {
                "--hidden-states-dtype": "float32",
                "--num-workers": "0",
                "--draft-attn-impl": "sdpa",
                "--loss-implementation": "eager",
            }
        )
    layers = [str(k) for k in meta["aux_layers"]]
    extra = shlex.split(args.speculators_extra)  # after the others: its parser keeps the last
    return [x for item in given.items() for x in item] + ["--target-layer-ids", *layers, *extra]


def train_speculators(work: Path, target: str, args: argparse.Namespace) -> dict:
    """speculators' trainer on the converted store, in `--speculators-python`."""
    shutil.rmtree(work / "speculators-run", ignore_errors=True)
    command = [args.speculators_python, str(Path(__file__).resolve()), "--speculators-worker"]
    command += [args.device, str(args.skip_steps), "--", *speculators_args(work, target, args)]
    return worker(command, "speculators", work)


def heldout_prompts(file: Path, target: str, count: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(target) / "tokenizer.json"))
    with open(file) as f:
        return [tokenizer.encode(json.loads(line)["text"]).ids[:64] for line in f][:count]


def replayed_tau(draft_dir: str, target: str, prompts, continuations, k: int, device) -> float:
    """Replayed τ of a k-step chain: the drafter alone on the given greedy continuations."""
    from specdraft.checkpoint import load_draft
    from specdraft.targets import load_target
    from specdraft.train.loss import ttt_loss
    from specdraft.train.metrics import TTTMetrics

    tgt = load_target(target, device=device)
    draft = load_draft(
        draft_dir, device=device, dtype=torch.float32, target_num_layers=tgt.num_layers
    ).model.eval()
    if not draft.cfg.owns_embedding:
        draft.load_target_embedding(tgt.embed_tokens.weight.detach().float())
    metrics = TTTMetrics.zeros(k)
    with torch.no_grad():
        for p, c in zip(prompts, continuations, strict=True):
            ids = torch.tensor([p + c], device=device)
            mask = torch.tensor([[0] * len(p) + [1] * len(c)], dtype=torch.bool, device=device)
            out = tgt.forward(ids, aux_layers=list(draft.cfg.aux_layers))
            aux, logits = out.aux_hidden.float().clone(), out.logits.clone()
            metrics.add(ttt_loss(draft, ids, aux, logits, mask, ttt_steps=k, replay=True))
    return metrics.replayed_tau()


def score(draft_dir: str, target: str, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    """Replayed and engine τ of chains of 3 and 5 for one drafter (specdraft's loader and code)."""
    from pycode_speed import decode  # benchmarks/, the script's directory

    from specdraft.engine.load import load_engine
    from specdraft.engine.spec_config import SpecConfig

    device = args.device
    plain = load_engine(target, None, None, device=device, max_seq_len=512)
    continuations = [plain.generate(p, args.new_tokens).token_ids for p in prompts]
    result: dict[str, float | None] = {}
    for k in CHAINS:
        result[f"replayed_tau_chain{k}"] = replayed_tau(
            draft_dir, target, prompts, continuations, k, device
        )
        engine = load_engine(target, draft_dir, SpecConfig.chain(k), device=device, max_seq_len=512)
        result[f"engine_tau_chain{k}"] = decode(engine, prompts, args.new_tokens)[2]
    return {k: v if v is None else round(v, 3) for k, v in result.items()}


def speculators_missing(python: str) -> str | None:
    """Why `python` cannot run speculators' trainer (None: it can)."""
    probe = subprocess.run(
        [python, str(Path(__file__).resolve()), "--speculators-probe"],
        capture_output=True,
        text=True,
        check=False,
        env=child_env(),
    )
    if probe.returncode != 0:
        return (
            f"speculators does not import under {python}: {probe.stderr.strip().splitlines()[-1:]}"
        )
    return None


def train_stage(name: str, work: Path, target: str, args: argparse.Namespace, results: dict):
    """Train one trainer into results[name] (its missing reason instead for speculators)."""
    if name == "speculators":
        results["speculators_skipped"] = speculators_missing(args.speculators_python)
        if results["speculators_skipped"]:
            print(f"speculators skipped: {results['speculators_skipped']}", flush=True)
            results["speculators"] = None
            return
    trained = (
        train_specdraft(work, args)
        if name == "specdraft"
        else train_speculators(work, target, args)
    )
    results[name] = {
        "draft": trained["draft"],
        "steps": trained["steps"],
        "train_tokens_per_s": round(trained["tokens_per_s"], 1),
        "peak_memory_mib": trained["peak_memory_mib"],
    }
    print(json.dumps({name: results[name]}), flush=True)


def run(args: argparse.Namespace, target: str, work: Path) -> dict:
    """The stages `args.stages` on `work`; the results so far (<work>/results.json)."""
    if args.device == "cpu":
        torch.set_num_threads(1)
    prepare(work, target, args)
    saved = work / "results.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    results.setdefault("speculators", None)
    results.setdefault("speculators_skipped", "not trained (stage speculators not run)")
    results.update(steps=args.steps, device=args.device)
    for name in ("specdraft", "speculators"):
        if name in args.stages:
            train_stage(name, work, target, args, results)
            saved.write_text(json.dumps(results))
    if "score" in args.stages:
        heldout = work / "prompts.jsonl" if args.device == "cuda" else ASSETS / "prompts.jsonl"
        prompts = heldout_prompts(heldout, target, args.heldout)
        for name in ("specdraft", "speculators"):
            if results.get(name):
                results[name].update(score(results[name]["draft"], target, prompts, args))
        saved.write_text(json.dumps(results))
    return results


def worker_main(argv: list[str]) -> bool:
    """Run the worker that argv names, if any (benchmarks/side_by_side_workers.py)."""
    import side_by_side_workers as workers  # benchmarks/, the script's directory

    if argv[:1] == ["--specdraft-worker"]:
        workers.specdraft_worker(argv[1], argv[2], argv[3], int(argv[4]))
    elif argv[:1] == ["--speculators-worker"]:
        workers.speculators_worker(argv[1], int(argv[2]), argv[argv.index("--") + 1 :])
    elif argv[:1] == ["--speculators-probe"]:
        workers.speculators_probe()
    else:
        return False
    return True


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--target", default=str(PYCODE))
    add("--work", type=Path, help="data and runs (the data is kept between runs)")
    add("--device", choices=sorted(DEFAULTS), default="cpu")
    add("--stages", default="all", help=f"comma-separated, of {', '.join(STAGES)}; or all")
    add("--speculators-python", default=sys.executable)
    add(
        "--speculators-extra",
        default="",
        help="more speculators CLI arguments, e.g. '--draft-attn-impl sdpa' (they win)",
    )
    add("--train-prompts", type=int, default=256, help="CPU mode's training windows")
    add("--new-tokens", type=int, help="continuation tokens scored (cpu: 64 = training's)")
    add("--heldout", type=int, default=32, help="held-out prompts scored")
    add("--steps", type=int, help="cpu: 64, cuda: 2000")
    for flag in ("--ttt-steps", "--warmup-steps", "--batch-size", "--draft-vocab-size"):
        add(flag, type=int, help="default: the mode's (see above)")
    add("--lr", type=float)
    add("--tokens-per-step", type=int, help="speculators' packed length (default: the mode's)")
    add("--skip-steps", type=int, help="first steps left out of tokens/s (cpu 1, cuda 10)")
    add("--train-ratio", type=float, default=0.95)
    add("--tiny", action="store_true", help="stories260K, 24 documents, 3 steps (CPU smoke run)")
    args = parser.parse_args()
    args.stages = set(STAGES) if args.stages == "all" else set(args.stages.split(","))
    if not args.stages <= set(STAGES):
        parser.error(f"--stages: {', '.join(sorted(args.stages - set(STAGES)))} is no stage")
    if args.tiny and args.device != "cpu":
        parser.error("--tiny runs on the CPU: leave --device out")
    if not args.tiny and args.work is None:
        parser.error("--work is required (or --tiny)")
    defaults = dict(DEFAULTS[args.device])
    if args.device == "cuda":
        full = json.loads(FULL_CONFIG.read_text())
        defaults.update({k: full[k] for k in FULL_KEYS}, tokens_per_step=None)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main() -> None:
    if worker_main(sys.argv[1:]):
        return
    args = parse_args()
    if not args.tiny:
        if args.device == "cpu":
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
