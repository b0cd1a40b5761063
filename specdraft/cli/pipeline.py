"""Commands that make a drafter's training data: capture, regenerate (train: `cli.training`)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from specdraft.cli.checks import (
    aux_layer_list,
    check_device,
    check_model_dir,
    url_option,
)
from specdraft.cli.common import (
    SKIP_BAD_HINT,
    app,
    config_of,
    make_console,
    option_fields,
    set_threads,
    user_errors,
)
from specdraft.cli.options import (
    REASONING_HELP,
    CaptureEngine,
    ChatTemplate,
    DtypeName,
    EndpointApi,
    ReasoningMode,
    SkipBad,
    TemplateKwargs,
    Threads,
    TopP,
    argument,
    flag,
    option,
)
from specdraft.cli.reading import refuse_bad_configs

CaptureTarget = Annotated[
    str, argument("TARGET", "Target model directory (transformers).", callback=check_model_dir)
]
CaptureData = Annotated[str, argument("DATA", "JSONL chats/texts, save_to_disk dir or text file.")]
StoreOut = Annotated[str, argument("OUT", "Output store directory (resumed if it exists).")]
CaptureAuxLayers = Annotated[
    str | None,
    option(
        None,
        help="Specdraft indices, e.g. '2,3,4' (default: [2, L//2, L-3] for an L-layer target).",
        callback=aux_layer_list,
    ),
]
StoreDtype = Annotated[DtypeName, option("bf16", help="Storage dtype of hidden states.")]
TargetDtype = Annotated[DtypeName, option("fp32", help="Dtype the target runs in.")]
MaxLength = Annotated[int, option(2048, min=1, help="Truncate samples to this many tokens.")]
ShardTokens = Annotated[int, option(65536, min=1, help="Tokens per shard (bounds memory).")]
BatchTokens = Annotated[int, option(16384, min=1, help="Padded tokens per target forward.")]
NoChat = flag("--no-chat", help="Plain text (base models).")
CaptureTokenizer = Annotated[str, option("", help="Tokenizer directory (default: the target's).")]
CaptureDevice = Annotated[str, option("cpu", help="Device for the target.", callback=check_device)]
CaptureReasoning = Annotated[ReasoningMode, option("keep", help=REASONING_HELP)]
CaptureEngineOption = Annotated[
    CaptureEngine,
    option(
        "transformers",
        help="What runs the target: transformers (here, on "
        "--device) or vllm (its engine; the options below).",
    ),
]
TensorParallelSize = Annotated[int, option(1, min=1, help="With --engine vllm: GPUs per engine.")]
DataParallelSize = Annotated[
    int,
    option(
        1, min=1, help="With --engine vllm: engines, one process each, on GPUs r*TP..(r+1)*TP-1."
    ),
]
MaxModelLen = Annotated[
    int | None,
    option(
        None,
        min=2,
        help="With --engine vllm: longest request (default: --max-length + 1, within the "
        "target's positions).",
    ),
]
GpuMemoryUtilization = Annotated[
    float | None,
    option(
        None, min=0.0, max=1.0, help="With --engine vllm: GPU memory fraction (default: vLLM's)."
    ),
]
EnforceEager = flag(
    "--enforce-eager",
    help="With --engine vllm: no torch.compile or CUDA graphs "
    "(starts in seconds; a capture is prefill only).",
)
AttentionBackend = Annotated[
    str | None,
    option(
        None,
        help="With --engine vllm: vLLM's attention backend "
        "(e.g. FLASH_ATTN, CPU_MLA; default: vLLM's choice).",
    ),
]


@app.command()
def capture(
    ctx: typer.Context,
    target: CaptureTarget,
    data: CaptureData,
    out: StoreOut,
    aux_layers: CaptureAuxLayers,
    dtype: StoreDtype,
    target_dtype: TargetDtype,
    max_length: MaxLength,
    shard_tokens: ShardTokens,
    batch_tokens: BatchTokens,
    no_chat: NoChat,
    template_kwargs: TemplateKwargs,
    chat_template: ChatTemplate,
    tokenizer: CaptureTokenizer,
    skip_bad: SkipBad,
    device: CaptureDevice,
    reasoning: CaptureReasoning,
    engine: CaptureEngineOption,
    tensor_parallel_size: TensorParallelSize,
    data_parallel_size: DataParallelSize,
    max_model_len: MaxModelLen,
    gpu_memory_utilization: GpuMemoryUtilization,
    enforce_eager: EnforceEager,
    attention_backend: AttentionBackend,
    threads: Threads,
) -> None:
    """Run the target over DATA and write a sharded hidden-state store to OUT."""
    from specdraft.capture.stage import CaptureConfig, capture_dataset
    from specdraft.capture.vllm import VllmOptions
    from specdraft.capture.write import interrupted_capture

    console = make_console()
    with user_errors(console, SKIP_BAD_HINT, interrupted=lambda: interrupted_capture(out)):
        cfg = config_of(
            CaptureConfig,
            ctx.params,
            ("out", "no_chat", "threads"),
            out_dir=out,
            chat=not no_chat,
            tokenizer=tokenizer or None,
            vllm=VllmOptions(**option_fields(VllmOptions, ctx.params)),
        )
        refuse_bad_configs("", target, ("model_type", "num_hidden_layers", "hidden_size"))
        set_threads(threads)
        result = capture_dataset(cfg, console=console)
    _render_capture(console, result)


def _render_capture(console, result) -> None:
    """What a finished `specdraft capture` prints: the store, its size, what an earlier run kept."""
    n, kept = result.num_shards, result.num_reused
    console.print(
        f"capture store at {result.path}: {result.num_samples} samples, {result.num_tokens} "
        f"tokens, {n} shard{'s' * (n != 1)}"
        + (f" ({kept} of {n} kept from an earlier run)" if kept else ""),
        style="green",
        markup=False,
    )


RegenData = Annotated[str, argument("DATA", "JSONL chats (or texts with --no-chat) to regenerate.")]
RegenOut = Annotated[str, argument("OUT", "Output JSONL (resumed if it exists).")]
LocalTarget = Annotated[
    str,
    option("", help="Local target model directory (transformers).", callback=check_model_dir),
]
Endpoint = Annotated[
    str,
    option("", help="OpenAI-compatible base URL, e.g. http://host:8000.", callback=url_option),
]
ServedModel = Annotated[str, option("", help="Served model name (with --endpoint).")]
Api = Annotated[EndpointApi, option("chat", help="Endpoint API.")]
RegenTokenizer = Annotated[str, option("", help="Target tokenizer dir (no-chat / completions).")]
ContinueText = flag("--no-chat", help="Continue plain text (base models).")
PromptTokens = Annotated[
    int, option(32, min=1, help="No-chat prompt = first N tokens of a document.")
]
Greedy = Annotated[float, option(0.0, min=0.0, help="0 = greedy.")]
AnswerTokens = Annotated[
    int, option(256, min=1, help="Longest answer / continuation the target writes per record.")
]
SamplingSeed = Annotated[int, option(0, help="Sampling seed (with --temperature > 0).")]
Concurrency = Annotated[int, option(8, min=1, help="Requests in flight (endpoint).")]
BatchSize = Annotated[int, option(8, min=1, help="Prompts per generate call (local target).")]
MaxRetries = Annotated[int, option(5, min=0, help="Retries on 5xx / timeouts (endpoint).")]
LocalDevice = Annotated[
    str, option("cpu", help="Device for a local target.", callback=check_device)
]
RegenReasoning = Annotated[
    ReasoningMode,
    option(
        "keep",
        help="keep: write the target's reasoning with each "
        "answer; drop: ask for non-thinking answers (the template's "
        "switch) and write none.",
    ),
]


@app.command()
def regenerate(
    ctx: typer.Context,
    data: RegenData,
    out: RegenOut,
    target: LocalTarget,
    endpoint: Endpoint,
    model: ServedModel,
    api: Api,
    tokenizer: RegenTokenizer,
    no_chat: ContinueText,
    prompt_tokens: PromptTokens,
    temperature: Greedy,
    top_p: TopP,
    max_new_tokens: AnswerTokens,
    seed: SamplingSeed,
    template_kwargs: TemplateKwargs,
    chat_template: ChatTemplate,
    concurrency: Concurrency,
    batch_size: BatchSize,
    max_retries: MaxRetries,
    skip_bad: SkipBad,
    device: LocalDevice,
    reasoning: RegenReasoning,
    threads: Threads,
) -> None:
    """Replace the answers in DATA with the target's own outputs, written to OUT."""
    from specdraft.regenerate.backends import Sampling
    from specdraft.regenerate.output import check_out_path, interrupted_regenerate
    from specdraft.regenerate.run import RegenConfig, regenerate_file

    console = make_console()
    with user_errors(console, SKIP_BAD_HINT, interrupted=lambda: interrupted_regenerate(out)):
        check_out_path(out, data)  # before asking the endpoint for its model
        refuse_bad_configs("", target, ("model_type",))
        model = model or (_served_model(console, endpoint) if endpoint and not target else "")
        cfg = config_of(
            RegenConfig,
            ctx.params,
            ("no_chat", "threads"),
            target=target or None,
            endpoint=endpoint or None,
            model=model,
            tokenizer=tokenizer or None,
            chat=not no_chat,
            sampling=Sampling(**option_fields(Sampling, ctx.params)),
            api_key=api_key(),
        )
        set_threads(threads)
        result = regenerate_file(cfg, console=console)
    _render_regenerate(console, result)


def api_key() -> str | None:
    """The endpoint's API key: OPENAI_API_KEY, as the OpenAI clients read it (None when unset)."""
    return os.environ.get("OPENAI_API_KEY")


def _served_model(console, endpoint: str) -> str:
    """regenerate --endpoint without --model: the one model the endpoint serves, said in a line."""
    from specdraft.regenerate.backends import served_model

    model = served_model(endpoint, api_key())
    console.print(
        f"--model not given: using {model}, the one model {endpoint} serves",
        markup=False,
        soft_wrap=True,
    )
    return model


def _render_regenerate(console, result) -> None:
    """What a finished `specdraft regenerate` prints: records written, kept and left out."""
    empty = (
        f", {result.num_empty} left out (the target's answer was empty)" if result.num_empty else ""
    )
    console.print(
        f"{result.path}: {result.num_done} records written, {result.num_kept} kept "
        f"from an earlier run{empty}",
        markup=False,
        soft_wrap=True,
    )
