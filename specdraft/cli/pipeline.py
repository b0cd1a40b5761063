"""Commands that build a drafter: capture, regenerate, train."""

from __future__ import annotations

import json

import typer

from specdraft.cli.common import (
    SKIP_BAD_HINT,
    DtypeName,
    EndpointApi,
    Precision,
    app,
    argument,
    aux_layer_list,
    check_device,
    check_model_dir,
    check_top_p,
    check_url,
    error,
    flag,
    json_kwargs,
    refuse_bad_configs,
    user_errors,
)


@app.command()
def capture(
    target: str = argument("TARGET", "Target model directory (transformers).", callback=check_model_dir),
    data: str = argument("DATA", "JSONL chats/texts, save_to_disk dir or text file."),
    out: str = argument("OUT", "Output store directory (resumed if it exists)."),
    aux_layers: str | None = typer.Option(None, help="Specdraft indices, e.g. '2,3,4' (default: "
                                          "[2, L//2, L-3] for an L-layer target).", callback=aux_layer_list),
    dtype: DtypeName = typer.Option("bf16", help="Storage dtype of hidden states."),
    target_dtype: DtypeName = typer.Option("fp32", help="Dtype the target runs in."),
    max_length: int = typer.Option(2048, min=1, help="Truncate samples to this many tokens."),
    shard_tokens: int = typer.Option(65536, min=1, help="Tokens per shard (bounds memory)."),
    batch_tokens: int = typer.Option(16384, min=1, help="Padded tokens per target forward."),
    no_chat: bool = flag("--no-chat", help="Plain text (base models)."),
    template_kwargs: str = typer.Option("{}", help="JSON kwargs for the chat template."),
    tokenizer: str = typer.Option("", help="Tokenizer directory (default: the target's)."),
    skip_bad: bool = flag("--skip-bad", help="Skip and count bad records."),
    device: str = typer.Option("cpu", help="Device for the target.", callback=check_device),
) -> None:
    """Run the target over DATA and write a sharded hidden-state store to OUT."""
    from rich.console import Console

    from specdraft.capture.stage import CaptureConfig, capture_dataset
    from specdraft.capture.write import interrupted_capture

    console = Console()
    cfg = CaptureConfig(
        target, data, out,
        aux_layers=aux_layers,
        dtype=dtype, target_dtype=target_dtype, max_length=max_length,
        shard_tokens=shard_tokens, batch_tokens=batch_tokens, chat=not no_chat,
        template_kwargs=json_kwargs(template_kwargs, "--template-kwargs"), skip_bad=skip_bad,
        tokenizer=tokenizer or None, device=device)
    with user_errors(console, SKIP_BAD_HINT, interrupted=lambda: interrupted_capture(out)):
        refuse_bad_configs("", target, ("model_type", "num_hidden_layers", "hidden_size"))
        result = capture_dataset(cfg, console=console)
    console.print(f"capture store at {result.path}: {result.num_samples} samples, {result.num_tokens} "
                  f"tokens, {result.num_shards} shards ({result.num_reused} kept from an earlier "
                  f"run)", style="green", markup=False)


@app.command()
def regenerate(
    data: str = argument("DATA", "JSONL chats (or texts with --no-chat) to regenerate."),
    out: str = argument("OUT", "Output JSONL (resumed if it exists)."),
    target: str = typer.Option("", help="Local target model directory (transformers).", callback=check_model_dir),
    endpoint: str = typer.Option("", help="OpenAI-compatible base URL, e.g. http://host:8000.", callback=check_url),
    model: str = typer.Option("", help="Served model name (with --endpoint)."),
    api: EndpointApi = typer.Option("chat", help="Endpoint API."),
    tokenizer: str = typer.Option("", help="Target tokenizer dir (no-chat / completions)."),
    no_chat: bool = flag("--no-chat", help="Continue plain text (base models)."),
    prompt_tokens: int = typer.Option(32, min=1, help="No-chat prompt = first N tokens of a document."),
    temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass, in (0, 1] (1 = off).", callback=check_top_p),
    max_new_tokens: int = typer.Option(256, min=1),
    seed: int = typer.Option(0),
    template_kwargs: str = typer.Option("{}", help="JSON kwargs for the chat template."),
    concurrency: int = typer.Option(8, min=1, help="Requests in flight (endpoint)."),
    batch_size: int = typer.Option(8, min=1, help="Prompts per generate call (local target)."),
    max_retries: int = typer.Option(5, min=0, help="Retries on 5xx / timeouts (endpoint)."),
    skip_bad: bool = flag("--skip-bad", help="Skip and count bad records."),
    device: str = typer.Option("cpu", help="Device for a local target.", callback=check_device),
) -> None:
    """Replace the answers in DATA with the target's own outputs, written to OUT."""
    import os

    from rich.console import Console

    from specdraft.regenerate.backends import Sampling, served_model
    from specdraft.regenerate.output import check_out_path, interrupted_regenerate
    from specdraft.regenerate.run import RegenConfig, regenerate_file

    console = Console()
    with user_errors(console, SKIP_BAD_HINT, interrupted=lambda: interrupted_regenerate(out)):
        check_out_path(out, data)  # before asking the endpoint for its model
        refuse_bad_configs("", target, ("model_type",))
        if endpoint and not target and not model:
            model = served_model(endpoint, os.environ.get("OPENAI_API_KEY"))
            console.print(f"--model not given: using {model}, the one model {endpoint} serves", markup=False,
                          soft_wrap=True)
        cfg = RegenConfig(
            data, out, target=target or None, endpoint=endpoint or None, model=model, api=api,
            tokenizer=tokenizer or None, chat=not no_chat, prompt_tokens=prompt_tokens,
            sampling=Sampling(temperature, top_p, max_new_tokens, seed),
            template_kwargs=json_kwargs(template_kwargs, "--template-kwargs"),
            concurrency=concurrency, batch_size=batch_size, max_retries=max_retries,
            api_key=os.environ.get("OPENAI_API_KEY"), skip_bad=skip_bad, device=device)
        result = regenerate_file(cfg, console=console)
    console.print(f"{result.path}: {result.num_done} records written, {result.num_kept} kept "
                  f"from an earlier run, {result.num_empty} empty outputs", markup=False)


def _train_source(source: str, online: bool, target: str, no_chat: bool, template_kwargs: dict):
    """`train`'s SOURCE: a store directory, or with --online an OnlineSource running --target.
    Raises ValueError for an option that does not fit the mode."""
    from pathlib import Path

    from specdraft.train.sources import OnlineSource

    if not online:
        path = Path(source)
        if path.is_file():
            raise ValueError(f"{source} is a data file, not a capture store directory: train on it with "
                             f"--online --target DIR (the target runs in the loop), or capture it first "
                             f"(specdraft capture TARGET {source} STORE) and train on STORE")
        if not path.exists():
            raise ValueError(f"{source}: no such directory; SOURCE is a capture store directory "
                             "(specdraft capture), or with --online --target DIR a data file")
        if no_chat or template_kwargs:
            raise ValueError("--no-chat and --template-kwargs apply with --online only (a store "
                             "was rendered at capture)")
        return source
    if not target:
        raise ValueError("--online needs --target: the target model directory to run in the loop")
    return OnlineSource(target, source, chat=not no_chat, template_kwargs=template_kwargs)


def _train_config_values(config: str) -> dict:
    """--config FILE as a dict of TrainConfig fields ({} without one); ValueError naming the file."""
    from pathlib import Path

    from specdraft.train.loop import TrainConfig

    if not config:
        return {}
    try:
        values = json.loads(Path(config).read_text())
    except OSError as e:
        raise ValueError(f"--config {config}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--config {config}: not JSON ({e.msg.removesuffix(' at')} at line {e.lineno} "
                         f"column {e.colno})") from None
    if not isinstance(values, dict):
        raise ValueError(f"--config {config}: expected a JSON object of TrainConfig fields, e.g. "
                         '{"lr": 0.0003, "ttt_steps": 7}')
    unknown = sorted(set(values) - set(TrainConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"--config {config}: unknown keys {unknown}; TrainConfig fields are "
                         f"{', '.join(TrainConfig.__dataclass_fields__)}")
    return values


@app.command()
def train(
    source: str = argument("SOURCE", "Capture store directory (`specdraft capture`); with --online, "
                            "JSONL chats/texts, save_to_disk dir or text file."),
    out: str = argument("OUT", "Run directory: checkpoints/, metrics.jsonl, tensorboard/, draft/."),
    config: str = typer.Option("", help="TrainConfig JSON file; the options below override it."),
    steps: int | None = typer.Option(None, min=1, help="Total optimizer steps (instead of --epochs; neither "
                                     "= one epoch)."),
    epochs: int | None = typer.Option(None, min=1, help="Passes over the training split (neither --steps nor "
                                      "--epochs = one epoch)."),
    lr: float | None = typer.Option(None, help="Peak learning rate, after warm-up (1e-4: suits long runs on "
                                    "large data; small data / short runs need a larger one, e.g. the demo's "
                                    "--lr 3e-3 --ttt-steps 4 for 1000 steps on 800 documents)."),
    batch_size: int | None = typer.Option(None, min=1, help="Sequences per step, over all ranks (8)."),
    grad_accum_steps: int | None = typer.Option(None, min=1, help="Micro-batches per step on each rank (1)."),
    max_length: int | None = typer.Option(None, min=1, help="Truncate samples to this many tokens (2048)."),
    ttt_steps: int | None = typer.Option(None, min=1, help="Training-time-test unroll steps (7)."),
    draft_vocab_size: int | None = typer.Option(None, min=1, help="Default: the target's vocabulary."),
    precision: Precision | None = typer.Option(None, help="fp32 (default) | bf16 (CUDA autocast)."),
    target: str = typer.Option("", help="Target directory: the live target with --online; offline only when "
                               "the store's recorded path moved.", callback=check_model_dir),
    online: bool = flag("--online", help="Run --target on SOURCE's records at every step "
                         "(no capture store)."),
    aux_layers: str | None = typer.Option(None, help="Specdraft indices, e.g. '2,3,4' (online default: "
                                          "[2, L//2, L-3] for an L-layer target; a store's must match).",
                                          callback=aux_layer_list),
    no_chat: bool = flag("--no-chat", help="With --online: plain text (base models)."),
    template_kwargs: str = typer.Option("{}", help="With --online: JSON kwargs for the chat template."),
    target_dtype: DtypeName | None = typer.Option(None, help="With --online: dtype the target runs in "
                                                  "(default: float32)."),
    skip_bad: bool = flag("--skip-bad", help="With --online: skip and count bad records."),
    warmup_steps: int | None = typer.Option(None, min=0, help="Linear learning-rate warm-up steps (100)."),
    save_every: int | None = typer.Option(None, min=1, help="Checkpoint every N steps (500) and at the end, "
                                           "under OUT/checkpoints; the newest 2 are kept (--config key "
                                           "keep_checkpoints)."),
    resume: bool = flag("--resume", help="Continue from OUT's newest checkpoint with its "
                         "settings (options left out come from it); a larger --steps / --epochs "
                         "extends the run (the lr schedule is recomputed)."),
) -> None:
    """Train an EAGLE-3 drafter on SOURCE into OUT (several GPUs: torchrun --nproc-per-node N -m specdraft.cli train ...).

    The device is chosen automatically: the GPU when torch sees one (under torchrun, each rank's
    LOCAL_RANK GPU), else the CPU.
    """
    import dataclasses
    import sys

    from rich.console import Console

    from specdraft.train.loop import (
        TrainConfig,
        TrainingError,
        check_run_dir,
        checkpoint_paths,
        resume_config,
    )
    from specdraft.train.loop import train as run_training

    console = Console()
    kwargs = json_kwargs(template_kwargs, "--template-kwargs")
    try:
        options = dict(total_steps=steps, epochs=epochs, lr=lr, batch_size=batch_size,
                       grad_accum_steps=grad_accum_steps, max_length=max_length, ttt_steps=ttt_steps,
                       draft_vocab_size=draft_vocab_size, precision=precision, aux_layers=aux_layers,
                       warmup_steps=warmup_steps, save_every=save_every)
        data = _train_source(source, online, target, no_chat, kwargs)
        if online:
            data = dataclasses.replace(data, target_dtype=target_dtype or "float32", skip_bad=skip_bad)
        elif target_dtype or skip_bad:
            raise ValueError("--target-dtype and --skip-bad apply with --online only (a store was captured "
                             "with them: specdraft capture --target-dtype / --skip-bad)")
        if steps is not None and epochs is not None:
            raise ValueError(f"--steps {steps} and --epochs {epochs} both set: give one run length "
                             "(neither = one epoch)")
        values = _train_config_values(config)  # the settings given: --config keys, then flags
        if steps is not None or epochs is not None:  # the options replace the file's run length
            values.update(total_steps=None, epochs=None)
        values.update({k: v for k, v in options.items() if v is not None})
        if resume:  # settings not given come from the checkpoint; those given must match it
            check_run_dir(out)  # before saying anything about it
            saved = checkpoint_paths(out)
            console.print(f"resuming from {saved[-1]} with its settings" if saved else
                          f"--resume: no checkpoint in {out} yet: starting at step 0", markup=False, soft_wrap=True)
            cfg = resume_config(out, values)
        else:
            cfg = TrainConfig.from_dict(values)
        result = run_training(cfg, data, out, resume=resume,
                              command=" ".join(["specdraft", *sys.argv[1:]]), target_config=target or None,
                              on_note=lambda text: console.print(f"note: {text}", markup=False, soft_wrap=True))
    except KeyboardInterrupt:
        saved = checkpoint_paths(out)
        console.print(f"interrupted; newest checkpoint: {saved[-1]}: continue with the same command and --resume"
                      if saved else "interrupted before the first checkpoint (--save-every): nothing to resume",
                      markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except (ValueError, FileNotFoundError, FileExistsError, TrainingError) as e:
        error(console, e, SKIP_BAD_HINT)
        raise typer.Exit(1) from e
    if result.draft_dir is None:
        return  # not rank 0
    if result.train_loss is None:  # resumed at the last step
        console.print(f"{out} is already at step {result.steps} of {result.steps}: nothing to train; draft "
                      f"{result.draft_dir}", markup=False, soft_wrap=True)
    else:
        console.print(f"{result.steps} steps, last train loss {result.train_loss:.4f}; draft "
                      f"{result.draft_dir}; metrics {result.metrics_path}", markup=False)
    if cfg.warmup_steps >= result.steps:
        console.print(f"note: warm-up {cfg.warmup_steps} steps >= the run's {result.steps}: the learning rate "
                      f"never reached {cfg.lr} (pass --warmup-steps)", markup=False, soft_wrap=True)
    if result.validation:
        acc = " ".join(f"{a:.3f}" for a in result.validation["accuracy"])
        alpha = " ".join(f"{a:.3f}" for a in result.validation["alpha"])
        console.print(f"validation accuracy per step {acc}; alpha {alpha}; simulated tau "
                      f"{result.validation['tau']:.3f}", markup=False)
        if result.validation.get("replayed_tau") is not None:
            steps = len(result.validation["accuracy"])
            p = " ".join(f"{a:.3f}" for a in result.validation["replayed_acceptance"])
            console.print(f"a {steps}-step chain engine at T = 0 on the validation text: p_k {p}, tau "
                          f"{result.validation['replayed_tau']:.3f} over {result.validation['replayed_rounds']} "
                          "rounds", markup=False)
