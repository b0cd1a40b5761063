"""Commands that build a drafter: capture, regenerate, train."""

from __future__ import annotations

import typer

from specdraft.cli.common import (
    REASONING_HELP,
    SKIP_BAD_HINT,
    CaptureEngine,
    DtypeName,
    EndpointApi,
    Precision,
    ReasoningMode,
    app,
    argument,
    aux_layer_list,
    check_device,
    check_model_dir,
    check_top_p,
    flag,
    json_kwargs,
    make_console,
    refuse_bad_configs,
    set_threads,
    threads_option,
    url_option,
    user_errors,
)


@app.command()
def capture(
    target: str = argument(
        "TARGET", "Target model directory (transformers).", callback=check_model_dir
    ),
    data: str = argument("DATA", "JSONL chats/texts, save_to_disk dir or text file."),
    out: str = argument("OUT", "Output store directory (resumed if it exists)."),
    aux_layers: str | None = typer.Option(
        None,
        help="Specdraft indices, e.g. '2,3,4' (default: [2, L//2, L-3] for an L-layer target).",
        callback=aux_layer_list,
    ),
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
    reasoning: ReasoningMode = typer.Option("keep", help=REASONING_HELP),
    engine: CaptureEngine = typer.Option(
        "transformers",
        help="What runs the target: transformers (here, on "
        "--device) or vllm (its engine; the options below).",
    ),
    tensor_parallel_size: int = typer.Option(1, min=1, help="With --engine vllm: GPUs per engine."),
    data_parallel_size: int = typer.Option(
        1, min=1, help="With --engine vllm: engines, one process each, on GPUs r*TP..(r+1)*TP-1."
    ),
    max_model_len: int | None = typer.Option(
        None, min=2, help="With --engine vllm: longest request (default: --max-length + 1)."
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None, min=0.0, max=1.0, help="With --engine vllm: GPU memory fraction (default: vLLM's)."
    ),
    enforce_eager: bool = flag(
        "--enforce-eager",
        help="With --engine vllm: no torch.compile or CUDA graphs "
        "(starts in seconds; a capture is prefill only).",
    ),
    attention_backend: str | None = typer.Option(
        None,
        help="With --engine vllm: vLLM's attention backend "
        "(e.g. FLASH_ATTN, CPU_MLA; default: vLLM's choice).",
    ),
    threads: int | None = threads_option(),
) -> None:
    """Run the target over DATA and write a sharded hidden-state store to OUT."""
    from specdraft.capture.stage import CaptureConfig, capture_dataset
    from specdraft.capture.vllm import VllmOptions
    from specdraft.capture.write import interrupted_capture

    console = make_console()
    with user_errors(console, SKIP_BAD_HINT, interrupted=lambda: interrupted_capture(out)):
        cfg = CaptureConfig(
            target,
            data,
            out,
            aux_layers=aux_layers,
            dtype=dtype,
            target_dtype=target_dtype,
            max_length=max_length,
            shard_tokens=shard_tokens,
            batch_tokens=batch_tokens,
            chat=not no_chat,
            template_kwargs=json_kwargs(template_kwargs, "--template-kwargs"),
            skip_bad=skip_bad,
            tokenizer=tokenizer or None,
            device=device,
            reasoning=reasoning,
            engine=engine,
            vllm=VllmOptions(
                tensor_parallel_size,
                data_parallel_size,
                max_model_len,
                gpu_memory_utilization,
                enforce_eager,
                attention_backend,
            ),
        )
        refuse_bad_configs("", target, ("model_type", "num_hidden_layers", "hidden_size"))
        set_threads(threads)
        result = capture_dataset(cfg, console=console)
    n, kept = result.num_shards, result.num_reused
    console.print(
        f"capture store at {result.path}: {result.num_samples} samples, {result.num_tokens} "
        f"tokens, {n} shard{'s' * (n != 1)}"
        + (f" ({kept} of {n} kept from an earlier run)" if kept else ""),
        style="green",
        markup=False,
    )


@app.command()
def regenerate(
    data: str = argument("DATA", "JSONL chats (or texts with --no-chat) to regenerate."),
    out: str = argument("OUT", "Output JSONL (resumed if it exists)."),
    target: str = typer.Option(
        "", help="Local target model directory (transformers).", callback=check_model_dir
    ),
    endpoint: str = typer.Option(
        "", help="OpenAI-compatible base URL, e.g. http://host:8000.", callback=url_option
    ),
    model: str = typer.Option("", help="Served model name (with --endpoint)."),
    api: EndpointApi = typer.Option("chat", help="Endpoint API."),
    tokenizer: str = typer.Option("", help="Target tokenizer dir (no-chat / completions)."),
    no_chat: bool = flag("--no-chat", help="Continue plain text (base models)."),
    prompt_tokens: int = typer.Option(
        32, min=1, help="No-chat prompt = first N tokens of a document."
    ),
    temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(
        1.0, help="Nucleus sampling mass, in (0, 1] (1 = off).", callback=check_top_p
    ),
    max_new_tokens: int = typer.Option(
        256, min=1, help="Longest answer / continuation the target writes per record."
    ),
    seed: int = typer.Option(0, help="Sampling seed (with --temperature > 0)."),
    template_kwargs: str = typer.Option("{}", help="JSON kwargs for the chat template."),
    concurrency: int = typer.Option(8, min=1, help="Requests in flight (endpoint)."),
    batch_size: int = typer.Option(8, min=1, help="Prompts per generate call (local target)."),
    max_retries: int = typer.Option(5, min=0, help="Retries on 5xx / timeouts (endpoint)."),
    skip_bad: bool = flag("--skip-bad", help="Skip and count bad records."),
    device: str = typer.Option("cpu", help="Device for a local target.", callback=check_device),
    reasoning: ReasoningMode = typer.Option(
        "keep",
        help="keep: write the target's reasoning with each "
        "answer; drop: ask for non-thinking answers (the template's "
        "switch) and write none.",
    ),
    threads: int | None = threads_option(),
) -> None:
    """Replace the answers in DATA with the target's own outputs, written to OUT."""
    import os

    from specdraft.regenerate.backends import Sampling, served_model
    from specdraft.regenerate.output import check_out_path, interrupted_regenerate
    from specdraft.regenerate.run import RegenConfig, regenerate_file

    console = make_console()
    with user_errors(console, SKIP_BAD_HINT, interrupted=lambda: interrupted_regenerate(out)):
        check_out_path(out, data)  # before asking the endpoint for its model
        refuse_bad_configs("", target, ("model_type",))
        if endpoint and not target and not model:
            model = served_model(endpoint, os.environ.get("OPENAI_API_KEY"))
            console.print(
                f"--model not given: using {model}, the one model {endpoint} serves",
                markup=False,
                soft_wrap=True,
            )
        cfg = RegenConfig(
            data,
            out,
            target=target or None,
            endpoint=endpoint or None,
            model=model,
            api=api,
            tokenizer=tokenizer or None,
            chat=not no_chat,
            prompt_tokens=prompt_tokens,
            sampling=Sampling(temperature, top_p, max_new_tokens, seed),
            template_kwargs=json_kwargs(template_kwargs, "--template-kwargs"),
            concurrency=concurrency,
            batch_size=batch_size,
            max_retries=max_retries,
            api_key=os.environ.get("OPENAI_API_KEY"),
            skip_bad=skip_bad,
            device=device,
            reasoning=reasoning,
        )
        set_threads(threads)
        result = regenerate_file(cfg, console=console)
    empty = (
        f", {result.num_empty} left out (the target's answer was empty)" if result.num_empty else ""
    )
    console.print(
        f"{result.path}: {result.num_done} records written, {result.num_kept} kept "
        f"from an earlier run{empty}",
        markup=False,
        soft_wrap=True,
    )


# --help of `specdraft train`'s options (here, so that each option fits one line of the command)
TRAIN_HELP = {
    "source": "Capture store directory (`specdraft capture`); with --online, JSONL chats/texts, save_to_disk "
    "dir or text file.",
    "out": "Run directory: checkpoints/, metrics.jsonl, tensorboard/, draft/.",
    "config": "TrainConfig JSON file; the options below override it.",
    "steps": "Total optimizer steps (instead of --epochs; neither = one epoch).",
    "epochs": "Passes over the training split (neither --steps nor --epochs = one epoch).",
    "lr": "Peak learning rate, after warm-up (1e-4: suits long runs on large data; small data / short runs need "
    "a larger one, e.g. the demo's --lr 3e-3 --ttt-steps 4 for 1000 steps on 800 documents).",
    "batch_size": "Sequences per step, over all ranks.  [default: 8]",
    "grad_accum_steps": "Micro-batches per step on each rank.  [default: 1]",
    "max_length": "Truncate samples to this many tokens.  [default: 2048]",
    "ttt_steps": "Training-time-test unroll steps.  [default: 7]",
    "draft_vocab_size": "Default: the usable vocabulary, the tokenizer's length (vocab_size may pad past it).",
    "precision": "fp32 | bf16 (CUDA autocast).  [default: fp32]",
    "target": "Target directory: the live target with --online; offline only when the store's recorded path moved.",
    "online": "Run --target on SOURCE's records at every step (no capture store).",
    "aux_layers": "Specdraft indices, e.g. '2,3,4' (online default: [2, L//2, L-3] for an L-layer target; a "
    "store's must match).",
    "no_chat": "With --online: plain text (base models).",
    "template_kwargs": "With --online: JSON kwargs for the chat template.",
    "target_dtype": "With --online: dtype the target runs in.  [default: float32]",
    "skip_bad": "With --online: skip and count bad records.",
    "reasoning": f"With --online: {REASONING_HELP}  [default: keep]",
    "warmup_steps": "Linear learning-rate warm-up steps.  [default: 100]",
    "save_every": "Checkpoint every N steps and at the end, under OUT/checkpoints; the newest 2 are kept "
    "(--config key keep_checkpoints).  [default: 500]",
    "resume": "Continue from OUT's newest checkpoint with its settings (options left out come from it); a larger "
    "--steps / --epochs extends the run (the lr schedule is recomputed).",
}
H = TRAIN_HELP


@app.command()
def train(
    source: str = argument("SOURCE", H["source"]),
    out: str = argument("OUT", H["out"]),
    config: str = typer.Option("", help=H["config"]),
    steps: int | None = typer.Option(None, min=1, help=H["steps"]),
    epochs: int | None = typer.Option(None, min=1, help=H["epochs"]),
    lr: float | None = typer.Option(None, help=H["lr"]),
    batch_size: int | None = typer.Option(None, min=1, help=H["batch_size"]),
    grad_accum_steps: int | None = typer.Option(None, min=1, help=H["grad_accum_steps"]),
    max_length: int | None = typer.Option(None, min=1, help=H["max_length"]),
    ttt_steps: int | None = typer.Option(None, min=1, help=H["ttt_steps"]),
    draft_vocab_size: int | None = typer.Option(None, min=1, help=H["draft_vocab_size"]),
    precision: Precision | None = typer.Option(None, help=H["precision"]),
    target: str = typer.Option("", help=H["target"], callback=check_model_dir),
    online: bool = flag("--online", help=H["online"]),
    aux_layers: str | None = typer.Option(None, help=H["aux_layers"], callback=aux_layer_list),
    no_chat: bool = flag("--no-chat", help=H["no_chat"]),
    template_kwargs: str = typer.Option("{}", help=H["template_kwargs"]),
    target_dtype: DtypeName | None = typer.Option(None, help=H["target_dtype"]),
    skip_bad: bool = flag("--skip-bad", help=H["skip_bad"]),
    reasoning: ReasoningMode | None = typer.Option(None, help=H["reasoning"]),
    warmup_steps: int | None = typer.Option(None, min=0, help=H["warmup_steps"]),
    save_every: int | None = typer.Option(None, min=1, help=H["save_every"]),
    resume: bool = flag("--resume", help=H["resume"]),
    threads: int | None = threads_option(),
) -> None:
    """Train an EAGLE-3 drafter on SOURCE into OUT (several GPUs: torchrun --nproc-per-node N -m specdraft.cli train ...).

    The device is chosen automatically: the GPU when torch sees one (under torchrun, each rank's
    LOCAL_RANK GPU), else the CPU.
    """
    import sys

    from specdraft.train.config import run_config, train_source
    from specdraft.train.loop import train as run_training
    from specdraft.train.run_dir import interrupted_message

    console = make_console()

    def say(text: str) -> None:
        console.print(text, markup=False, soft_wrap=True)

    flags = dict(
        total_steps=steps,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        grad_accum_steps=grad_accum_steps,
        max_length=max_length,
        ttt_steps=ttt_steps,
        draft_vocab_size=draft_vocab_size,
        precision=precision,
        aux_layers=aux_layers,
        warmup_steps=warmup_steps,
        save_every=save_every,
    )
    with user_errors(console, SKIP_BAD_HINT, interrupted=lambda: interrupted_message(out)):
        set_threads(threads)
        data = train_source(
            source,
            online,
            target,
            no_chat=no_chat,
            skip_bad=skip_bad,
            target_dtype=target_dtype,
            template_kwargs=json_kwargs(template_kwargs, "--template-kwargs"),
            reasoning=reasoning,
        )
        cfg = run_config(config, flags, out, resume, say)
        result = run_training(
            cfg,
            data,
            out,
            resume=resume,
            command=" ".join(["specdraft", *sys.argv[1:]]),
            target_config=target or None,
            on_note=lambda text: say(f"note: {text}"),
        )
    _render_train(console, out, cfg, result)


def _render_train(console, out: str, cfg, result) -> None:
    """What a finished `specdraft train` prints on rank 0: steps, loss, files, a warm-up note, validation."""
    if result.draft_dir is None:
        return  # not rank 0
    if result.train_loss is None:  # resumed at the last step
        console.print(
            f"{out} is already at step {result.steps} of {result.steps}: nothing to train; draft "
            f"{result.draft_dir}",
            markup=False,
            soft_wrap=True,
        )
    else:
        console.print(
            f"{result.steps} steps, last train loss {result.train_loss:.4f}; draft "
            f"{result.draft_dir}; metrics {result.metrics_path}",
            markup=False,
        )
    if cfg.warmup_steps >= result.steps:
        console.print(
            f"note: warm-up {cfg.warmup_steps} steps >= the run's {result.steps}: the learning rate "
            f"never reached {cfg.lr} (pass --warmup-steps)",
            markup=False,
            soft_wrap=True,
        )
    if result.validation:
        _render_validation(console, result.validation)


def _render_validation(console, validation: dict) -> None:
    acc = " ".join(f"{a:.3f}" for a in validation["accuracy"])
    alpha = " ".join(f"{a:.3f}" for a in validation["alpha"])
    console.print(
        f"validation accuracy per step {acc}; alpha {alpha}; simulated tau {validation['tau']:.3f}",
        markup=False,
    )
    if validation.get("replayed_tau") is not None:
        steps = len(validation["accuracy"])
        p = " ".join(f"{a:.3f}" for a in validation["replayed_acceptance"])
        console.print(
            f"a {steps}-step chain engine at T = 0 on the validation text: p_k {p}, tau "
            f"{validation['replayed_tau']:.3f} over {validation['replayed_rounds']} "
            "rounds",
            markup=False,
        )
