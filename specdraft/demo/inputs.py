"""The demo's inputs, refused before any stage runs (`check_inputs`, errors.UnusableInput): --out,
the device, the target directory and the data; and the data's documents, split into training and held-out ones."""

from __future__ import annotations

import json
import random
from pathlib import Path

from specdraft.conventions import default_aux_layers
from specdraft.data.records import json_line
from specdraft.demo.config import DemoConfig
from specdraft.errors import UnusableInput

DATA_FORMATS = (
    "plain text with documents separated by blank lines, or JSONL with a string "
    '"text" field per line'
)


def parse_documents(text: str, name: str = "the data") -> list[str]:
    """The documents of `text`: JSONL records' "text" fields when its first non-blank line is a
    JSON object, else blank-line separated plain text. Blank lines inside a JSONL text are dropped
    (the demo's own files separate documents by blank lines). UnusableInput names a bad line."""
    lines = text.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first.startswith("{"):
        return [d.strip() for d in text.split("\n\n") if d.strip()]
    docs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where, fix = f"{name} line {number}", f"the demo reads {DATA_FORMATS}"
        record = json_line(line, UnusableInput, where, fix)
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UnusableInput(
                f'{name} line {number} has no string "text" field (chat "messages" records '
                f"need --chat-template FILE); the demo reads {DATA_FORMATS}"
            )
        doc = "\n".join(part for part in record["text"].splitlines() if part.strip()).strip()
        if doc:
            docs.append(doc)
    return docs


def split_documents(
    text: str, num_train: int, num_heldout: int, seed: int, chats: bool = False
) -> tuple[list[str], list[str]]:
    """Documents (see parse_documents) or, with `chats`, the lines of a JSONL chats file (one
    chat each, checked by `check_chats`), shuffled with `seed`, as (train, held-out) lists.

    Raises UnusableInput (a ValueError) when the text holds fewer than num_train + num_heldout
    documents.
    """
    docs = [line for line in text.splitlines() if line.strip()] if chats else parse_documents(text)
    if len(docs) < num_train + num_heldout:
        raise UnusableInput(
            f"the data holds {len(docs)} {'chats' if chats else 'documents'}; the demo needs "
            f"{num_train + num_heldout} (lower --num-train)"
        )
    random.Random(seed).shuffle(docs)
    return docs[num_heldout : num_heldout + num_train], docs[:num_heldout]


def data_source(cfg: DemoConfig) -> Path:
    """--data, or the bundled TinyStories sample."""
    from specdraft.stories260k import bundled_dir

    return Path(cfg.data) if cfg.data else bundled_dir() / "tinystories_sample.txt"


def check_inputs(cfg: DemoConfig) -> None:
    """Refuse, before any work, what a later stage would fail on: --out, the device, the target
    directory and the data. UnusableInput (the CLI's exit 2) naming the flag and the fix."""
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
        raise UnusableInput(
            f"--out {out}{where or ' is a file'}; pass a directory (created if missing)"
        )


def check_device(device: str) -> None:
    """cpu, or a cuda device this torch build sees (capture, training and the engine support no other)."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise UnusableInput(
            f"--device {device!r} is not a torch device; use cpu or cuda[:N]"
        ) from e
    if dev.type not in ("cpu", "cuda"):
        raise UnusableInput(
            f"--device {device}: the demo runs on cpu or cuda[:N] only; use --device cpu"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UnusableInput(
            f"--device {device}: this torch build ({torch.__version__}) sees no CUDA GPU; "
            "use --device cpu"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UnusableInput(
            f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); "
            "use cuda:0"
        )


def check_target(path: Path) -> None:
    """A transformers causal LM directory with a tokenizer and >= 4 decoder layers, not a drafter."""
    from specdraft.conventions import ConventionError

    hint = "pass a transformers model directory, or leave --target out for the bundled stories260K"
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UnusableInput(f"--target {path}: no config.json here; {hint}")
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UnusableInput(f"--target {path}: cannot read config.json ({e}); {hint}") from e
    architectures = " ".join(raw.get("architectures") or []) if isinstance(raw, dict) else ""
    if (
        not isinstance(raw, dict)
        or "eagle" in architectures.lower()
        or "speculator" in architectures.lower()
        or {"draft_vocab_size", "eagle_config", "speculators_config"} & set(raw)
        or (path / "specdraft_manifest.json").exists()
    ):
        raise UnusableInput(
            f"--target {path} is an EAGLE-3 drafter, not a target model; pass the transformers "
            "model it drafts for, or leave --target out for the bundled stories260K"
        )
    from transformers import AutoConfig

    from specdraft.targets.tokenizer import load_target_tokenizer

    try:
        num_layers = AutoConfig.from_pretrained(str(path)).get_text_config().num_hidden_layers
        default_aux_layers(num_layers)
    except (OSError, ValueError, KeyError, AttributeError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        what = "too few layers" if isinstance(e, ConventionError) else "unreadable config"
        raise UnusableInput(f"--target {path}: {what} ({detail}); {hint}") from e
    load_target_tokenizer(
        path,
        "save the target's tokenizer into its directory: the demo tokenizes prompts with the "
        "target's own tokenizer",
    )


def check_data(cfg: DemoConfig) -> None:
    """The data file exists, parses, and holds num_train + num_heldout documents (chats, with
    --chat-template: `check_chats`)."""
    source = data_source(cfg)
    if not source.is_file():
        raise UnusableInput(f"--data {source}: no such file; pass {DATA_FORMATS}")
    if cfg.chat_template is not None:
        check_chats(cfg, source)
        return
    try:
        text = source.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UnusableInput(f"--data {source}: cannot read it as UTF-8 text ({e})") from e
    docs = parse_documents(text, name=f"--data {source}")
    need = cfg.num_train + cfg.num_heldout
    if len(docs) < need:
        if (
            len(docs) <= 1
            or source.suffix in (".jsonl", ".json")
            and not text.lstrip().startswith("{")
        ):
            fix = f"pass {DATA_FORMATS}"
        else:
            fix = more_data_fix(len(docs), cfg, "documents")
        raise UnusableInput(
            f"--data {source} holds {len(docs)} document(s); the demo needs {need} "
            f"(--num-train {cfg.num_train} + {cfg.num_heldout} held out): {fix}"
        )


def more_data_fix(count: int, cfg: DemoConfig, what: str) -> str:
    """The fix for a --data file of `count` documents or chats (`what`), fewer than --num-train +
    the held-out ones: a --num-train that fits, or, when none does (the held-out count is fixed;
    --num-train is at least 2), the count the file needs."""
    most = count - cfg.num_heldout
    if most >= 2:
        return f"lower --num-train to at most {most}, or pass more {what}"
    return (
        f"pass at least {2 + cfg.num_heldout} {what} (--num-train 2 + {cfg.num_heldout} held out)"
    )


def check_chats(cfg: DemoConfig, source: Path) -> None:
    """With --chat-template: the template file can be read, and --data holds num_train +
    num_heldout JSONL chats, each read as `data.records` reads one (no assistant turn needed:
    the target writes the answers). UnusableInput naming the file and the fix."""
    from specdraft.data.records import DataError, read_records
    from specdraft.data.template import read_chat_template

    try:
        read_chat_template(cfg.chat_template)
        num_chats = len(read_records(source, chat=True, require_assistant=False).records)
    except DataError as e:
        raise UnusableInput(str(e)) from None
    need = cfg.num_train + cfg.num_heldout
    if num_chats < need:
        raise UnusableInput(
            f"--data {source} holds {num_chats} chat(s); the demo needs {need} (--num-train "
            f"{cfg.num_train} + {cfg.num_heldout} held out): "
            + more_data_fix(num_chats, cfg, "chats")
        )
