"""`specdraft demo`: the whole pipeline on one target, each stage cached under --out.

Stages, in the order they run and print: convert target -> split prompts (train / held-out) ->
regenerate continuations with the target -> capture -> train the drafter -> speculative
generation on held-out prompts against plain decoding on the same engine (each setting timed
over a few rounds in turns with plain decoding; a setting is recommended only when it beats
plain decoding beyond the noise) -> export (vLLM, SGLang, speculators layouts, with the setting
generation picked) -> doctor -> report.md and plots.

Inputs (device, target directory, data) are checked before any stage runs (`check_inputs`).

The default target is the bundled stories260K (5 layers, so aux layers [2, 3, 4]: the standard
[2, L//2, L-3] collapses below 7 layers, DESIGN.md §2). A stage whose output exists is not
redone (one line says it was reused, `say_reused`), so a re-run resumes where the last one
stopped, but only when the settings that shaped it are the ones asked for now:
out/demo_settings.json records each cached stage's settings (paths relative to --out, the data
by its content hash, so a copied demo directory resumes too), and a stage whose settings changed
is redone with every stage after it (`stages_to_redo`). The timing of the settings is cached too
(out/generation.json, keyed by the drafter's files, the prompts and the timing settings:
`stage_generation`), so a re-run keeps the recommendation and the exports it measured instead of
a new pick from another noisy measurement; export, doctor and the report are redone every run.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from specdraft.bench.speedup import pick_setting, speedup_text, ties_at_top, timed_passes, timing_summary
from specdraft.checkpoint import file_sha256
from specdraft.conventions import default_aux_layers


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run.

    target: a transformers model directory, or None for the bundled stories260K.
    data: documents separated by blank lines (default: the bundled TinyStories sample).
    prompt_tokens: prompt length cut from each document; max_new_tokens: continuation length
    (regeneration and the generation benchmark). num_train / num_heldout: documents used.
    train_steps, batch_size, lr: drafter training. sweep_steps: chain depths measured.
    timing_repeats: rounds in which every setting and plain decoding are each timed once;
    min_speedup: the median speedup over plain decoding a recommended setting needs (it must
    also be faster in three rounds of four: lower quartile > 1x; else the report recommends none).
    """

    out: Path = Path("specdraft-demo")
    target: Path | None = None
    data: Path | None = None
    device: str = "cpu"
    prompt_tokens: int = 8
    max_new_tokens: int = 96
    num_train: int = 800
    num_heldout: int = 16
    train_steps: int = 1000
    batch_size: int = 8
    lr: float = 3e-3
    ttt_steps: int = 4
    seed: int = 0
    sweep_steps: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    tree: tuple[int, int, int] = (4, 2, 8)  # num_steps, topk, num_draft_tokens
    threads: int | None = 1  # CPU threads; one is fastest for a 260K-parameter model
    timing_repeats: int = 5  # timed passes per setting, taking turns with plain decoding
    min_speedup: float = 1.05  # median speedup a recommended setting must reach (lower quartile > 1x)

    def __post_init__(self) -> None:
        if self.num_train < 2:  # one for training, one for validation (the batch adapts: train_batch_size)
            raise ValueError(f"--num-train {self.num_train}: the demo needs at least 2 training documents")
        if self.num_heldout < 1:
            raise ValueError(f"num_heldout {self.num_heldout}: the demo needs at least 1 held-out document")
        if self.train_steps < 1:
            raise ValueError(f"--train-steps {self.train_steps}: must be at least 1 (the default is 1000)")
        for name in ("prompt_tokens", "max_new_tokens", "batch_size", "ttt_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)}: must be at least 1")
        if not self.sweep_steps or min(self.sweep_steps) < 1:
            raise ValueError(f"sweep_steps {self.sweep_steps}: need at least one chain depth, each >= 1")
        if self.timing_repeats < 1:
            raise ValueError(f"timing_repeats {self.timing_repeats}: must be at least 1")


@dataclass
class DemoReport:
    """What the demo measured; written as report.json and report.md under out."""

    target: str
    aux_layers: list[int]
    training: dict[str, Any] = field(default_factory=dict)
    doctor: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    tree: dict[str, Any] = field(default_factory=dict)
    chosen: dict[str, Any] = field(default_factory=dict)  # empty: no setting beat plain decoding beyond noise
    verdict: str = ""
    launch_commands: dict[str, str] = field(default_factory=dict)
    lint: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    drafter: dict[str, Any] = field(default_factory=dict)  # dir, steps, batch_size, num_train of the drafter used


DATA_FORMATS = ("plain text with documents separated by blank lines, or JSONL with a string "
                '"text" field per line')


def parse_documents(text: str, name: str = "the data") -> list[str]:
    """The documents of `text`: JSONL records' "text" fields when its first non-blank line is a
    JSON object, else blank-line separated plain text. Blank lines inside a JSONL text are dropped
    (the demo's own files separate documents by blank lines). ValueError names a bad line."""
    lines = text.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first.startswith("{"):
        return [d.strip() for d in text.split("\n\n") if d.strip()]
    docs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} line {number} is not JSON ({e.msg}); the demo reads {DATA_FORMATS}") from e
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"{name} line {number} has no string \"text\" field (chat \"messages\" records are "
                             f"not supported here); the demo reads {DATA_FORMATS}")
        doc = "\n".join(part for part in record["text"].splitlines() if part.strip()).strip()
        if doc:
            docs.append(doc)
    return docs


def split_documents(text: str, num_train: int, num_heldout: int, seed: int) -> tuple[list[str], list[str]]:
    """Documents (see parse_documents), shuffled with `seed`, as (train, held-out) lists.

    Raises ValueError when the text holds fewer than num_train + num_heldout documents.
    """
    docs = parse_documents(text)
    if len(docs) < num_train + num_heldout:
        raise ValueError(f"the data holds {len(docs)} documents; the demo needs "
                         f"{num_train + num_heldout} (lower --num-train)")
    random.Random(seed).shuffle(docs)
    return docs[num_heldout:num_heldout + num_train], docs[:num_heldout]


def data_source(cfg: DemoConfig) -> Path:
    """--data, or the bundled TinyStories sample."""
    from specdraft.stories260k import bundled_dir

    return Path(cfg.data) if cfg.data else bundled_dir() / "tinystories_sample.txt"


def check_inputs(cfg: DemoConfig) -> None:
    """Refuse, before any work, what a later stage would fail on: --out, the device, the target
    directory and the data. ValueError naming the flag and the fix."""
    check_out(Path(cfg.out))
    check_device(cfg.device)
    if cfg.target is not None:
        check_target(Path(cfg.target))
    check_data(cfg)


def check_out(out: Path) -> None:
    """--out must be a directory or creatable as one: its nearest existing part must be a directory."""
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        where = "" if existing == out else f": {existing} is a file"
        raise ValueError(f"--out {out}{where or ' is a file'}; pass a directory (created if missing)")


def check_device(device: str) -> None:
    """cpu, or a cuda device this torch build sees (capture, training and the engine support no other)."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"--device {device!r} is not a torch device; use cpu or cuda[:N]") from e
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: the demo runs on cpu or cuda[:N] only; use --device cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch build ({torch.__version__}) sees no CUDA GPU; "
                         "use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                         "use cuda:0")


def check_target(path: Path) -> None:
    """A transformers causal LM directory with a tokenizer and >= 4 decoder layers, not a drafter."""
    from specdraft.conventions import ConventionError

    hint = "pass a transformers model directory, or leave --target out for the bundled stories260K"
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"--target {path}: no config.json here; {hint}")
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--target {path}: cannot read config.json ({e}); {hint}") from e
    architectures = " ".join(raw.get("architectures") or []) if isinstance(raw, dict) else ""
    if (not isinstance(raw, dict) or "eagle" in architectures.lower() or "speculator" in architectures.lower()
            or {"draft_vocab_size", "eagle_config", "speculators_config"} & set(raw)
            or (path / "specdraft_manifest.json").exists()):
        raise ValueError(f"--target {path} is an EAGLE-3 drafter, not a target model; pass the transformers "
                         "model it drafts for, or leave --target out for the bundled stories260K")
    from transformers import AutoConfig, AutoTokenizer

    try:
        num_layers = AutoConfig.from_pretrained(str(path)).get_text_config().num_hidden_layers
        default_aux_layers(num_layers)
    except (OSError, ValueError, KeyError, AttributeError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        what = "too few layers" if isinstance(e, ConventionError) else "unreadable config"
        raise ValueError(f"--target {path}: {what} ({detail}); {hint}") from e
    try:
        AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"--target {path}: no usable tokenizer ({str(e).splitlines()[0] if str(e) else e!r}); "
                         "the demo tokenizes prompts with the target's own tokenizer") from e


def check_data(cfg: DemoConfig) -> None:
    """The data file exists, parses, and holds num_train + num_heldout documents."""
    source = data_source(cfg)
    if not source.is_file():
        raise ValueError(f"--data {source}: no such file; pass {DATA_FORMATS}")
    try:
        text = source.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--data {source}: cannot read it as UTF-8 text ({e})") from e
    docs = parse_documents(text, name=f"--data {source}")
    need = cfg.num_train + cfg.num_heldout
    if len(docs) < need:
        most = len(docs) - cfg.num_heldout
        if len(docs) <= 1 or source.suffix in (".jsonl", ".json") and not text.lstrip().startswith("{"):
            fix = f"pass {DATA_FORMATS}"
        elif most >= 2:
            fix = f"lower --num-train to at most {most}, or pass more documents"
        else:
            fix = f"pass at least {2 + cfg.num_heldout} documents"
        raise ValueError(f"--data {source} holds {len(docs)} document(s); the demo needs {need} "
                         f"(--num-train {cfg.num_train} + {cfg.num_heldout} held out): {fix}")


def stage_target(cfg: DemoConfig) -> Path:
    """The target directory: the given one, or stories260K converted under out/target."""
    if cfg.target is not None:
        return Path(cfg.target)
    from specdraft.stories260k import convert_stories260k

    return convert_stories260k(cfg.out / "target")


SETTINGS_FILE = "demo_settings.json"
STAGES = ("data", "regenerate", "train")  # in order: redoing one redoes every later one
VAL_FRACTION = 0.05  # of the training documents, held out for training's validation


def path_label(path: Path, out: Path) -> str:
    """`path` relative to --out ("--out/target") when inside it, else absolute: a copied demo
    directory records the same labels."""
    path = Path(path).resolve()
    try:
        return "--out/" + path.relative_to(Path(out).resolve()).as_posix()
    except ValueError:
        return str(path)


def stage_settings(cfg: DemoConfig) -> dict[str, dict[str, Any]]:
    """The settings that shape each cached stage's output (the data by its content, not its path).
    Later stages (generation, export, doctor, the report) are redone on every run."""
    return {
        "data": {"data_sha256": file_sha256(data_source(cfg)), "num_train": cfg.num_train,
                 "num_heldout": cfg.num_heldout, "seed": cfg.seed},
        "regenerate": {"target": "bundled stories260K" if cfg.target is None else path_label(cfg.target, cfg.out),
                       "prompt_tokens": cfg.prompt_tokens, "max_new_tokens": cfg.max_new_tokens},
        "train": {"train_steps": cfg.train_steps, "batch_size": cfg.batch_size, "lr": cfg.lr,
                  "ttt_steps": cfg.ttt_steps, "seed": cfg.seed},
    }


FLAG_NAMES = {"num_train": "--num-train", "train_steps": "--train-steps", "target": "--target",
              "data_sha256": "--data (its content)"}


def stages_to_redo(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> tuple[str | None, list[str]]:
    """The first stage whose recorded settings (`old`) differ from the requested ones (`new`),
    or None, and the differences as "--train-steps 1000 -> 200"."""
    for stage in STAGES:
        before, now = old.get(stage) or {}, new[stage]
        diffs = [f"{FLAG_NAMES.get(k, k)} {before.get(k, '?') if k != 'data_sha256' else 'changed'}"
                 + ("" if k == "data_sha256" else f" -> {now.get(k)}")
                 for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
        if diffs:
            return stage, diffs
    return None, []


def stage_outputs(out: Path, stage: str) -> list[Path]:
    """What `stage` and every later cached stage wrote under out (the converted target is kept)."""
    later = STAGES[STAGES.index(stage):]
    paths = []
    if "data" in later:
        paths.append(out / "data")
    if "regenerate" in later:
        paths += sorted((out / "data").glob("*.regen.jsonl*")) + [out / "store", out / "store-heldout"]
    if "train" in later:
        paths += [out / "train", out / "export"]
    return [p for p in paths if p.exists()]


def reconcile_cache(cfg: DemoConfig, say: Any) -> None:
    """Drop the cached stages made with other settings than cfg's (and every later stage), saying
    which settings changed, then record cfg's settings in out/demo_settings.json."""
    new = stage_settings(cfg)
    record = cfg.out / SETTINGS_FILE
    stage, diffs = None, []
    if record.exists():
        try:
            old = json.loads(record.read_text()).get("stages") or {}
        except (OSError, json.JSONDecodeError, AttributeError):
            old = {}
        stage, diffs = stages_to_redo(old, new)
    elif (cfg.out / "data" / "train.txt").exists() and (cfg.out / "data" / "heldout.txt").exists():
        stage, diffs = "data", [f"no {SETTINGS_FILE} records the settings they were made with"]
    if stage is not None:
        say(f"cached results under {cfg.out} were made with other settings ({'; '.join(diffs)}): "
            f"redoing the {stage} stage and every later one")
        for path in stage_outputs(cfg.out, stage):  # data/ holds the regenerated files: gone with it
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    cfg.out.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps({"stages": new}, indent=1, sort_keys=True) + "\n")
    tmp.replace(record)


def train_batch_size(num_samples: int, batch_size: int) -> int:
    """The demo's batch: `batch_size`, lowered to the training split of `num_samples` (the
    validation share, VAL_FRACTION rounded up, held out) when that split holds fewer."""
    return max(1, min(batch_size, num_samples - math.ceil(VAL_FRACTION * num_samples)))


def repoint_regen_settings(out_file: Path, data_file: Path, target_dir: Path) -> None:
    """Point the regenerate sidecar of `out_file` at this run's paths (input file, local target).

    The demo's own record (`reconcile_cache`) has checked what shapes the output (data content,
    target, lengths); the sidecar's absolute paths change only when the demo directory moved.
    """
    from specdraft.regenerate import settings_path

    sidecar = settings_path(out_file)
    if not (sidecar.exists() and out_file.exists()):
        return
    settings = json.loads(sidecar.read_text())
    fixed = {**settings, "input": str(Path(data_file).resolve())}
    if isinstance(settings.get("backend"), dict) and settings["backend"].get("kind") == "local":
        fixed["backend"] = {**settings["backend"], "model": str(target_dir)}
    if fixed != settings:
        tmp = sidecar.with_name(sidecar.name + ".tmp")
        tmp.write_text(json.dumps(fixed, indent=1, sort_keys=True) + "\n")
        tmp.replace(sidecar)


def say_reused(say: Callable[[str], None], stage: str, path: Path) -> None:
    """One line for a cached stage that is not redone (no progress bar: nothing is left to do)."""
    say(f"{stage}: reused from {path} (settings unchanged)")


def stage_data(cfg: DemoConfig, say: Callable[[str], None] = print) -> tuple[Path, Path]:
    """Write train.txt and heldout.txt (blank-line separated documents) under out/data."""
    data_dir = cfg.out / "data"
    train_file, heldout_file = data_dir / "train.txt", data_dir / "heldout.txt"
    if train_file.exists() and heldout_file.exists():
        say_reused(say, "data", data_dir)
        return train_file, heldout_file
    train, heldout = split_documents(data_source(cfg).read_text(), cfg.num_train, cfg.num_heldout, cfg.seed)
    data_dir.mkdir(parents=True, exist_ok=True)
    for path, docs in ((heldout_file, heldout), (train_file, train)):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n\n".join(docs) + "\n")
        tmp.replace(path)
    return train_file, heldout_file


def regen_complete(out_file: Path, data_file: Path) -> bool:
    """Every record of `data_file` has its regenerated line in `out_file`."""
    from specdraft.data import read_records
    from specdraft.regenerate import finished_indices

    num_records = len(read_records(data_file, chat=False, require_assistant=False).records)
    return finished_indices(out_file) >= set(range(num_records))


def stage_regenerate(cfg: DemoConfig, target_dir: Path, data_file: Path,
                     say: Callable[[str], None] = print) -> Path:
    """Replace each document's continuation with the target's greedy output (resumable; a
    complete output is reused without loading the target)."""
    from specdraft.regenerate import RegenConfig, Sampling, regenerate_file

    out = data_file.with_name(data_file.stem + ".regen.jsonl")
    repoint_regen_settings(out, data_file, target_dir)
    if regen_complete(out, data_file):
        say_reused(say, "regenerate", out)
        return out
    say(f"regenerate: continuations of {data_file.name} with the target (greedy)")
    regenerate_file(RegenConfig(data=str(data_file), out=str(out), target=str(target_dir), chat=False,
                                prompt_tokens=cfg.prompt_tokens, batch_size=32, device=cfg.device,
                                sampling=Sampling(temperature=0.0, max_new_tokens=cfg.max_new_tokens)),
                    console=Console(stderr=True))
    return out


def store_complete(store: Path) -> bool:
    """A capture store `CaptureStore` opens (a finished index) with every shard file present."""
    from specdraft.capture import CaptureError, CaptureStore

    try:
        shards = CaptureStore(store).meta["shards"]
    except CaptureError:
        return False
    return all((store / e["file"]).is_file() for e in shards)


def stage_capture(cfg: DemoConfig, target_dir: Path, regen_file: Path, name: str,
                  aux_layers: list[int], say: Callable[[str], None] = print) -> Path:
    """Capture the target's aux states over the regenerated data into out/<name> (resumable; a
    finished store is reused without loading the target)."""
    from specdraft.capture import CaptureConfig, capture_dataset

    store = cfg.out / name
    if store_complete(store):
        say_reused(say, "capture", store)
        return store
    capture_dataset(CaptureConfig(target=str(target_dir), data=str(regen_file), out_dir=str(store),
                                  aux_layers=tuple(aux_layers), dtype="float32", chat=False,
                                  max_length=cfg.prompt_tokens + cfg.max_new_tokens + 16,
                                  device=cfg.device),
                    console=Console(stderr=True))
    return store


def stage_train(cfg: DemoConfig, store: Path, target_dir: Path | None = None,
                say: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]]:
    """Train the drafter on the store (resumes from out/train's last checkpoint). The batch is
    cfg.batch_size, lowered to the training split when that is smaller (`train_batch_size`);
    the returned training record holds its "steps" and "config"."""
    from specdraft.train.loop import TrainConfig, train

    out = cfg.out / "train"
    draft_dir = out / "draft"
    if (draft_dir / "specdraft_manifest.json").exists():
        manifest = json.loads((draft_dir / "specdraft_manifest.json").read_text())
        say_reused(say, "train", draft_dir)
        return draft_dir, manifest["training"]
    say("train: training the drafter")
    index = store / "index.json"
    num_samples = json.loads(index.read_text())["num_samples"] if index.exists() else cfg.num_train
    batch_size = train_batch_size(num_samples, cfg.batch_size)
    if batch_size < cfg.batch_size:
        Console(stderr=True).print(f"demo: batch size {batch_size} (not {cfg.batch_size}): the training split "
                                   f"holds {num_samples - math.ceil(VAL_FRACTION * num_samples)} of "
                                   f"{num_samples} samples; raise --num-train for full batches", markup=False)
    config = TrainConfig(lr=cfg.lr, warmup_steps=50, total_steps=cfg.train_steps, batch_size=batch_size,
                         max_length=cfg.prompt_tokens + cfg.max_new_tokens + 16, ttt_steps=cfg.ttt_steps,
                         val_fraction=VAL_FRACTION, seed=cfg.seed, eval_every=max(cfg.train_steps // 4, 1),
                         save_every=max(cfg.train_steps // 4, 1), device=cfg.device)
    result = train(config, store, out, resume=True, command="specdraft demo", target_config=target_dir)
    manifest = json.loads((result.draft_dir / "specdraft_manifest.json").read_text())
    return draft_dir, manifest["training"]  # under --out as given, as a cached run says (not train's resolved path)


def heldout_prompts(target_dir: Path, heldout_file: Path, prompt_tokens: int) -> list[list[int]]:
    """Token ids of the first `prompt_tokens` tokens of each held-out document."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    docs = [d for d in heldout_file.read_text().split("\n\n") if d.strip()]
    return [tokenizer(d)["input_ids"][:prompt_tokens] for d in docs]


def load_demo_engine(target_dir: Path, draft_dir: Path | None, spec, prompts: list[list[int]],
                     max_new_tokens: int, device: str):
    """specdraft's engine for one setting (spec None: plain decoding), warmed up."""
    from specdraft.engine.speculate import load_engine

    engine = load_engine(target_dir, draft_dir, spec, device=device,
                         max_seq_len=max(len(p) for p in prompts) + max_new_tokens + 64)
    engine.generate(prompts[0], 8)  # warm-up, not counted
    return engine


def generation_pass(engine, prompts: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
    """Greedy generation over `prompts`: merged metrics, outputs, and output tokens / wall time."""
    import time

    merged, outputs, start = None, [], time.perf_counter()
    for prompt in prompts:
        result = engine.generate(prompt, max_new_tokens)
        outputs.append(result.token_ids)
        merged = result.metrics if merged is None else merged.merge(result.metrics)
    seconds = time.perf_counter() - start
    return {"metrics": merged.to_dict(), "tokens_per_s": merged.num_output_tokens / seconds, "outputs": outputs,
            "accept_length": merged.accept_length, "acceptance": merged.acceptance_per_position}


def setting_text(r: dict[str, Any]) -> str:
    """"num_steps 3, topk 1, num_draft_tokens 4"."""
    return f"num_steps {r['num_steps']}, topk {r['topk']}, num_draft_tokens {r['num_draft_tokens']}"


LOW_TAU = 1.2  # a best accept length below this: the drafter barely accepts (tau 1.00: nothing accepted)


def verdict_text(rows: list[dict[str, Any]], chosen: dict[str, Any] | None, repeats: int,
                 min_speedup: float, train_steps: int | None = None, num_train: int | None = None) -> str:
    """One paragraph: the recommended setting and why, or why none is recommended (a drafter that
    barely accepts, best tau below LOW_TAU, is named as the cause rather than a busy machine;
    train_steps / num_train, when given, are quoted in its fix)."""
    rule = (f"a median speedup of at least {min_speedup:.2f}x and a lower quartile above 1x over {repeats} "
            "rounds, each setting timed once per round in turns with plain decoding")
    if chosen is not None:
        ties = [r for r in ties_at_top(rows, min_speedup) if r is not chosen]
        tie_note = (f" Within the noise of it: {'; '.join(setting_text(r) + ' ' + speedup_text(r) for r in ties)}"
                    "; the pick is the one verifying the fewest tokens per step." if ties else "")
        return (f"Recommended setting: {setting_text(chosen)}: tau {chosen['accept_length']:.2f}, median "
                f"{chosen['tokens_per_s']:.0f} tokens/s, speedup {speedup_text(chosen)} over the same engine "
                f"without speculation (rule: {rule}).{tie_note}")
    best = max(rows, key=lambda r: r["speedup"])
    top_tau = max(r["accept_length"] for r in rows)
    if top_tau < LOW_TAU:
        now = [f"now --train-steps {train_steps}" if train_steps else "", f"--num-train {num_train}" if num_train else ""]
        now_text = f" ({', '.join(n for n in now if n)})" if any(now) else ""
        return (f"No setting is recommended: the drafter barely accepts any draft token (best tau {top_tau:.2f}; "
                f"tau 1.00 means none accepted), so speculation only adds work over plain decoding; the best, "
                f"{setting_text(best)}, measured {speedup_text(best)}. Train the drafter longer (--train-steps) "
                f"or on more data (--num-train){now_text}, then re-run the demo.")
    return (f"No setting is recommended: none was faster than plain decoding beyond the noise on this machine "
            f"(rule: {rule}); the best, {setting_text(best)}, measured {speedup_text(best)}. The machine may be "
            "busy: re-run the demo on an idle one, or measure on the serving machine with `specdraft bench`.")


def stage_export(cfg: DemoConfig, draft_dir: Path, target_dir: Path, chosen: dict[str, Any],
                 chain_steps: int) -> dict[str, Any]:
    """Export for vLLM, SGLang and speculators; returns engine -> ExportResult.

    SGLang gets the chosen setting; vLLM and speculators (chains only) the fastest chain.
    """
    from specdraft.export import export_draft

    results = {}
    for engine in ("vllm", "sglang", "speculators"):
        steps, topk, tokens = ((chosen["num_steps"], chosen["topk"], chosen["num_draft_tokens"])
                               if engine == "sglang" else (chain_steps, 1, chain_steps + 1))
        results[engine] = export_draft(draft_dir, cfg.out / "export" / engine, engine=engine,
                                       target=target_dir, num_steps=steps, topk=topk, num_draft_tokens=tokens)
    return results


def stage_doctor(draft_dir: Path, target_dir: Path, stores: dict[str, Path],
                 exports: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Doctor on the trained drafter (offline acceptance on each store) and lint per export."""
    from dataclasses import asdict as as_dict

    from specdraft.doctor.run import run_doctor

    findings = []
    for name, store in stores.items():
        report = run_doctor(draft_dir, target=target_dir, samples=store)
        findings += [{"samples": name, **as_dict(f)} for f in report.findings]
    lint = {}
    for engine in ("sglang", "vllm"):
        args = exports[engine].launch_command
        report = run_doctor(exports[engine].out_dir, target=target_dir, engine=engine, engine_args=args)
        lint[engine] = [as_dict(f) for f in report.findings]
    return findings, lint


def stage_generate(cfg: DemoConfig, target_dir: Path, draft_dir: Path,
                   prompts: list[list[int]]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Plain decoding, a chain sweep over num_steps and one tree, all greedy on the same engine,
    each timed in cfg.timing_repeats rounds that take turns with plain decoding (timing_summary).

    Every speculative output must equal plain decoding's (lossless at T = 0): ValueError if not.
    """
    from specdraft.engine.spec_config import SpecConfig

    steps, topk, tokens = cfg.tree
    settings = {"plain": (None, None), **{f"chain-{n}": (draft_dir, SpecConfig.chain(n)) for n in cfg.sweep_steps},
                "tree": (draft_dir, SpecConfig(steps, topk, tokens))}
    engines = {name: load_demo_engine(target_dir, draft, spec, prompts, cfg.max_new_tokens, cfg.device)
               for name, (draft, spec) in settings.items()}
    runs = timed_passes(engines, cfg.timing_repeats,
                        lambda name: generation_pass(engines[name], prompts, cfg.max_new_tokens))
    plain_outputs = runs["plain"][0]["outputs"]
    for name, setting_runs in runs.items():
        if any(run["outputs"] != plain_outputs for run in setting_runs):
            raise ValueError(f"speculative output differs from plain greedy decoding at {name} "
                             f"({settings[name][1]}): the engine is not lossless")
    plain_tps = [run["tokens_per_s"] for run in runs["plain"]]

    def row(name: str, shape: dict[str, int]) -> dict[str, Any]:
        first = runs[name][0]
        return {**shape, "engine_metrics_first_round": first["metrics"],  # the engine's own counts and times
                **{k: first[k] for k in ("accept_length", "acceptance", "outputs")},
                **timing_summary([run["tokens_per_s"] for run in runs[name]], plain_tps)}

    baseline = row("plain", {})
    sweep = [row(f"chain-{n}", {"num_steps": n, "topk": 1, "num_draft_tokens": n + 1}) for n in cfg.sweep_steps]
    tree = row("tree", {"num_steps": steps, "topk": topk, "num_draft_tokens": tokens})
    return baseline, sweep, tree


GENERATION_FILE = "generation.json"


def dir_sha256(path: Path) -> str:
    """sha256 over the names and contents of the files in a directory (a drafter's weights and config)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode())
        digest.update(file_sha256(file).encode())
    return digest.hexdigest()


def stage_generation(cfg: DemoConfig, target_dir: Path, draft_dir: Path, prompts: list[list[int]],
                     say: Callable[[str], None]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """`stage_generate`, cached in out/generation.json: reused (one line says so) when the drafter's
    files, the prompts and the timing settings are the ones it was measured with, so a re-run
    recommends and exports what the first run measured; otherwise timed and written (a temp
    file, then renamed). A file that does not parse is timed again."""
    key = {"draft_sha256": dir_sha256(draft_dir), "target": path_label(target_dir, cfg.out),
           "prompts_sha256": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
           "max_new_tokens": cfg.max_new_tokens, "sweep_steps": list(cfg.sweep_steps), "tree": list(cfg.tree),
           "timing_repeats": cfg.timing_repeats, "device": cfg.device, "threads": cfg.threads}
    path = cfg.out / GENERATION_FILE
    try:
        saved = json.loads(path.read_text()) if path.exists() else None
    except (OSError, json.JSONDecodeError):
        saved = None
    if isinstance(saved, dict) and saved.get("settings") == key:
        say(f"generation: reused the timing in {path} (same drafter, prompts and settings; delete it to time "
            "the settings again)")
        return saved["baseline"], saved["sweep"], saved["tree"]
    baseline, sweep, tree = stage_generate(cfg, target_dir, draft_dir, prompts)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"settings": key, "baseline": baseline, "sweep": sweep, "tree": tree}))
    tmp.replace(path)
    return baseline, sweep, tree


def write_plots(report: DemoReport, out: Path) -> list[str]:
    """Per-position acceptance, and tau and tokens/s against num_steps, as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["num_steps"] for r in report.sweep]
    deepest = max(report.sweep, key=lambda r: r["num_steps"])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    positions = range(1, len(deepest["acceptance"]) + 1)
    ax.bar(positions, deepest["acceptance"], color="tab:blue")
    ax.set(xlabel="draft position k", ylabel="acceptance p_k", ylim=(0, 1),
           title=f"per-position acceptance (chain, num_steps={deepest['num_steps']})")
    fig.tight_layout()
    fig.savefig(out / "acceptance.png", dpi=120)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(steps, [r["accept_length"] for r in report.sweep], "o-")
    left.set(xlabel="num_steps (chain)", ylabel="accept length tau", title="tau vs num_steps")
    right.plot(steps, [r["tokens_per_s"] for r in report.sweep], "o-", label="speculative")
    right.axhline(report.baseline["tokens_per_s"], color="gray", ls="--", label="no speculation")
    right.set(xlabel="num_steps (chain)", ylabel="tokens/s", title="throughput vs num_steps")
    right.set_ylim(bottom=0)  # from zero: a cut axis would exaggerate the speedup
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)
    return ["acceptance.png", "throughput.png"]


def speculative_section(report: DemoReport) -> list[str]:
    """report.md's speculative-decoding section (markdown lines): how settings were timed, the
    plain baseline, one table row per setting (tau, tokens/s, speedup, p_k), the verdict."""
    base = report.baseline["tokens_per_s"]
    runs = report.baseline.get("tokens_per_s_runs", [base])
    lines = [
        "## Speculative decoding on held-out prompts (greedy, batch 1)", "",
        f"Each setting was timed in {len(runs)} rounds, taking turns with plain decoding; tokens/s is the "
        "median over rounds, speedup the median (and quartiles: the middle half of the rounds) of its tokens/s "
        "over plain decoding's in the same round.", "",
        f"No speculation: {base:.0f} tokens/s (rounds: {min(runs):.0f}-{max(runs):.0f}).", "",
    ]
    if max(runs) > 1.1 * min(runs):
        lines += [f"Warning: plain decoding itself varied {max(runs) / min(runs) - 1:.0%} between rounds: the "
                  "machine was busy, so these timings are noisy.", ""]
    lines += ["| num_steps | topk | num_draft_tokens | tau | tokens/s | speedup (quartiles) | acceptance p_k |",
              "|---|---|---|---|---|---|---|"]
    for r in [*report.sweep, report.tree]:
        lines.append(f"| {r['num_steps']} | {r['topk']} | {r['num_draft_tokens']} | {r['accept_length']:.2f} "
                     f"| {r['tokens_per_s']:.0f} | {speedup_text(r)} | "
                     + ", ".join(f"{p:.2f}" for p in r["acceptance"]) + " |")
    slower = [r for r in [*report.sweep, report.tree] if r["speedup"] < 1.0]
    if slower:
        lines += ["", "Slower than plain decoding (median speedup below 1x): "
                  + "; ".join(setting_text(r) for r in slower) + "."]
    return lines + ["", report.verdict, "",
                    "Every speculative run produced exactly the plain greedy output (lossless at T = 0)."]


def generation_line(report: DemoReport) -> str:
    """The generation stage in one line, printed when it ends (before export and doctor run):
    plain decoding's tokens/s, the fastest setting, the recommended one (the table: summary)."""
    best = max([*report.sweep, report.tree], key=lambda r: r["speedup"])
    pick = f"recommended: {setting_text(report.chosen)}" if report.chosen else "no setting recommended"
    return (f"speculative generation: plain decoding {report.baseline['tokens_per_s']:.0f} tokens/s; fastest "
            f"(highest median speedup over plain decoding in the same round) {setting_text(best)}, "
            f"tau {best['accept_length']:.2f}, {speedup_text(best)}; {pick}")


def doctor_line(report: DemoReport) -> str:
    """The doctor stage in one line: verdict counts over both sample sets, failed checks and
    lint failures by name (details: report.md)."""
    from specdraft.doctor.run import counts_text, verdict_counts

    failed = [f"{f['check']} ({f['samples']})" for f in report.doctor if f["verdict"] == "fail"]
    failed += [f"lint {engine}: {f['check']}" for engine, findings in report.lint.items()
               for f in findings if f["verdict"] == "fail"]
    return (f"doctor: {counts_text(verdict_counts(f['verdict'] for f in report.doctor))}"
            + (f"; failed: {', '.join(failed)}" if failed else "") + " (report.md has the evidence)")


def summary(report: DemoReport, out: Path) -> str:
    """What `specdraft demo` prints when it is done: the speculative-decoding section of
    report.md, then where the drafter, the report and the plots are."""
    return "\n".join([*speculative_section(report), "",
                      f"drafter: {report.drafter['dir']}", *generate_command(report),
                      f"report: {out / 'report.md'} (training, doctor, launch commands for vLLM / SGLang)",
                      "plots: " + ", ".join(str(out / p) for p in report.plots)])


def generate_command(report: DemoReport) -> list[str]:
    """"try: specdraft generate ..." and "serve: specdraft serve ..." (README's lines) with the
    recommended setting and one CPU thread (the demo's timing ran on one: a 260K-parameter
    model's threads only fight each other, 38 against 998 tokens/s on a busy 2-core machine), or
    the fastest one when none is recommended (generate's and serve's own default, 3 steps, is
    not what the demo measured best)."""
    rows = [*report.sweep, report.tree]
    setting = report.chosen or max(rows, key=lambda r: r["speedup"])
    why = "" if report.chosen else "  (the fastest setting here; none is recommended)"
    flags = (f"--target {report.target} --draft {report.drafter['dir']} --num-steps {setting['num_steps']} "
             f"--topk {setting['topk']} --num-draft-tokens {setting['num_draft_tokens']}")
    return [f"try: specdraft generate {flags} --threads 1 --prompt \"Once upon a time\"{why}",
            f"serve: specdraft serve {flags} --threads 1 --port 8000{why}"]


def report_markdown(report: DemoReport, cfg: DemoConfig) -> str:
    """report.md: what ran, tau, per-position acceptance, tokens/s, doctor verdicts, commands."""
    lines = [
        "# specdraft demo", "",
        f"Target: `{report.target}`; aux layers (specdraft indices) {report.aux_layers}.", "",
        "## Training", "",
        *([f"Drafter: {report.drafter['steps']} optimizer steps (batch {report.drafter.get('batch_size', '?')}) "
           f"on {report.drafter.get('num_train', '?')} training documents.", ""] if report.drafter else []),
        f"Validation (simulated tau {report.training.get('tau', float('nan')):.2f}; a "
        f"{len(report.training.get('accuracy', []))}-step chain replayed over the validation text: tau "
        f"{report.training.get('replayed_tau') or float('nan'):.2f}): per-step accuracy "
        + ", ".join(f"{a:.2f}" for a in report.training.get("accuracy", [])), "",
    ]
    lines += speculative_section(report)
    lines += ["", "## Doctor", "", "| samples | check | verdict | evidence |", "|---|---|---|---|"]
    for f in report.doctor:
        lines.append(f"| {f['samples']} | {f['check']} | {f['verdict']} | {f['evidence']} |")
    for engine, findings in report.lint.items():
        failed = [f["check"] for f in findings if f["verdict"] == "fail"]
        lines.append("")
        lines.append(f"Lint for {engine}: {'FAIL ' + ', '.join(failed) if failed else 'no failures'}.")
    lines += ["", "## Launch on a GPU machine", ""]
    if not report.chosen:
        lines += ["Not a recommendation (no setting beat plain decoding here): these commands use the setting "
                  "with the highest median speedup; check it on the GPU machine with `specdraft bench`.", ""]
    lines += [f"- {engine}: `{command}`" for engine, command in report.launch_commands.items()]
    lines += ["", *[f"![{p}]({p})" for p in report.plots], ""]
    return "\n".join(lines)


def run_demo(cfg: DemoConfig, console: Console | None = None) -> DemoReport:
    """Run every stage (cached under cfg.out) and write report.json, report.md and the plots."""
    import torch

    console = console or Console()
    check_inputs(cfg)
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.device == "cpu" and cfg.threads:
        torch.set_num_threads(cfg.threads)
    # one line each, whatever the terminal's width (not a terminal: rich wraps at 80 columns)
    say = lambda text: console.print(f"[bold]demo[/bold] {text}", soft_wrap=True)  # noqa: E731
    target_dir = stage_target(cfg)
    if cfg.target is None:
        say(f"convert: the bundled stories260K (llama2.c) -> transformers Llama at {target_dir}")
    from transformers import AutoConfig

    num_layers = AutoConfig.from_pretrained(str(target_dir)).get_text_config().num_hidden_layers
    aux_layers = list(default_aux_layers(num_layers))
    say(f"target {target_dir} ({num_layers} layers): aux layers {aux_layers} "
        + ("(the standard [2, L//2, L-3] collapses below 7 layers)" if num_layers < 7 else ""))
    reconcile_cache(cfg, say)
    train_file, heldout_file = stage_data(cfg, say)
    train_store = stage_capture(cfg, target_dir, stage_regenerate(cfg, target_dir, train_file, say), "store",
                                aux_layers, say)
    heldout_store = stage_capture(cfg, target_dir, stage_regenerate(cfg, target_dir, heldout_file, say),
                                  "store-heldout", aux_layers, say)
    draft_dir, training = stage_train(cfg, train_store, target_dir, say)
    report = DemoReport(target=str(target_dir), aux_layers=aux_layers, training=training.get("validation") or {},
                        drafter={"dir": str(draft_dir), "steps": training.get("steps"), "num_train": cfg.num_train,
                                 "batch_size": (training.get("config") or {}).get("batch_size")})
    say(f"drafter: {training.get('steps')} optimizer steps, at {draft_dir}")
    say("speculative generation vs plain decoding on held-out prompts")
    prompts = heldout_prompts(target_dir, heldout_file, cfg.prompt_tokens)
    report.baseline, report.sweep, report.tree = stage_generation(cfg, target_dir, draft_dir, prompts, say)
    rows = [*report.sweep, report.tree]
    chosen = pick_setting(rows, cfg.min_speedup)
    chain = chosen if chosen and chosen["topk"] == 1 else pick_setting(report.sweep, cfg.min_speedup)
    report.verdict = verdict_text(rows, chosen, cfg.timing_repeats, cfg.min_speedup, cfg.train_steps, cfg.num_train)
    report.chosen = {k: v for k, v in (chosen or {}).items() if k != "outputs"}
    say(generation_line(report))
    fastest = lambda runs: max(runs, key=lambda r: r["speedup"])  # noqa: E731
    exports = stage_export(cfg, draft_dir, target_dir, chosen or fastest(rows),
                           (chain or fastest(report.sweep))["num_steps"])
    say("export: " + ", ".join(f"{engine} -> {cfg.out / 'export' / engine} ({result.num_tensors} tensors bit-identical)"
                               for engine, result in exports.items()))
    report.launch_commands = {e: r.launch_command for e, r in exports.items()}
    say("doctor")
    report.doctor, report.lint = stage_doctor(draft_dir, target_dir,
                                              {"train": train_store, "held-out": heldout_store}, exports)
    say(doctor_line(report))
    report.plots = write_plots(report, cfg.out)
    (cfg.out / "report.json").write_text(json.dumps(asdict(report), indent=2, default=str))
    (cfg.out / "report.md").write_text(report_markdown(report, cfg))
    return report
