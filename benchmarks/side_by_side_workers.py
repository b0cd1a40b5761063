"""The two trainers of benchmarks/side_by_side.py, each run in a process of its own (its peak GPU
memory is its own: `torch.cuda.max_memory_allocated`) by `python benchmarks/side_by_side.py
--specdraft-worker ...` or `--speculators-worker ...`; each prints one JSON line: its drafter
directory, steps, train tokens/s and peak memory (MiB; None on the CPU).

Train tokens/s, the same for both: the steps' end times (specdraft: `train`'s on_step; speculators
0.9.0: after `Trainer._schedulers_step`, speculators/train/trainer.py:568) and each step's training
tokens (specdraft: batch size x the store's mean sample length; speculators: the non-pad positions
of the packed batch, `document_ids != -1`, as its own step timer counts them, trainer.py:574); the
rate is over the steps after the first `skip` (cpu 1, cuda 10), each from the previous step's end
to its own, those two ends in one epoch, the last step left out. So each trainer's data loading
counts, its validation and checkpoints (at epoch ends, after the last step) do not, and the
measurement adds no GPU synchronisation (speculators logs every 50th step: its step timer syncs the
GPU on logged steps, trainer.py:60; its default, every step, is for profiling).

speculators' trainer (its CLI entry `speculators.train.cli.main`) gets these patches:
  - `openai` (imported by speculators/train/data.py:8 and data_generation/vllm_client.py:9-11,
    used only on its online path against a vLLM endpoint, `_setup_client`) is a stub package when
    not installed (benchmarks/openai_stub), whose clients and types raise when constructed: the run reads stored hidden
    states, and the real client (1.7 MB, 2 MB with jiter, distro and sniffio) does not fit the
    64 MiB carried to the GPU machine beside the target;
  - its --max-steps ends only the epoch it is reached in (trainer.py:519, 602): each later epoch
    would train one more step, so those epochs skip training (`Trainer.train_epoch`), and --epochs
    is the fewest that hold the steps (plus one);
  - on the CPU only: `trainer.get_local_rank` returns "cpu" (Trainer moves the model and each batch
    with `.to(self.local_rank)`, the integer 0 = the accelerator, trainer.py:225, 355, 530) and
    `torch.accelerator.synchronize` is a no-op (its step timer syncs and raises without an
    accelerator, trainer.py:80, 91).
Its vocabulary mapping comes from a token_freq.pt written by its own
`save_token_frequency_distribution` (its data preparation skips it by default).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

OPENAI_STUB = Path(__file__).resolve().parent / "openai_stub"


def tokens_per_s(ends: list[float], tokens: list[float], epochs: list[int], skip: int) -> float:
    """Tokens per second of steps i, skip <= i < len(ends) - 1 (i >= 1), over their intervals
    ends[i - 1] -> ends[i], those whose two ends share an epoch. ends[i]: perf_counter seconds
    after step i (0-based); tokens[i]: its training tokens; epochs[i]: its epoch."""
    kept = [i for i in range(max(skip, 1), len(ends) - 1) if epochs[i] == epochs[i - 1]]
    if not kept:
        raise ValueError(f"{len(ends)} steps leave no interval after the first {skip}")
    return sum(tokens[i] for i in kept) / sum(ends[i] - ends[i - 1] for i in kept)


def peak_memory_mib(device: str) -> float | None:
    """This process's peak allocated GPU memory (MiB), None on the CPU."""
    if device != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated() / 2**20, 1)


def specdraft_worker(config_json: str, store: str, out: str, skip: int) -> None:
    """specdraft's `train` (what `specdraft train` runs) with the TrainConfig dict `config_json`."""
    from specdraft.capture.store import CaptureStore
    from specdraft.train.config import TrainConfig
    from specdraft.train.loop import train

    config = TrainConfig.from_dict(json.loads(config_json))
    if config.device == "cpu":
        torch.set_num_threads(1)
    meta = CaptureStore(store).meta
    per_step = config.batch_size * meta["num_tokens"] / meta["num_samples"]
    ends: list[float] = []
    train(config, store, out, progress=False, on_step=lambda step: ends.append(time.perf_counter()))
    row = {
        "draft": str(Path(out) / "draft"),
        "steps": len(ends),
        "tokens_per_s": tokens_per_s(ends, [per_step] * len(ends), [0] * len(ends), skip),
        "peak_memory_mib": peak_memory_mib(config.device),
    }
    print(json.dumps(row))


def stub_openai() -> None:
    """Where openai is not installed, put benchmarks/openai_stub (a stand-in package: the module
    docstring says why) first on sys.path and PYTHONPATH: speculators' data-loader workers are
    processes of their own and import its data module again."""
    if importlib.util.find_spec("openai") is not None:
        return
    sys.path.insert(0, str(OPENAI_STUB))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(OPENAI_STUB), os.environ.get("PYTHONPATH")])
    )


def patch_trainer(trainer_module, device: str, record: dict) -> None:
    """The patches of the module docstring, and the step record: record["ends"], ["tokens"] and
    ["epochs"] get one entry per training step."""
    from speculators.train.recovery import BatchRecoveryCoordinator

    def train_epoch(self, epoch: int, **kwargs) -> None:
        record["epoch"] = epoch
        if self.global_step < self.config.max_steps:
            one_epoch(self, epoch, **kwargs)

    def schedulers_step(self) -> None:
        schedulers(self)
        record["ends"].append(time.perf_counter())
        record["epochs"].append(record["epoch"])

    def consume(self, batch: dict, **kwargs) -> None:
        if self.phase == "training":
            record["tokens"].append(float((batch["document_ids"] != -1).sum()))
        return consumed(self, batch, **kwargs)

    one_epoch, schedulers = (
        trainer_module.Trainer.train_epoch,
        trainer_module.Trainer._schedulers_step,
    )
    consumed = BatchRecoveryCoordinator.consume
    trainer_module.Trainer.train_epoch = train_epoch
    trainer_module.Trainer._schedulers_step = schedulers_step
    BatchRecoveryCoordinator.consume = consume
    if device == "cpu":
        trainer_module.get_local_rank = lambda: "cpu"
        torch.accelerator.synchronize = lambda device=None: None
        torch.set_num_threads(1)


def speculators_worker(device: str, skip: int, argv: list[str]) -> None:
    """speculators' trainer with the CLI arguments `argv`; its drafter is the last epoch's
    checkpoint (a directory named by its number under --save-path)."""
    stub_openai()
    import speculators.train.trainer as trainer_module
    from datasets import load_from_disk
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    record: dict = {"ends": [], "tokens": [], "epochs": [], "epoch": 0}
    patch_trainer(trainer_module, device, record)
    value = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    data = Path(value["--data-path"])
    rows = load_from_disk(str(data)).with_format("torch")
    save_token_frequency_distribution(rows, data / "token_freq.pt")
    train_tokens = float(sum(rows["seq_len"])) * float(value["--train-data-ratio"])
    epochs = math.ceil(int(value["--max-steps"]) * int(value["--total-seq-len"]) / train_tokens) + 1
    sys.argv = [sys.argv[0], *argv, "--epochs", str(epochs)]
    main(TrainConfig.resolve())
    save = Path(value["--save-path"])
    last = max((p for p in save.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    row = {
        "draft": str(last),
        "steps": len(record["ends"]),
        "tokens_per_s": tokens_per_s(record["ends"], record["tokens"], record["epochs"], skip),
        "peak_memory_mib": peak_memory_mib(device),
    }
    print(json.dumps(row))


def speculators_probe() -> None:
    """Exit non-zero when speculators' trainer does not import here (openai stubbed as above)."""
    stub_openai()
    import speculators.train.cli  # noqa: F401
