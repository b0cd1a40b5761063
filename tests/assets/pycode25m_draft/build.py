"""Rebuild the pycode-25m test drafter (run by hand on a GPU machine; CI never trains it).

    python tests/assets/pycode25m_draft/build.py --target ../shared/models/pycode-25m \
        --work ../pycode-draft --device cuda

Steps, each a specdraft command recorded in `<work>/commands.txt`:
1. prompts: the first 64 tokens of windows of 320 characters starting at a random line of Python source files from
   this interpreter's site-packages (the corpus pycode-25m was trained on), files in a seeded
   order; the last `--test-prompts` files are held out and their windows written to
   `prompts.jsonl` next to this script (the vLLM tier's prompts);
2. `specdraft regenerate --no-chat`: the target's greedy continuations (what it serves at T = 0);
3. `specdraft capture --no-chat`: aux hidden states of the default layers;
4. `specdraft train` with `train_config.json` (drafter MLP 768 wide, draft vocabulary 1024, so
   that the bf16 checkpoint stays under 8 MB);
5. `specdraft export --engine vllm --dtype bf16` into this folder;
6. the exported JSON files made portable (`make_portable`): the target's directory becomes its
   folder's name (`pycode-25m`, found on a host as ../shared/models/pycode-25m), the work folder
   `$WORK`, paths inside this repository relative to its root. The committed files must not
   name the build machine's directories (tests/unit/assets/test_assets.py).

`--size full` trains the full-size drafter instead (`train_config_full.json`: draft vocabulary
4096, MLP 1408 wide as the target's, 4,000 steps; 12 MB in bf16, for GPU benchmarks such as
benchmarks/shell_target.py, not committed) and exports it to `--out` (default <work>/draft-full);
the held-out prompts then go to <work>/prompts.jsonl, leaving the committed ones as they are.
`--stop-after-regenerate` and `--regen FILE` split the build in two (for GPU calls of limited length).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shlex
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PORTABLE_FILES = ("specdraft_manifest.json", "config.json")
TRAIN_CONFIGS = {"small": HERE / "train_config.json", "full": HERE / "train_config_full.json"}
WINDOW_CHARS = 320
PROMPT_TOKENS = 64  # a prompt is the first 64 tokens of a window (about 200 characters)


def windows(files: list[Path], rng: random.Random) -> list[str]:
    """One prompt per file: WINDOW_CHARS characters from a random line start (files of 2 kB+)."""
    out = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 2048:
            continue
        starts = [0] + [i + 1 for i, c in enumerate(text[:-WINDOW_CHARS]) if c == "\n"]
        start = rng.choice(starts)
        out.append(text[start : start + WINDOW_CHARS])
    return out


def run(cmd: list[str], log: Path) -> None:
    line = shlex.join(cmd)
    print(f"$ {line}", flush=True)
    with log.open("a") as f:
        f.write(line + "\n")
    subprocess.run(cmd, check=True)


def portable(text: str, target: Path, work: Path) -> str:
    """`text` with the build machine's directories replaced: the target's by its folder's name,
    the work folder by $WORK, this repository's by paths relative to its root."""
    for path, name in (
        (target.resolve(), target.resolve().name),
        (work.resolve(), "$WORK"),
        (REPO, "."),
    ):

        def rename(
            match: re.Match, name: str = name
        ) -> str:  # "DIR/x" -> "name/x", "DIR" -> "name"
            return ("" if name == "." else name + "/") if match[1] else name

        text = re.sub(re.escape(str(path)) + r"(?:(/)|(?![\w./-]))", rename, text)
    return text


def make_portable(draft_dir: Path, target: Path, work: Path) -> None:
    """Rewrite every string in the drafter's JSON files with `portable` (same JSON layout as
    specdraft writes it: sorted keys, indent 2, no final newline)."""

    def walk(value):
        if isinstance(value, str):
            return portable(value, target, work)
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        return value

    for name in PORTABLE_FILES:
        file = draft_dir / name
        if file.exists():
            file.write_text(
                json.dumps(walk(json.loads(file.read_text())), indent=2, sort_keys=True)
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", required=True)
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--train-prompts", type=int, default=6000)
    parser.add_argument("--test-prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--train-steps", type=int, help="override train_config.json (smoke runs)")
    parser.add_argument(
        "--size",
        choices=sorted(TRAIN_CONFIGS),
        default="small",
        help="small: the committed CI drafter; full: the benchmark drafter (see above)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="export here (default: this folder's draft/ for small, <work>/draft-full for full)",
    )
    parser.add_argument(
        "--stop-after-regenerate",
        action="store_true",
        help="end after step 2 (a GPU call too short for the whole build)",
    )
    parser.add_argument(
        "--regen", type=Path, help="take step 2's output from this file instead of running it"
    )
    args = parser.parse_args()
    work: Path = args.work
    small = args.size == "small"
    out = args.out or (HERE / "draft" if small else work / "draft-full")
    work.mkdir(parents=True, exist_ok=True)
    log = work / "commands.txt"

    roots = sorted({sysconfig.get_paths()["purelib"], *site.getsitepackages()})
    files = sorted({f for root in roots for f in Path(root).rglob("*.py")})
    rng = random.Random(0)
    rng.shuffle(files)
    test = windows(files[-4 * args.test_prompts :], rng)[: args.test_prompts]
    train = windows(files[: -4 * args.test_prompts], rng)[: args.train_prompts]
    with (work / "train_prompts.jsonl").open("w") as f:
        f.writelines(json.dumps({"text": p}) + "\n" for p in train)
    with ((HERE if small else work) / "prompts.jsonl").open("w") as f:
        f.writelines(json.dumps({"text": p}) + "\n" for p in test)
    print(f"{len(train)} training prompts, {len(test)} held-out prompts", flush=True)

    cli = [sys.executable, "-m", "specdraft.cli"]
    regen = args.regen or work / "regen.jsonl"
    if not args.regen:
        run(
            cli
            + [
                "regenerate",
                str(work / "train_prompts.jsonl"),
                str(regen),
                "--target",
                args.target,
                "--no-chat",
                "--device",
                args.device,
                "--batch-size",
                "512",
                "--prompt-tokens",
                str(PROMPT_TOKENS),
                "--max-new-tokens",
                str(args.max_new_tokens),
            ],
            log,
        )
    if args.stop_after_regenerate:
        return
    run(
        cli
        + [
            "capture",
            args.target,
            str(regen),
            str(work / "store"),
            "--no-chat",
            "--skip-bad",
            "--device",
            args.device,
            "--max-length",
            "512",
        ],
        log,
    )
    precision = "bf16" if args.device.startswith("cuda") else "fp32"
    run(
        cli
        + [
            "train",
            str(work / "store"),
            str(work / "run"),
            "--config",
            str(TRAIN_CONFIGS[args.size]),
            "--precision",
            precision,
            *(["--steps", str(args.train_steps)] if args.train_steps else []),
        ],
        log,
    )
    run(
        cli
        + [
            "export",
            str(work / "run" / "draft"),
            str(out),
            "--engine",
            "vllm",
            "--target",
            args.target,
            "--dtype",
            "bf16",
        ],
        log,
    )
    make_portable(out, Path(args.target), work)


if __name__ == "__main__":
    main()
