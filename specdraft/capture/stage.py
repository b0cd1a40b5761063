"""The `specdraft capture` stage: load the target, its tokenizer and the data, then write the store."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from specdraft.capture.store import CaptureError, StoreSettings
from specdraft.capture.vllm import VllmOptions
from specdraft.capture.write import CaptureResult, check_store_dir, in_process, write_store
from specdraft.conventions import parse_dtype
from specdraft.data.render import Rendering
from specdraft.data.template import check_template_mode, use_chat_template

ENGINES = ("transformers", "vllm")  # what runs the target: `capture_dataset`


# What a tokenizer directory (--tokenizer, else the target's) that holds none names as the fix.
TOKENIZER_DIR_FIX = "pass --tokenizer DIR, the target's tokenizer"


@dataclass(frozen=True)
class CaptureConfig:
    """Inputs of `specdraft capture`.

    target: transformers model directory (its tokenizer too unless `tokenizer` is given).
    data: JSONL / save_to_disk dir / text file (see specdraft.data.records). aux_layers: specdraft indices
    (None = conventions.default_aux_layers). dtype: storage dtype name. target_dtype: compute
    dtype of the target. chat=False renders plain text (base models). template_kwargs go to
    apply_chat_template (e.g. {"enable_thinking": False}). chat_template: a Jinja file rendering
    the chats instead of the tokenizer's own template (`data.template`). reasoning: "keep" | "drop"
    (`specdraft.data.reasoning`). engine: "transformers" (the target in this process on
    `device`) or "vllm" (`capture.vllm`, engine arguments in `vllm`).
    """

    target: str
    data: str
    out_dir: str
    aux_layers: tuple[int, ...] | None = None
    dtype: str = "bfloat16"
    target_dtype: str = "float32"
    max_length: int = 2048
    shard_tokens: int = 65536
    batch_tokens: int = 16384
    chat: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    skip_bad: bool = False
    tokenizer: str | None = None
    chat_template: str | None = None
    reasoning: str = "keep"
    device: str = "cpu"
    engine: str = "transformers"
    vllm: VllmOptions = field(default_factory=VllmOptions)

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)
        parse_dtype(self.target_dtype)
        check_template_mode(self.chat_template, self.chat)
        if self.engine not in ENGINES:
            raise CaptureError(
                f"capture engine {self.engine!r}: expected one of {', '.join(ENGINES)}"
            )
        given = [
            f"--{f.name.replace('_', '-')}"
            for f in fields(VllmOptions)
            if getattr(self.vllm, f.name) != f.default
        ]
        if self.engine != "vllm" and given:
            what, it = (
                ("a vLLM engine option", "it")
                if len(given) == 1
                else ("vLLM engine options", "them")
            )
            raise CaptureError(
                f"{', '.join(given)}: {what}; capture with --engine vllm, or leave {it} out with "
                f"--engine {self.engine}"
            )


def load_inputs(source, device: str | torch.device = "cpu"):
    """The target, its tokenizer and the data of `source` rendered with it: what capture and
    online training read. source: a `CaptureConfig` or a `train.sources.OnlineSource`: its target,
    a transformers model directory (its tokenizer too unless `source.tokenizer` names one), loaded
    in `source.target_dtype` (a dtype name) onto `device`; its data rendered as its rendering
    fields say (`data.render.Rendering.of`: a chat_template Jinja file replaces the tokenizer's
    template, `data.template`). Returns (Target, tokenizer, SampleSet). Raises DataError (bad
    data, naming the file), TargetTokenizerError for a directory without a tokenizer
    (`targets.tokenizer.load_target_tokenizer`),
    and CaptureError (a ValueError) for a tokenizer longer than the target's vocabulary: it
    belongs to another model.
    """
    from specdraft.targets import load_target

    target = source.target
    model = load_target(target, dtype=parse_dtype(source.target_dtype), device=device)
    rendering = Rendering.of(source)
    tok, samples = load_samples(
        target, source.data, model.vocab_size, rendering, tokenizer=source.tokenizer
    )
    return model, tok, samples


def load_samples(
    target: str | Path,
    data: str | Path,
    vocab_size: int,
    rendering: Rendering,
    *,
    tokenizer: str | None = None,
):
    """The target's tokenizer (its template replaced by `rendering.chat_template`'s file, if given)
    and `data` rendered with it, checked against the target's `vocab_size` (as `load_inputs`, without loading the target). Returns (tokenizer, SampleSet)."""
    from specdraft.targets.tokenizer import load_target_tokenizer

    tok = load_target_tokenizer(tokenizer or target, TOKENIZER_DIR_FIX)
    if len(tok) > vocab_size:
        raise CaptureError(
            f"tokenizer has {len(tok)} tokens but the target's vocabulary is "
            f"{vocab_size}: pass the target's own tokenizer (--tokenizer)"
        )
    use_chat_template(tok, rendering.chat_template, chat=rendering.chat)
    return tok, rendering.load(data, tok)


def check_aux_arg(aux_layers, target: str | Path) -> None:
    """Refuse --aux-layers that the drafter trained on them could not be exported or served with
    (`conventions.check_aux_layers`: 3 layers, strictly increasing, within 0..L), reading L from
    the target's config so that nothing is loaded or written first. Raises ValueError."""
    from transformers import AutoConfig

    from specdraft.conventions import check_aux_flag

    config = AutoConfig.from_pretrained(target, local_files_only=True)
    check_aux_flag(aux_layers, config.get_text_config().num_hidden_layers)


def _aux_facts(aux_layers, target: str | Path) -> tuple[list[int], int, str]:
    """(the aux layers a capture uses: `aux_layers` or the default, the target's layer count, its
    class), from the target directory's config.json alone."""
    from specdraft.conventions import default_aux_layers
    from specdraft.targets.config import read_target_config, target_class_of

    config = read_target_config(target)
    text = config.get_text_config()
    architecture = (getattr(config, "architectures", None) or [None])[0]
    return (
        list(aux_layers or default_aux_layers(text.num_hidden_layers)),
        text.num_hidden_layers,
        target_class_of(architecture, text.model_type),
    )


def serving_line(aux_layers, target: str | Path) -> str | None:
    """`conventions.serving_problem` for a capture of `aux_layers` (None: the default) from the
    target directory `target`, read from its config.json alone; None when an engine serves them."""
    from specdraft.data.serving import serving_problem

    return serving_problem(*_aux_facts(aux_layers, target))


def aux_line(aux_layers, target: str | Path) -> str:
    """The one line capture prints before the work: the aux layers (specdraft indices; whether
    they are the default, and that the engines' default collapses below 7 layers) and the ids
    each engine is given for them (`conventions.to_engine_ids`; an engine that cannot take them
    says why)."""
    from specdraft.conventions import ConventionError, to_engine_ids

    layers, num_layers, target_class = _aux_facts(aux_layers, target)
    names = []
    for engine, label in (("vllm", "vllm/speculators"), ("sglang", "sglang")):
        try:
            names.append(f"{label} ids {to_engine_ids(layers, engine, num_layers, target_class)}")
        except ConventionError as e:
            names.append(f"{label}: {e}")
    origin = (
        f"given, on this {num_layers}-layer target"
        if aux_layers
        else f"the default on this {num_layers}-layer target"
        + (
            "; the engines' no-ids default [2, L//2, L-3] collapses below 7 layers"
            if num_layers < 7
            else ""
        )
    )
    return f"aux layers {layers} (specdraft indices, {origin}): " + ", ".join(names)


def capture_dataset(cfg: CaptureConfig, console=None) -> CaptureResult:
    """Load the target (or, with engine "vllm", start vLLM on it), its tokenizer and the data;
    render; `write_store` into cfg.out_dir.

    Raises DataError (bad data; a sample too long for --max-model-len without skip_bad),
    CaptureError (store of other settings; vLLM missing or unable to run the target, before
    anything is written), ValueError (a token id outside the target's vocabulary: the tokenizer
    belongs to another model)."""
    from specdraft.conventions import default_aux_layers

    check_store_dir(cfg.out_dir)
    if cfg.aux_layers is not None:
        check_aux_arg(cfg.aux_layers, cfg.target)
    if cfg.engine == "vllm":
        return _capture_through_vllm(cfg, console)
    target, tokenizer, data = load_inputs(cfg, cfg.device)
    settings = _settings(cfg, cfg.aux_layers or default_aux_layers(target.num_layers))
    _announce(cfg, console)
    extra = _identity(cfg, tokenizer, data, data.num_skipped, console)
    return write_store(
        target, data.samples, cfg.out_dir, settings, extra=extra, device=cfg.device, console=console
    )


def _announce(cfg: CaptureConfig, console) -> None:
    """Print, once the inputs are read and before the target runs, the aux layers (`aux_line`)
    and, when no engine serves them, why (`serving_line`)."""
    if console is None:
        return
    console.print(aux_line(cfg.aux_layers, cfg.target), markup=False, soft_wrap=True)
    if line := serving_line(cfg.aux_layers, cfg.target):
        console.print(f"warning: {line}", style="yellow", markup=False, soft_wrap=True)


def _clamped_line(cfg: CaptureConfig, engine) -> str:
    """The note that the default --max-model-len was clamped to the target's positions."""
    return (
        f"note: {cfg.target} has {engine.max_model_len} positions: vLLM captures with "
        f"--max-model-len {engine.max_model_len}, samples truncated to {engine.max_length} "
        f"tokens (--max-length {cfg.max_length} plus the token a request generates do not fit)"
    )


def _settings(cfg: CaptureConfig, aux_layers, max_length: int | None = None) -> StoreSettings:
    """The store's settings; `max_length` (default --max-length) is where samples are cut."""
    return StoreSettings(
        tuple(aux_layers),
        parse_dtype(cfg.dtype),
        max_length or cfg.max_length,
        cfg.shard_tokens,
        cfg.batch_tokens,
    )


def _identity(cfg: CaptureConfig, tokenizer, data, num_skipped: int, console) -> dict[str, Any]:
    """What index.json records of the tokenizer, template and data (`write_store` extra); prints
    the skipped count."""
    from specdraft.data.records import skipped_line
    from specdraft.data.render import tokenizer_fingerprint

    if console is not None and num_skipped:
        console.print(skipped_line(num_skipped, cfg.data), style="yellow", markup=False)
    return {
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "chat_template": data.render_info.to_dict(),
        "target_path": str(Path(cfg.target).resolve()),
        "data": {"path": str(cfg.data), "num_skipped": num_skipped},
    }


def _capture_through_vllm(cfg: CaptureConfig, console) -> CaptureResult:
    """`capture_dataset` with the network in vLLM: the head weights from the files, samples
    too long for --max-model-len dropped (skip_bad) or refused; with one engine, the engine
    started here before the store is touched; with --data-parallel-size M, one engine process
    per rank (`capture.vllm_parallel`), this process the store's one writer."""
    from specdraft.capture.vllm import (
        HeadTarget,
        VllmCapture,
        drop_too_long,
        import_vllm,
    )
    from specdraft.conventions import default_aux_layers

    import_vllm()
    head = HeadTarget(cfg.target, parse_dtype(cfg.target_dtype))
    tokenizer, data = load_samples(
        cfg.target, cfg.data, head.vocab_size, Rendering.of(cfg), tokenizer=cfg.tokenizer
    )
    aux_layers = cfg.aux_layers or default_aux_layers(head.num_layers)
    engine = VllmCapture(
        cfg.target, head, aux_layers, parse_dtype(cfg.target_dtype), cfg.vllm, cfg.max_length
    )
    settings = _settings(cfg, aux_layers, engine.max_length)
    _announce(cfg, console)
    if engine.max_length != cfg.max_length and console is not None:
        console.print(_clamped_line(cfg, engine), markup=False, soft_wrap=True)
    samples, too_long = drop_too_long(
        [s.truncated(engine.max_length) for s in data.samples],
        engine.max_model_len,
        cfg.skip_bad,
        cfg.data,
    )
    extra = _identity(cfg, tokenizer, data, data.num_skipped + too_long, console)
    return _write_through_vllm(cfg, engine, head, samples, settings, extra, console)


def _write_through_vllm(cfg: CaptureConfig, engine, head, samples, settings, extra, console):
    """`write_store` of `samples` with vLLM's `engine` running the network: one engine process
    per rank with --data-parallel-size M > 1 (`capture.vllm_parallel`), else `engine` started
    here, before the store is touched, and closed after."""
    write = functools.partial(
        write_store, head, samples, cfg.out_dir, settings, extra=extra, console=console
    )
    if cfg.vllm.data_parallel_size > 1:
        from specdraft.capture.vllm_parallel import DataParallelCapture, rank_environments

        envs = rank_environments(cfg.vllm.data_parallel_size, cfg.vllm.tensor_parallel_size)
        return write(run_shards=DataParallelCapture(engine, envs).run)
    engine.start(Path(cfg.out_dir))
    try:
        return write(run_shards=in_process(engine.capture_shard))
    finally:
        engine.close()
