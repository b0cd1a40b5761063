"""The `specdraft` command line: thin typer commands over the library.

Each command builds a config, calls one library function and renders the result with rich.
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.callback()
def main() -> None:
    """Train, export, verify and serve EAGLE-3 speculative-decoding drafters."""


@app.command()
def version() -> None:
    """Print specdraft's version."""
    from specdraft import __version__

    typer.echo(__version__)


def _json_kwargs(text: str, option: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"{option} {text!r} is not JSON ({e.msg}); e.g. "
                                 '\'{"enable_thinking": false}\'') from e
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{option} must be a JSON object")
    return value


@app.command()
def capture(
    target: str = typer.Argument(..., help="Target model directory (transformers)."),
    data: str = typer.Argument(..., help="JSONL chats/texts, save_to_disk dir or text file."),
    out: str = typer.Argument(..., help="Output store directory (resumed if it exists)."),
    aux_layers: str = typer.Option("", help="Specdraft indices, e.g. '2,3,4' (default: "
                                   "conventions.default_aux_layers)."),
    dtype: str = typer.Option("bf16", help="Storage dtype of hidden states: bf16|fp16|fp32."),
    target_dtype: str = typer.Option("fp32", help="Dtype the target runs in."),
    max_length: int = typer.Option(2048, help="Truncate samples to this many tokens."),
    shard_samples: int = typer.Option(1024, help="Samples per shard."),
    batch_tokens: int = typer.Option(16384, help="Padded tokens per target forward."),
    no_chat: bool = typer.Option(False, "--no-chat", help="Plain text (base models)."),
    template_kwargs: str = typer.Option("{}", help="JSON kwargs for the chat template."),
    tokenizer: str = typer.Option("", help="Tokenizer directory (default: the target's)."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip and count bad records."),
    device: str = typer.Option("cpu", help="Device for the target."),
) -> None:
    """Run the target over DATA and write a sharded hidden-state store to OUT."""
    from rich.console import Console

    from specdraft.capture import CaptureConfig, capture_dataset

    console = Console()
    cfg = CaptureConfig(
        target, data, out,
        aux_layers=tuple(int(x) for x in aux_layers.split(",")) if aux_layers else None,
        dtype=dtype, target_dtype=target_dtype, max_length=max_length,
        shard_samples=shard_samples, batch_tokens=batch_tokens, chat=not no_chat,
        template_kwargs=_json_kwargs(template_kwargs, "--template-kwargs"), skip_bad=skip_bad,
        tokenizer=tokenizer or None, device=device)
    try:
        result = capture_dataset(cfg, console=console)
    except (ValueError, FileNotFoundError) as e:
        console.print(f"error: {e}", style="red", markup=False)
        raise typer.Exit(1) from e
    console.print(f"store {result.path}: {result.num_samples} samples, {result.num_tokens} "
                  f"tokens, {result.num_shards} shards ({result.num_reused} kept from an earlier "
                  f"run)", style="green", markup=False)


@app.command()
def regenerate(
    data: str = typer.Argument(..., help="JSONL chats (or texts with --no-chat) to regenerate."),
    out: str = typer.Argument(..., help="Output JSONL (resumed if it exists)."),
    target: str = typer.Option("", help="Local target model directory (transformers)."),
    endpoint: str = typer.Option("", help="OpenAI-compatible base URL, e.g. http://host:8000."),
    model: str = typer.Option("", help="Served model name (with --endpoint)."),
    api: str = typer.Option("chat", help="Endpoint API: chat | completions."),
    tokenizer: str = typer.Option("", help="Target tokenizer dir (no-chat / completions)."),
    no_chat: bool = typer.Option(False, "--no-chat", help="Continue plain text (base models)."),
    prompt_tokens: int = typer.Option(32, help="No-chat prompt = first N tokens of a document."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0),
    max_new_tokens: int = typer.Option(256),
    seed: int = typer.Option(0),
    template_kwargs: str = typer.Option("{}", help="JSON kwargs for the chat template."),
    concurrency: int = typer.Option(8, help="Requests in flight (endpoint)."),
    batch_size: int = typer.Option(8, help="Prompts per generate call (local target)."),
    max_retries: int = typer.Option(5, help="Retries on 5xx / timeouts (endpoint)."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Skip and count bad records."),
    device: str = typer.Option("cpu", help="Device for a local target."),
) -> None:
    """Replace the answers in DATA with the target's own outputs, written to OUT."""
    import os

    from rich.console import Console

    from specdraft.regenerate import RegenConfig, Sampling, regenerate_file

    console = Console()
    try:
        cfg = RegenConfig(
            data, out, target=target or None, endpoint=endpoint or None, model=model, api=api,
            tokenizer=tokenizer or None, chat=not no_chat, prompt_tokens=prompt_tokens,
            sampling=Sampling(temperature, top_p, max_new_tokens, seed),
            template_kwargs=_json_kwargs(template_kwargs, "--template-kwargs"),
            concurrency=concurrency, batch_size=batch_size, max_retries=max_retries,
            api_key=os.environ.get("OPENAI_API_KEY"), skip_bad=skip_bad, device=device)
        result = regenerate_file(cfg, console=console)
    except (ValueError, RuntimeError) as e:
        console.print(f"error: {e}", style="red", markup=False)
        raise typer.Exit(1) from e
    console.print(f"{result.path}: {result.num_done} records written, {result.num_kept} kept "
                  f"from an earlier run, {result.num_empty} empty outputs", markup=False)


def _num_layers_of_target(target: str | None) -> int | None:
    """Decoder-layer count of a local transformers target directory (None without one)."""
    if not target:
        return None
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(target, local_files_only=True).get_text_config().num_hidden_layers


@app.command()
def inspect(
    checkpoint: str = typer.Argument(..., help="Draft checkpoint directory (any layout)."),
    target: str = typer.Option("", help="Target directory: needed to read aux ids without a manifest."),
) -> None:
    """Show a drafter's layout, tensors, manifest and audit verdict (exit 1 on a failed audit)."""
    from rich.console import Console
    from rich.table import Table

    from specdraft.checkpoint import CheckpointError, audit, load_draft, state_dict_for_layout

    console = Console()
    try:
        loaded = load_draft(checkpoint, target_num_layers=_num_layers_of_target(target))
    except (CheckpointError, ValueError) as e:
        console.print(f"error: {e}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    table = Table(title=f"{checkpoint} ({loaded.layout} layout)")
    for column in ("tensor", "shape", "dtype"):
        table.add_column(column)
    for name, tensor in state_dict_for_layout(loaded.model, loaded.layout).items():
        table.add_row(name, str(tuple(tensor.shape)), str(tensor.dtype).removeprefix("torch."))
    console.print(table)
    cfg = loaded.model.cfg
    console.print(f"aux layers (specdraft indices): {list(cfg.aux_layers)} of {cfg.target_num_layers}; "
                  f"hidden {cfg.hidden_size}, target hidden {cfg.target_hidden_size}; "
                  f"draft vocab {cfg.draft_vocab_size} of {cfg.vocab_size}", markup=False)
    if loaded.manifest is not None:
        console.print_json(loaded.manifest.to_json())
    problems = audit(loaded.model)
    for problem in problems:
        console.print(f"audit: FAIL {problem}", style="red", markup=False)
    if problems:
        raise typer.Exit(1)
    console.print("audit: PASS", style="green")


@app.command()
def convert(
    src: str = typer.Argument(..., help="Draft checkpoint directory (layout detected)."),
    dst: str = typer.Argument(..., help="Output directory."),
    layout: str = typer.Option(..., help="sglang | speculators | specdraft"),
    target: str = typer.Option("", help="Target directory: needed to read aux ids without a manifest."),
) -> None:
    """Rewrite a drafter in another layout, losslessly (every tensor checked bit-identical)."""
    from rich.console import Console

    from specdraft.checkpoint import CheckpointError, convert_draft

    console = Console()
    try:
        written = convert_draft(src, dst, layout=layout, target_num_layers=_num_layers_of_target(target))
    except (CheckpointError, ValueError) as e:
        console.print(f"error: {e}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    console.print(f"wrote {dst} ({layout} layout): {written} tensors, each bit-identical to {src}",
                  markup=False)
