"""The `specdraft` command line: thin typer commands over the library.

Each command builds a config, calls one library function and renders the result with rich.
"""

from __future__ import annotations

import json
from typing import Literal

import typer

# rich_markup_mode=None: click's plain help and usage errors, which wrap whole words at the terminal's width
# (typer's boxed panels cut words at 80 columns)
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

# Options with a fixed set of values: click refuses any other value (exit 2, the choices listed) and
# --help shows them. Each mirrors the library's own table (tests/test_cli_choices.py keeps them equal),
# written out here so that importing the CLI stays free of torch.
DtypeName = Literal["bf16", "fp16", "fp32", "bfloat16", "float16", "float32"]  # capture.DTYPES
EngineDtype = Literal["fp32", "bf16", "fp16"]  # _torch_dtype
Precision = Literal["fp32", "bf16"]  # train.loop.PRECISIONS
Layout = Literal["sglang", "speculators", "specdraft"]  # checkpoint.LAYOUTS
ExportEngine = Literal["sglang", "vllm", "speculators"]  # export.EXPORT_ENGINES
DoctorEngine = Literal["sglang", "vllm"]  # doctor.evidence.DOCTOR_ENGINES
EndpointApi = Literal["chat", "completions"]  # regenerate.EndpointBackend


def _check_device(value: str) -> str:
    """--device: a torch device this install can use (one line instead of a traceback)."""
    import torch

    try:
        device = torch.device(value)
    except RuntimeError as e:
        raise typer.BadParameter(f"{value!r} is not a torch device (use cpu or cuda[:N])") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter(f"{value!r}: this torch build ({torch.__version__}) sees no CUDA GPU; "
                                 "use --device cpu or install a CUDA build of torch")
    return value


def _check_model_dir(value: str, param: typer.CallbackParam = None) -> str:
    """--target: empty (not given) or a directory holding config.json, and no drafter. A file
    (e.g. DIR/config.json) or a `~` the shell left unexpanded (`--target=~/m`) is named as such."""
    from pathlib import Path

    path = Path(value)
    if value and not (path / "config.json").is_file():
        if not path.expanduser().exists():
            raise typer.BadParameter(f"{value}: no such directory; pass a transformers model directory")
        if path.is_file():
            raise typer.BadParameter(f"{value} is a file; pass the model directory that holds it ({path.parent})")
        if (path.expanduser() / "config.json").is_file():
            raise typer.BadParameter(f"{value}: ~ was not expanded (a shell leaves it as is after '='); pass "
                                     f"{path.expanduser()}")
        _refuse_wrong_kind(value, "target", param)  # a capture store: named as one
        raise typer.BadParameter(f"{value}: no config.json here; pass a transformers model directory")
    if value:
        _refuse_wrong_kind(value, "target", param)
    return value


def _refuse_wrong_kind(value: str, want: str, param) -> None:
    """A drafter given as target or a target as drafter: `checkpoint.wrong_dir_message`, exit 1."""
    from rich.console import Console

    from specdraft.checkpoint import wrong_dir_message

    given_as = param.opts[0] if param is not None and param.param_type_name == "option" else ""
    message = wrong_dir_message(value, want, given_as)
    if message:
        _error(Console(), ValueError(message))
        raise typer.Exit(1)


def _check_checkpoint_dir(value: str, param: typer.CallbackParam = None) -> str:
    """CKPT: an existing directory (a file path, e.g. its model.safetensors, names the directory),
    not a target model's."""
    from pathlib import Path

    if not value:  # an optional --draft left out
        return value
    path = Path(value)
    if path.is_file():
        raise typer.BadParameter(f"{value} is a file; pass the checkpoint directory that holds config.json "
                                 f"and model.safetensors (here: {path.parent}), not the file")
    if not path.is_dir():
        raise typer.BadParameter(f"{value}: no such directory; pass a draft checkpoint directory "
                                 "(config.json and model.safetensors)")
    _refuse_wrong_kind(value, "drafter", param)
    return value


def _error(console, e: Exception, skip_bad_hint: str = "") -> None:
    """Print `error: ...`; for one bad data record (data.BadRecord) add `skip_bad_hint`, how
    this command skips such records (commands without --skip-bad give none or another way)."""
    from specdraft.data import BadRecord

    hint = skip_bad_hint if isinstance(e, BadRecord) else ""
    console.print(f"error: {e}{hint}", style="red", markup=False, soft_wrap=True)


def _flag(name: str, help: str, **kwargs):
    """A boolean option off by default and set by `name` alone; its help shows no value type
    (typer would show `--name <bool>`, as if it took a value). kwargs: more typer.Option settings."""
    return typer.Option(False, name, help=help, metavar="", **kwargs)


def _argument(metavar: str, help: str, **kwargs):
    """A required positional argument named `metavar` (upper case, as the commands' docstrings name
    it) in usage lines, help and errors: typer 0.27+ shows the parameter's own lower-case name
    (`{checkpoint}`) otherwise. kwargs: more typer.Argument settings (a callback)."""
    return typer.Argument(..., metavar=metavar, help=help, **kwargs)


SKIP_BAD_HINT = " (or pass --skip-bad to skip and count bad records)"
NUM_DRAFT_TOKENS_HELP = ("Verified nodes incl. the root (0 = num_steps + 1 for a chain; a tree, --topk > 1, "
                         "needs a value).")
TOPK_HELP = "Draft tree: children per node (SGLang --speculative-eagle-topk)"
NUM_STEPS_HELP = "Draft depth (SGLang --speculative-num-steps)"
MAX_PORT = 65535


def _check_url(value: str) -> str:
    """--url / --baseline-url / --endpoint: a URL whose port, when given, is 1..65535 (a usage error
    instead of a traceback for an unparsable port, or a connection error for port 99999)."""
    if not value:
        return value
    import httpx

    try:
        port = httpx.URL(value).port
    except httpx.InvalidURL as e:
        hint = f"; give a port in 1..{MAX_PORT}, e.g. http://127.0.0.1:8000" if "port" in str(e) else ""
        raise typer.BadParameter(f"{value!r}: {e}{hint}") from None
    if port is not None and not 1 <= port <= MAX_PORT:
        raise typer.BadParameter(f"{value!r}: port {port} is not in 1..{MAX_PORT}")
    return value


def _same_server(a: str, b: str) -> bool:
    """Whether two URLs (passed `_check_url`) name one server: scheme and host in any case, a
    default port written or not, a trailing slash or /v1 or not (`bench.base_url`), any loopback
    name (`LOCAL_HOSTS`) for this machine."""
    import httpx

    from specdraft.bench import base_url

    def key(url: str) -> tuple:
        u = httpx.URL(base_url(url))  # lower-cases scheme and host, drops a default port
        return u.scheme, "loopback" if u.host in LOCAL_HOSTS else u.host, u.port, u.path.rstrip("/")

    return key(a) == key(b)


def _check_top_p(value: float) -> float:
    """--top-p: nucleus mass in (0, 1] (SamplingParams' rule), a usage error before anything loads
    (typer's min / max cannot leave 0 out)."""
    if not 0 < value <= 1:
        raise typer.BadParameter(f"{value}: must be in (0, 1] (1 = off)")
    return value


LIST_EXAMPLES = {"aux_layers": "2,16,29", "topks": "1,2,4"}  # per option; others: bench --concurrency's


def _list_example(param) -> str:
    return LIST_EXAMPLES.get(getattr(param, "name", None), "1,4,16")


def _int_list(value: str, param: typer.CallbackParam = None) -> tuple[int, ...]:
    """A comma-separated integer option ("1,4,16") as the tuple the command receives; "" = ()."""
    numbers = []
    for item in value.split(",") if value.strip() else []:
        try:
            numbers.append(int(item))
        except ValueError:
            raise typer.BadParameter(f"{value!r}: {item.strip()!r} is not an integer; give comma-separated "
                                     f"integers, e.g. {_list_example(param)}") from None
    return tuple(numbers)


def _positive_int_list(value: str, param: typer.CallbackParam = None) -> tuple[int, ...]:
    """`_int_list` of at least one integer, each >= 1 (bench --concurrency, tune --topks)."""
    numbers = _int_list(value, param)
    if not numbers or min(numbers) < 1:
        raise typer.BadParameter(f"{value!r}: give comma-separated integers >= 1, e.g. {_list_example(param)}")
    return numbers


def _aux_layer_list(value: str | None, param: typer.CallbackParam = None) -> tuple[int, ...] | None:
    """capture / train --aux-layers: None when left out (the default layers); given empty, a usage error."""
    if value is None:
        return None
    if not value.strip():
        raise typer.BadParameter(f"{value!r} is empty; leave --aux-layers out for the default layers "
                                 f"([2, L//2, L-3] for an L-layer target), or give three layers, e.g. "
                                 f"{_list_example(param)}")
    return _int_list(value, param)


def _print_version(value: bool) -> None:
    """--version: print specdraft's version as `specdraft version` does, then exit 0 (an eager
    option: before any command runs)."""
    if value:
        version()
        raise typer.Exit()


@app.callback()
def main(ctx: typer.Context,
         _version: bool = _flag("--version", "Print specdraft's version and exit.", callback=_print_version,
                                is_eager=True)) -> None:
    """Train, export, verify and serve EAGLE-3 speculative-decoding drafters."""
    from transformers.utils import logging as hf_logging

    # transformers' tqdm bars ("Loading weights", ...) would break into the commands' own output;
    # the setting comes back when the command ends (CliRunner, `app` called from Python)
    if hf_logging.is_progress_bar_enabled():
        hf_logging.disable_progress_bar()
        ctx.call_on_close(hf_logging.enable_progress_bar)


@app.command()
def version() -> None:
    """Print specdraft's version."""
    from specdraft import __version__

    typer.echo(__version__)


def _json_kwargs(text: str, option: str) -> dict:
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
    target: str = _argument("TARGET", "Target model directory (transformers).", callback=_check_model_dir),
    data: str = _argument("DATA", "JSONL chats/texts, save_to_disk dir or text file."),
    out: str = _argument("OUT", "Output store directory (resumed if it exists)."),
    aux_layers: str | None = typer.Option(None, help="Specdraft indices, e.g. '2,3,4' (default: "
                                          "[2, L//2, L-3] for an L-layer target).", callback=_aux_layer_list),
    dtype: DtypeName = typer.Option("bf16", help="Storage dtype of hidden states."),
    target_dtype: DtypeName = typer.Option("fp32", help="Dtype the target runs in."),
    max_length: int = typer.Option(2048, min=1, help="Truncate samples to this many tokens."),
    shard_tokens: int = typer.Option(65536, min=1, help="Tokens per shard (bounds memory)."),
    batch_tokens: int = typer.Option(16384, min=1, help="Padded tokens per target forward."),
    no_chat: bool = _flag("--no-chat", help="Plain text (base models)."),
    template_kwargs: str = typer.Option("{}", help="JSON kwargs for the chat template."),
    tokenizer: str = typer.Option("", help="Tokenizer directory (default: the target's)."),
    skip_bad: bool = _flag("--skip-bad", help="Skip and count bad records."),
    device: str = typer.Option("cpu", help="Device for the target.", callback=_check_device),
) -> None:
    """Run the target over DATA and write a sharded hidden-state store to OUT."""
    from rich.console import Console

    from specdraft.capture import CaptureConfig, capture_dataset, interrupted_capture

    console = Console()
    cfg = CaptureConfig(
        target, data, out,
        aux_layers=aux_layers,
        dtype=dtype, target_dtype=target_dtype, max_length=max_length,
        shard_tokens=shard_tokens, batch_tokens=batch_tokens, chat=not no_chat,
        template_kwargs=_json_kwargs(template_kwargs, "--template-kwargs"), skip_bad=skip_bad,
        tokenizer=tokenizer or None, device=device)
    try:
        _refuse_bad_configs("", target, ("model_type", "num_hidden_layers", "hidden_size"))
        result = capture_dataset(cfg, console=console)
    except KeyboardInterrupt:
        console.print(f"interrupted; {interrupted_capture(out)}", markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except (ValueError, FileNotFoundError) as e:
        _error(console, e, SKIP_BAD_HINT)
        raise typer.Exit(1) from e
    console.print(f"capture store at {result.path}: {result.num_samples} samples, {result.num_tokens} "
                  f"tokens, {result.num_shards} shards ({result.num_reused} kept from an earlier "
                  f"run)", style="green", markup=False)


@app.command()
def regenerate(
    data: str = _argument("DATA", "JSONL chats (or texts with --no-chat) to regenerate."),
    out: str = _argument("OUT", "Output JSONL (resumed if it exists)."),
    target: str = typer.Option("", help="Local target model directory (transformers).", callback=_check_model_dir),
    endpoint: str = typer.Option("", help="OpenAI-compatible base URL, e.g. http://host:8000.", callback=_check_url),
    model: str = typer.Option("", help="Served model name (with --endpoint)."),
    api: EndpointApi = typer.Option("chat", help="Endpoint API."),
    tokenizer: str = typer.Option("", help="Target tokenizer dir (no-chat / completions)."),
    no_chat: bool = _flag("--no-chat", help="Continue plain text (base models)."),
    prompt_tokens: int = typer.Option(32, min=1, help="No-chat prompt = first N tokens of a document."),
    temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass, in (0, 1] (1 = off).", callback=_check_top_p),
    max_new_tokens: int = typer.Option(256, min=1),
    seed: int = typer.Option(0),
    template_kwargs: str = typer.Option("{}", help="JSON kwargs for the chat template."),
    concurrency: int = typer.Option(8, min=1, help="Requests in flight (endpoint)."),
    batch_size: int = typer.Option(8, min=1, help="Prompts per generate call (local target)."),
    max_retries: int = typer.Option(5, min=0, help="Retries on 5xx / timeouts (endpoint)."),
    skip_bad: bool = _flag("--skip-bad", help="Skip and count bad records."),
    device: str = typer.Option("cpu", help="Device for a local target.", callback=_check_device),
) -> None:
    """Replace the answers in DATA with the target's own outputs, written to OUT."""
    import os

    from rich.console import Console

    from specdraft.regenerate import (RegenConfig, Sampling, check_out_path, interrupted_regenerate,
                                        regenerate_file, served_model)

    console = Console()
    try:
        check_out_path(out, data)  # before asking the endpoint for its model
        _refuse_bad_configs("", target, ("model_type",))
        if endpoint and not target and not model:
            model = served_model(endpoint, os.environ.get("OPENAI_API_KEY"))
            console.print(f"--model not given: using {model}, the one model {endpoint} serves", markup=False,
                          soft_wrap=True)
        cfg = RegenConfig(
            data, out, target=target or None, endpoint=endpoint or None, model=model, api=api,
            tokenizer=tokenizer or None, chat=not no_chat, prompt_tokens=prompt_tokens,
            sampling=Sampling(temperature, top_p, max_new_tokens, seed),
            template_kwargs=_json_kwargs(template_kwargs, "--template-kwargs"),
            concurrency=concurrency, batch_size=batch_size, max_retries=max_retries,
            api_key=os.environ.get("OPENAI_API_KEY"), skip_bad=skip_bad, device=device)
        result = regenerate_file(cfg, console=console)
    except KeyboardInterrupt:
        console.print(f"interrupted; {interrupted_regenerate(out)}", markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except (ValueError, RuntimeError) as e:
        _error(console, e, SKIP_BAD_HINT)
        raise typer.Exit(1) from e
    console.print(f"{result.path}: {result.num_done} records written, {result.num_kept} kept "
                  f"from an earlier run, {result.num_empty} empty outputs", markup=False)


def _refuse_bad_configs(draft: str, target: str, target_keys: tuple[str, ...] | None = None) -> None:
    """ValueError naming the file, what is wrong and the fix when the drafter's or the target's
    config.json is unreadable, not JSON or no object (`doctor.evidence.given_config`, doctor's
    words), or the target's lacks one of `target_keys` (default: all `target.TARGET_REQUIRED_KEYS`).
    Either path may be empty (not given) or lack config.json (left to the loaders)."""
    from pathlib import Path

    from specdraft.checkpoint import DRAFTER_CONFIG_FIX
    from specdraft.doctor.evidence import given_config
    from specdraft.target import TARGET_CONFIG_FIX, TARGET_REQUIRED_KEYS, check_target_config

    if draft:
        given_config(Path(draft), DRAFTER_CONFIG_FIX)
    config = given_config(Path(target), TARGET_CONFIG_FIX) if target else None
    if config is not None:
        check_target_config(target, config, target_keys or TARGET_REQUIRED_KEYS)


def _num_layers_of_target(target: str | None) -> int | None:
    """Decoder-layer count of a local transformers target directory (None without one); a corrupt
    config.json or one without model_type / num_hidden_layers is a ValueError (`_refuse_bad_configs`)."""
    if not target:
        return None
    from transformers import AutoConfig

    _refuse_bad_configs("", target, ("model_type", "num_hidden_layers"))
    return AutoConfig.from_pretrained(target, local_files_only=True).get_text_config().num_hidden_layers


@app.command()
def inspect(
    checkpoint: str = _argument("CHECKPOINT", "Draft checkpoint directory (any layout).",
                                callback=_check_checkpoint_dir),
    target: str = typer.Option("", help="Target directory: needed to read aux ids without a manifest.", callback=_check_model_dir),
    manifest: bool = _flag("--manifest", help="Print the whole manifest as JSON (default: one line per field)."),
) -> None:
    """Show a drafter's layout, tensors, manifest and audit verdict (exit 1 on a failed audit)."""
    from rich.console import Console
    from rich.table import Table

    from specdraft.checkpoint import CheckpointError, audit, describe_layout, load_draft, state_dict_for_layout

    console = Console()
    try:
        _refuse_bad_configs(checkpoint, "")
        loaded = load_draft(checkpoint, target_num_layers=_num_layers_of_target(target))
    except (CheckpointError, ValueError) as e:
        console.print(f"error: {e}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    console.print(f"{checkpoint}: {describe_layout(loaded.layout, loaded.manifest is not None)}",
                  markup=False, soft_wrap=True)
    table = Table()
    for column in ("tensor", "shape", "dtype"):
        table.add_column(column)
    for name, tensor in state_dict_for_layout(loaded.model, loaded.layout).items():
        table.add_row(name, str(tuple(tensor.shape)), str(tensor.dtype).removeprefix("torch."))
    console.print(table)
    cfg = loaded.model.cfg
    console.print(f"aux layers (specdraft indices): {list(cfg.aux_layers)} of {cfg.target_num_layers}; "
                  f"hidden {cfg.hidden_size}, target hidden {cfg.target_hidden_size}; "
                  f"draft vocab {cfg.draft_vocab_size} of {cfg.vocab_size}", markup=False)
    if loaded.manifest is not None and manifest:
        console.print_json(loaded.manifest.to_json())
    elif loaded.manifest is not None:
        for line in _manifest_lines(json.loads(loaded.manifest.to_json())):
            console.print(line, markup=False, soft_wrap=True)
    problems = audit(loaded.model)
    for problem in problems:
        console.print(f"audit: FAIL {problem}", style="red", markup=False)
    if problems:
        raise typer.Exit(1)
    console.print("audit: PASS", style="green")


def _manifest_lines(fields: dict) -> list[str]:
    """`inspect`'s manifest summary: one line per field, objects by their keys, long values cut."""
    lines = ["manifest (--manifest prints it whole):"]
    for key, value in fields.items():
        text = (f"{len(value)} fields: {', '.join(value)}" if isinstance(value, dict) else json.dumps(value))
        lines.append(f"  {key}: {text if len(text) <= 90 else text[:87] + '...'}")
    return lines


@app.command()
def convert(
    src: str = _argument("SRC", "Draft checkpoint directory (layout detected).",
                         callback=_check_checkpoint_dir),
    dst: str = _argument("DST", "Output directory."),
    layout: Layout = typer.Option(..., help="sglang (official EAGLE-3: config.json + model.safetensors, no "
                                  "specdraft manifest) | speculators (vLLM's; keeps the manifest) | specdraft "
                                  "(the sglang files + specdraft's manifest)"),
    target: str = typer.Option("", help="Target directory: needed to read aux ids without a manifest.", callback=_check_model_dir),
) -> None:
    """Rewrite a drafter in another layout, losslessly (every tensor checked bit-identical)."""
    from pathlib import Path

    from rich.console import Console

    from specdraft.checkpoint import MANIFEST_FILE, CheckpointError, convert_draft, describe_layout, detect_layout

    console = Console()
    try:
        _refuse_bad_configs(src, "")
        written = convert_draft(src, dst, layout=layout, target_num_layers=_num_layers_of_target(target))
    except (CheckpointError, ValueError) as e:
        console.print(f"error: {e}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    on_disk = describe_layout(detect_layout(Path(dst)), (Path(dst) / MANIFEST_FILE).is_file())  # as inspect says
    console.print(f"wrote {dst} ({on_disk}): {written} tensors, each bit-identical to {src}", markup=False)
    if layout == "sglang" and (Path(src) / MANIFEST_FILE).is_file():
        console.print(f"{src}'s manifest is left out of the official layout (--layout specdraft keeps it); "
                      "reading it back needs the target (--target DIR)", markup=False, soft_wrap=True)


def _check_drafter(value: str, param: typer.CallbackParam = None) -> str:
    """--draft of generate / serve / tune: a drafter directory (`_check_checkpoint_dir`) or a
    training checkpoint (RUN/checkpoints/step-N.pt, or a sharded step-N directory) that
    `load_engine` reads the drafter and its manifest from."""
    if value:
        from pathlib import Path

        from specdraft.train.loop import is_training_checkpoint

        if is_training_checkpoint(value):
            return value
        if not Path(value).exists():
            from specdraft.export import SOURCE_FORMS

            raise typer.BadParameter(f"{value}: no such file or directory; pass {SOURCE_FORMS}")
    return _check_checkpoint_dir(value, param)


DRAFTER_HELP = "Draft checkpoint directory, or a training checkpoint (RUN/checkpoints/step-N.pt)"
COMPILE_HELP = ("CUDA: compiled target layers replayed as CUDA graphs, decode / verify through Triton kernels "
                "with bf16 / fp16 (a warm-up generation compiles first, a minute or more on large targets).")
THREADS_HELP = ("CPU threads torch uses (torch.set_num_threads, set before loading; default: torch's, all "
                "cores). Pin it on a busy or shared machine, e.g. --threads 4: decoding slows down sharply "
                "when its threads compete for cores.")
WARM_UP_TOKENS = 16  # the --compile warm-up: enough steps to compile and capture decode and verify
WARM_UP_PROMPT = "Hello"  # serve's warm-up prompt (generate warms up on the user's prompt)


def _refuse_compile_off_cuda(compile: bool, device: str) -> None:
    """--compile replays CUDA graphs: ValueError naming the fix on a non-CUDA --device (call it
    before any model loads)."""
    if compile and not device.startswith("cuda"):
        raise ValueError(f"--compile needs a CUDA device (CUDA graphs), not --device {device}: "
                         f"pass --device cuda, or drop --compile")


def _warm_up_compiled(engine, prompt_ids: list[int], max_new_tokens: int, console, **sampling) -> None:
    """--compile: one short generation that compiles the target layers and captures the CUDA
    graphs, timed in one line, so what runs next (generate's metrics, serve's requests) is the
    engine's time, not the compiler's. `sampling`: `SpeculativeEngine.generate` keywords."""
    import time

    started = time.perf_counter()
    engine.generate(prompt_ids, max_new_tokens, **sampling)
    console.print(f"compiled and captured CUDA graphs in {time.perf_counter() - started:.1f} s "
                  f"(a warm-up generation, not in the metrics)", markup=False)


def _set_threads(threads: int | None) -> None:
    """--threads N (N >= 1, the option's range): torch.set_num_threads(N) (call it before any model
    loads); None keeps torch's default (all cores)."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)


def _refuse_unused_drafting_flags(no_spec: bool, draft: str, given: dict) -> None:
    """ValueError when drafting flags are given explicitly (`given`: flag -> value, None when left
    out) but would be ignored: with --no-spec, or without --draft."""
    named = ", ".join(name for name, value in given.items() if value is not None)
    if named and no_spec:
        raise ValueError(f"{named}: drafting settings, but --no-spec decodes plainly (they would be "
                         f"ignored): drop {named}, or drop --no-spec")
    if named and not draft:
        raise ValueError(f"{named}: drafting settings, but no --draft is given (plain decoding): "
                         f"add --draft CKPT, or drop {named}")


@app.command()
def generate(
    target: str = typer.Option(..., help="Target directory (transformers, with its tokenizer).", callback=_check_model_dir),
    prompt: str = typer.Option(..., help="Prompt text (tokenized as is, no chat template)."),
    draft: str = typer.Option("", help=DRAFTER_HELP + " (omit for plain decoding).", callback=_check_drafter),
    temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy (output = the target's greedy output)."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass, in (0, 1] (1 = off).", callback=_check_top_p),
    sampling_top_k: int = typer.Option(0, min=0, help="Sample from the k most likely tokens (0 = off)."),
    topk: int | None = typer.Option(None, min=1, help=TOPK_HELP + "; default 1; used only with --draft."),
    num_steps: int | None = typer.Option(None, min=1, help=NUM_STEPS_HELP + "; default 3; used only with --draft."),
    num_draft_tokens: int | None = typer.Option(None, min=0, help=NUM_DRAFT_TOKENS_HELP + " Used only with --draft."),
    max_new_tokens: int = typer.Option(128, min=1),
    no_spec: bool = _flag("--no-spec", help="Plain decoding on the same engine, even with --draft."),
    ignore_eos: bool = _flag("--ignore-eos", help="Do not stop at the tokenizer's EOS."),
    seed: int = typer.Option(0, help="Sampling seed."),
    max_seq_len: int = typer.Option(0, min=0, help="Cache size (0 = min(max positions, 4096))."),
    device: str = typer.Option("cpu", callback=_check_device),
    dtype: EngineDtype = typer.Option("fp32", help="Dtype the target and drafter run in."),
    compile: bool = _flag("--compile", help=COMPILE_HELP),
    threads: int | None = typer.Option(None, min=1, help=THREADS_HELP),
) -> None:
    """Generate with specdraft's engine, streaming text, then metrics: speculative decoding with
    --draft, plain decoding without it (or with --no-spec)."""
    from rich.console import Console
    from transformers import AutoTokenizer

    from specdraft.checkpoint import CheckpointError
    from specdraft.engine.metrics import metrics_table
    from specdraft.engine.speculate import decode_continuation, load_engine
    from specdraft.machine_load import busy_note

    console = Console()
    remedy = "fewer threads (e.g. --threads 1) compete less" if threads != 1 else ""
    busy = busy_note("the tokens/s above", remedy) if device == "cpu" else None
    try:
        _refuse_compile_off_cuda(compile, device)
        _refuse_unused_drafting_flags(no_spec, draft, {"--topk": topk, "--num-steps": num_steps,
                                                       "--num-draft-tokens": num_draft_tokens})
        topk, num_steps = 1 if topk is None else topk, 3 if num_steps is None else num_steps
        spec = _spec_from_flags(no_spec or not draft, draft, num_steps, topk, num_draft_tokens or 0)
        torch_dtype = _torch_dtype(dtype)
        _set_threads(threads)
        _refuse_bad_configs(draft if spec is not None else "", target)
        tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
        engine = load_engine(target, draft if spec is not None else None, spec, device, torch_dtype,
                             max_seq_len or None, tokenizer, compile=compile)
        for note in engine.notes:
            console.print(f"note: {note}", markup=False, soft_wrap=True)
        ids = tokenizer(prompt)["input_ids"]
        eos = () if ignore_eos or tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
        if compile:  # compile and capture first: the metrics below are then the engine's, not the compiler's
            _warm_up_compiled(engine, ids, min(max_new_tokens, WARM_UP_TOKENS), console, temperature=temperature,
                              top_p=top_p, top_k=sampling_top_k, seed=seed)
        output: list[int] = []
        shown = 0

        def stream(new_ids: list[int]) -> None:  # print the text the new ids add
            nonlocal shown
            output.extend(new_ids)
            text = decode_continuation(tokenizer, ids, output)
            console.print(text[shown:], end="", markup=False, highlight=False, soft_wrap=True)
            shown = len(text)

        console.print(prompt, end="", style="dim", markup=False, highlight=False, soft_wrap=True)  # continued below
        result = engine.generate(ids, max_new_tokens, temperature, top_p, sampling_top_k, eos_ids=eos,
                                 seed=seed, on_tokens=stream)
    except (ValueError, FileNotFoundError, OSError, CheckpointError) as e:
        console.print(f"error: {e}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    console.print()
    console.print(metrics_table(result.metrics, (f"speculative decoding (steps {num_steps}, topk {topk}, "
                                                 f"draft tokens {spec.num_draft_tokens})") if spec is not None
                                else "plain decoding" + ("" if no_spec else " (no --draft)")))
    if compile:
        drafter = f"; drafter steps: {engine.draft_kernels}" if spec is not None else ""
        console.print(f"target forwards of up to 16 tokens: {engine.target_kernels} kernels{drafter}", markup=False)
    if busy:
        console.print(busy, style="yellow", markup=False, soft_wrap=True)


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
    source: str = _argument("SOURCE", "Capture store directory (`specdraft capture`); with --online, "
                            "JSONL chats/texts, save_to_disk dir or text file."),
    out: str = _argument("OUT", "Run directory: checkpoints/, metrics.jsonl, tensorboard/, draft/."),
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
                               "the store's recorded path moved.", callback=_check_model_dir),
    online: bool = _flag("--online", help="Run --target on SOURCE's records at every step "
                         "(no capture store)."),
    aux_layers: str | None = typer.Option(None, help="Specdraft indices, e.g. '2,3,4' (online default: "
                                          "[2, L//2, L-3] for an L-layer target; a store's must match).",
                                          callback=_aux_layer_list),
    no_chat: bool = _flag("--no-chat", help="With --online: plain text (base models)."),
    template_kwargs: str = typer.Option("{}", help="With --online: JSON kwargs for the chat template."),
    target_dtype: DtypeName | None = typer.Option(None, help="With --online: dtype the target runs in "
                                                  "(default: float32)."),
    skip_bad: bool = _flag("--skip-bad", help="With --online: skip and count bad records."),
    warmup_steps: int | None = typer.Option(None, min=0, help="Linear learning-rate warm-up steps (100)."),
    save_every: int | None = typer.Option(None, min=1, help="Checkpoint every N steps (500) and at the end, "
                                           "under OUT/checkpoints; the newest 2 are kept (--config key "
                                           "keep_checkpoints)."),
    resume: bool = _flag("--resume", help="Continue from OUT's newest checkpoint with its "
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

    from specdraft.train.loop import TrainConfig, TrainingError, check_run_dir, checkpoint_paths, resume_config
    from specdraft.train.loop import train as run_training

    console = Console()
    kwargs = _json_kwargs(template_kwargs, "--template-kwargs")
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
        _error(console, e, SKIP_BAD_HINT)
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


@app.command()
def export(
    checkpoint: str = _argument("CHECKPOINT", "Drafter directory (e.g. RUN/draft), or a training checkpoint "
                                "of --save-every (RUN/checkpoints/step-N.pt)."),
    out: str = _argument("OUT", "Output directory (replaced atomically)."),
    engine: ExportEngine = typer.Option(..., help="Engine to export for."),
    target: str = typer.Option("", help="Target directory (default: the manifest's record).", callback=_check_model_dir),
    verifier: str = typer.Option("", help="speculators verifier.name_or_path (must resolve where "
                                 "the server runs; default: the target's absolute path)."),
    sglang_version: str = typer.Option("", help="Pin SGLang's reading of explicit aux ids, e.g. 0.5.14."),
    num_steps: int = typer.Option(3, min=1, help=NUM_STEPS_HELP + " in the launch command (vLLM: "
                                  "num_speculative_tokens)."),
    topk: int = typer.Option(1, min=1, help=TOPK_HELP + "; 1 = a chain, the only shape vLLM runs."),
    num_draft_tokens: int = typer.Option(0, min=0, help=NUM_DRAFT_TOKENS_HELP),
    dtype: DtypeName | None = typer.Option(None, help="Cast floating tensors (default: keep)."),
) -> None:
    """Write CHECKPOINT for one engine, prove every tensor bit-identical, print the launch command."""
    from rich.console import Console

    from specdraft.checkpoint import CheckpointError
    from specdraft.export import export_draft

    console = Console()
    try:
        result = export_draft(checkpoint, out, engine=engine, target=target or None,
                              verifier=verifier or None, sglang_version=sglang_version or None,
                              num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens or None,
                              dtype=dtype or None)
    except (CheckpointError, ValueError, FileNotFoundError) as e:
        console.print(f"error: {e}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    console.print(f"wrote {result.out_dir} for {engine}: {result.num_tensors} tensors, each "
                  f"bit-identical to the checkpoint{' cast to ' + dtype if dtype else ''}",
                  style="green", markup=False)
    for note in result.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    console.print("launch:", markup=False)
    console.print(result.launch_command, markup=False, soft_wrap=True, highlight=False)


@app.command()
def doctor(
    checkpoint: str = _argument("CHECKPOINT", "Draft checkpoint directory (any layout).",
                                callback=_check_checkpoint_dir),
    target: str = typer.Option("", help="Target directory: capture parity, acceptance, tokenizer.", callback=_check_model_dir),
    engine: DoctorEngine | None = typer.Option(None, help="Engine to check for (default: from --engine-args, "
                                                    "else all)."),
    engine_args: str = typer.Option("", help="The engine's launch command line, quoted."),
    samples: str = typer.Option("", help="Capture store or JSONL (token ids, chats or texts)."),
    skip_bad: bool = _flag("--skip-bad", help="Skip bad --samples records instead of refusing the file."),
    wait: float = typer.Option(120.0, min=0, help="Seconds to wait for a --server that refuses connections (still "
                               "starting) before the online check fails; 0: try once."),
    server: str = typer.Option("", help="Live server URL, e.g. http://127.0.0.1:8000 or .../v1 (online "
                               "acceptance; needs --samples: prompts with the target's own outputs, e.g. the "
                               "demo's store-heldout)."),
    sglang_version: str = typer.Option("", help="Pin SGLang's reading of explicit aux ids."),
    template_kwargs: str = typer.Option("", help="The server's chat template kwargs (JSON)."),
    max_samples: int = typer.Option(32, min=1, help="Samples for the offline run."),
    json_output: bool = _flag("--json", help="Print the report as JSON."),
) -> None:
    """Check a drafter against its training record, target and deployment (exit 1 on a fail or on a
    target and drafter directory given in each other's place, 2 on other unusable inputs: a
    CHECKPOINT without a drafter config, a CHECKPOINT or --target config.json that is not valid
    JSON, a --samples file that cannot be read)."""
    from rich.console import Console

    from specdraft.doctor import report_json, report_table, run_doctor

    console = Console()
    try:
        if server:
            from specdraft.bench import check_url

            check_url(server, "--server")
            if not samples:
                raise ValueError(f"--server {server} needs --samples: pass --samples FILE with the target's own "
                                 "outputs (a capture store or JSONL, e.g. the demo's store-heldout) for the online "
                                 "acceptance check")
        report = run_doctor(
            checkpoint, target=target or None, engine=engine or None,
            engine_args=engine_args or None, samples=samples or None, server=server or None,
            sglang_version=sglang_version or None, max_samples=max_samples, skip_bad=skip_bad, server_wait_s=wait,
            template_kwargs=_json_kwargs(template_kwargs, "--template-kwargs") if template_kwargs else None)
    except ValueError as e:
        _error(console, e, SKIP_BAD_HINT)
        raise typer.Exit(2) from e
    if json_output:
        typer.echo(report_json(report))
    else:
        console.print(report_table(report, f"specdraft doctor {checkpoint}"))
        for note in report.notes:
            console.print(f"note: {note}", markup=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def demo(
    out: str = typer.Option("specdraft-demo", help="Working directory; a re-run resumes from it."),
    device: str = typer.Option("cpu", help="cpu | cuda", callback=_check_device),
    target: str = typer.Option("", help="A local transformers model (default: the bundled stories260K).", callback=_check_model_dir),
    data: str = typer.Option("", help="Text file of documents separated by blank lines, or JSONL with a "
                             "\"text\" field per line (default: the TinyStories sample)."),
    train_steps: int = typer.Option(1000, help="Drafter optimizer steps."),
    num_train: int = typer.Option(800, help="Training documents."),
) -> None:
    """Run the whole pipeline on a real target and write report.md with plots. Stages, in the order
    they run and print: target, data, regenerate, capture, train, speculative generation vs plain
    decoding (picks the setting), export, doctor; then the generation table and where files are."""
    from pathlib import Path

    from rich.console import Console

    from specdraft.checkpoint import CheckpointError
    from specdraft.demo import DemoConfig, run_demo, summary
    from specdraft.machine_load import busy_note
    from specdraft.regenerate import RegenerationError
    from specdraft.train.loop import TrainingError

    console = Console()
    busy = busy_note("the tokens/s and speedups above") if device == "cpu" else None
    try:  # inputs are checked before any stage runs; a later stage's error is one line too
        cfg = DemoConfig(out=Path(out), device=device, target=Path(target) if target else None,
                         data=Path(data) if data else None, train_steps=train_steps, num_train=num_train)
        report = run_demo(cfg, console)
    except KeyboardInterrupt:
        console.print(f"interrupted; run the same command again to resume from {out}", markup=False)
        raise typer.Exit(130) from None
    except (ValueError, OSError, CheckpointError, TrainingError, RegenerationError) as e:
        _error(console, e)
        raise typer.Exit(1) from e
    console.print(summary(report, Path(out)), markup=False, highlight=False, soft_wrap=True)
    if busy:
        console.print(busy, style="yellow", markup=False, soft_wrap=True)


def _spec_from_flags(no_spec: bool, draft: str, num_steps: int, topk: int, num_draft_tokens: int):
    """The SpecConfig of the speculative flags (None with --no-spec); ValueError names the rule."""
    from specdraft.engine.spec_config import SpecConfig

    if no_spec:
        return None
    if not draft:
        raise ValueError("--draft CKPT is required for speculative decoding (or pass --no-spec)")
    if topk > 1 and not num_draft_tokens:
        most = 1 + topk + (num_steps - 1) * topk ** 2  # SpecConfig.max_draft_tokens
        raise ValueError(f"--topk {topk} drafts a tree, which needs --num-draft-tokens (nodes verified per "
                         f"step incl. the root: 2..{most} with --num-steps {num_steps}), e.g. "
                         f"--num-draft-tokens {min(most, num_steps * topk + 1)}; or --topk 1 for a chain")
    return SpecConfig(num_steps, topk, num_draft_tokens or num_steps + 1)


def _torch_dtype(name: EngineDtype):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _check_port_free(host: str, port: int) -> None:
    """ValueError naming the fix when host:port cannot be bound (in use, or not an address here)."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port} ({e.strerror or e}): pass another --port, or stop "
                         f"the process using it") from None


@app.command()
def serve(
    target: str = typer.Option(..., help="Target directory (transformers, with its tokenizer).", callback=_check_model_dir),
    draft: str = typer.Option("", help=DRAFTER_HELP + " (omit with --no-spec).", callback=_check_drafter),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)."),
    port: int = typer.Option(8000, min=1, max=MAX_PORT),
    topk: int | None = typer.Option(None, min=1, help=TOPK_HELP + "; default 1."),
    num_steps: int | None = typer.Option(None, min=1, help=NUM_STEPS_HELP + "; default 3."),
    num_draft_tokens: int | None = typer.Option(None, min=0, help=NUM_DRAFT_TOKENS_HELP),
    no_spec: bool = _flag("--no-spec", help="Plain decoding on the same engine (a baseline; "
                          "refuses the drafting flags)."),
    max_queue: int = typer.Option(64, min=1, help="Requests waiting besides the running one (429 beyond)."),
    log_every: int = typer.Option(100, min=0, help="Log accept length and tokens/s every N verification steps "
                                  "(0 = off)."),
    model_name: str = typer.Option("", help="Served model name (default: the target directory's name)."),
    max_seq_len: int = typer.Option(0, min=0, help="Cache size (0 = min(max positions, 4096))."),
    device: str = typer.Option("cpu", callback=_check_device),
    dtype: EngineDtype = typer.Option("fp32", help="Dtype the target and drafter run in."),
    compile: bool = _flag("--compile", help=COMPILE_HELP),
    threads: int | None = typer.Option(None, min=1, help=THREADS_HELP),
) -> None:
    """Serve specdraft's engine over an OpenAI-compatible API (one sequence at a time)."""
    from rich.console import Console

    from specdraft.checkpoint import CheckpointError
    from specdraft.serve import build_app, serve as run_server

    console = Console()
    try:
        _refuse_compile_off_cuda(compile, device)
        _refuse_unused_drafting_flags(no_spec, draft, {"--topk": topk, "--num-steps": num_steps,
                                                       "--num-draft-tokens": num_draft_tokens})
        spec = _spec_from_flags(no_spec, draft, 3 if num_steps is None else num_steps, 1 if topk is None else topk,
                                num_draft_tokens or 0)
        _check_port_free(host, port)  # before the model loads
        _set_threads(threads)
        server_app = build_app(target, draft or None, spec, device, _torch_dtype(dtype), max_seq_len or None,
                               model_name or None, max_queue, log_every, compile=compile)
        state = server_app.state.server
        for note in state.engine.notes:
            console.print(f"note: {note}", markup=False, soft_wrap=True)
        if compile:  # before the first request: no client waits on the compiler
            _warm_up_compiled(state.engine, state.tokenizer(WARM_UP_PROMPT)["input_ids"], WARM_UP_TOKENS, console)
    except (ValueError, FileNotFoundError, OSError, CheckpointError) as e:
        console.print(f"error: {e}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    console.print(serving_line(state.model_name, target, draft, spec, host, port), markup=False, soft_wrap=True)
    run_server(server_app, host, port)


def serving_line(model_name: str, target: str, draft: str, spec, host: str, port: int) -> str:
    """What `serve` says once its model is loaded: the name clients use, the URL, what decodes."""
    how = (f"speculative decoding with drafter {draft} (steps {spec.num_steps}, topk {spec.topk}, draft tokens "
           f"{spec.num_draft_tokens})" if spec is not None
           else "plain decoding" + (" (--no-spec)" if draft else " (no --draft)"))
    return f"serving model '{model_name}' ({target}) at http://{host}:{port}/v1: {how}"


LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1")  # servers whose speed this machine's load sets


@app.command()
def bench(
    url: str = typer.Option(..., help="Server with speculation (specdraft, vLLM, SGLang), e.g. "
                            "http://127.0.0.1:8000 or http://127.0.0.1:8000/v1.", callback=_check_url),
    baseline_url: str = typer.Option("", help="The same engine without speculation (needed for a speedup).",
                                     callback=_check_url),
    prompts: str = typer.Option("builtin", help="'builtin' or a JSONL file of {\"prompt\": ...} rows (plain "
                                "text is refused)."),
    concurrency: str = typer.Option("1,4,16", help="Requests in flight, one level each.",
                                    callback=_positive_int_list),
    max_tokens: int = typer.Option(128, min=1, help="Tokens per request (ignore_eos)."),
    num_prompts: int = typer.Option(32, min=1, help="Requests per run of a level (prompts cycled)."),
    temperature: float = typer.Option(0.0, min=0.0),
    out: str = typer.Option("bench-out", help="Directory for bench.json, bench.md and plots."),
    timeout: float = typer.Option(600.0, help="Seconds per request."),
    repeats: int = typer.Option(3, min=1, help="Runs per level: tokens/s and speedup are reported as mean and "
                                "standard deviation, and a level is a win or a loss only beyond that noise "
                                "(1 run: speedups without a verdict)."),
    wait: float = typer.Option(120.0, min=0, help="Seconds to wait for a server that refuses connections (still "
                               "starting, e.g. just launched with serve ... &) before failing; 0: try once."),
    warmup: int = typer.Option(1, min=0, help="Requests sent to each server, one at a time, before any timing "
                               "(first requests pay for compilation and caches; SGLang bench_serving's "
                               "--warmup-requests)."),
) -> None:
    """Benchmark a server against its no-speculation baseline over a concurrency sweep."""
    from pathlib import Path

    import httpx
    from rich.console import Console

    from specdraft.bench import BenchConfig, Sweep, markdown, run_bench, write_report
    from specdraft.machine_load import busy_note

    if baseline_url and _same_server(url, baseline_url):
        raise typer.BadParameter(f"{url} and {baseline_url} are the same server: measuring one server twice "
                                 "gives no speedup; give the server without speculation as --baseline-url, or "
                                 "leave --baseline-url out", param_hint="'--url' / '--baseline-url'")
    console = Console()
    local = any(httpx.URL(u).host in LOCAL_HOSTS for u in (url, baseline_url) if u.startswith("http"))
    busy = busy_note("the tokens/s of servers on this machine", "serve --threads 1 competes less") if local else None
    if Path(out).exists() and not Path(out).is_dir():  # before the benchmark, not after
        console.print(f"error: --out {out} is a file; give a directory", style="red", markup=False)
        raise typer.Exit(1)
    sweep = Sweep()  # filled level by level: Ctrl-C keeps the levels finished on every server
    try:
        cfg = BenchConfig(url, baseline_url or None, prompts, concurrency, max_tokens, num_prompts, temperature,
                          warmup=warmup, timeout_s=timeout, repeats=repeats, wait_s=wait)
        report = run_bench(cfg, progress=lambda text: console.print(text, markup=False, soft_wrap=True),
                           sweep=sweep)
        paths = write_report(report, out)
    except KeyboardInterrupt:
        console.print(_write_interrupted(sweep, out), style="red", markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except (ValueError, RuntimeError, httpx.HTTPError) as e:
        console.print(f"error: {e}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    console.print(markdown(report), markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(p) for p in paths)}", markup=False, soft_wrap=True)
    if busy:
        console.print(busy, style="yellow", markup=False, soft_wrap=True)
    for warning in report.warnings:  # last, where they are seen
        console.print(warning, style="bold red", markup=False, soft_wrap=True)
    if report.warnings:  # the comparison is invalid: scripts must notice, though the report is written
        raise typer.Exit(1)


def _write_interrupted(sweep, out: str) -> str:
    """Write the report of an interrupted bench sweep (`bench.partial_report`: the levels finished
    on every server) to `out`; the one line saying what was written, or that nothing was."""
    from specdraft.bench import partial_report, write_report

    report = partial_report(sweep)
    if report is None:
        return (f"interrupted: no concurrency level was measured on every server yet, so nothing was written "
                f"to {out}")
    paths = ", ".join(str(p) for p in write_report(report, out))
    if not report.partial:  # interrupted while the report was being written
        return f"interrupted after every level was measured: wrote {paths}"
    measured = ", ".join(str(lv.concurrency) for lv in report.spec.levels)
    return (f"interrupted: wrote a partial report of concurrency {measured} (not measured on every server: "
            f"{', '.join(map(str, report.not_measured))}) to {paths}")


def _check_min_speedup(value: float) -> float:
    """--min-speedup: a positive number (TuneConfig's range), a usage error otherwise."""
    import math

    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value}: must be a positive number, e.g. 1.05 (5 % faster than no speculation)")
    return value


@app.command()
def tune(
    target: str = typer.Option(..., help="Target directory (transformers, with its tokenizer).", callback=_check_model_dir),
    draft: str = typer.Option(..., help=DRAFTER_HELP + ".", callback=_check_drafter),
    prompts: str = typer.Option("builtin", help="'builtin' or a JSONL file of {\"prompt\": ...}."),
    max_tokens: int = typer.Option(64, min=1, help="New tokens per prompt (temperature 0)."),
    num_steps: int = typer.Option(0, min=0, help="Current setting to evaluate too (0 = none): draft depth; "
                                  "--topk and --num-draft-tokens need it."),
    topk: int | None = typer.Option(None, min=1, help="Current setting: children per node (1 with --num-steps "
                                    "alone)."),
    num_draft_tokens: int = typer.Option(0, min=0, help="Current setting: verified nodes (0 = num_steps + 1 "
                                         "for a chain; a tree, --topk > 1, needs a value)."),
    probe_steps: int = typer.Option(8, min=1, help="Depth of the acceptance probes."),
    topks: str = typer.Option("1,2,4", help="Children per node to consider.", callback=_positive_int_list),
    max_tree_tokens: int = typer.Option(16, min=2, help="Cap on a tree's verified nodes."),
    num_measure: int = typer.Option(3, min=1, help="Best predictions to measure for real."),
    min_speedup: float = typer.Option(1.05, help="Median speedup a recommended setting needs (its lower "
                                      "quartile must also be above 1x), as the demo's rule; > 0.",
                                      callback=_check_min_speedup),
    repeats: int = typer.Option(5, min=1, help="Timing rounds: each measured setting and plain decoding run "
                                "once per round, order rotated; speedups are medians and quartiles of "
                                "same-round ratios."),
    json_out: str = typer.Option("", help="Also write the report as JSON here."),
    device: str = typer.Option("cpu", callback=_check_device),
    dtype: EngineDtype = typer.Option("fp32", help="Dtype the target and drafter run in."),
    threads: int | None = typer.Option(None, min=1, help=THREADS_HELP),
) -> None:
    """Predict and measure tokens/s of speculative settings; recommend one, or no speculation."""
    from pathlib import Path

    from rich.console import Console

    from specdraft.checkpoint import CheckpointError
    from specdraft.tune import TuneConfig, render, tune_paths

    console = Console()
    if json_out and (Path(json_out).is_dir() or not Path(json_out).resolve().parent.is_dir()):
        console.print(f"error: --json-out {json_out}: give a file path in an existing directory", style="red",
                      markup=False)
        raise typer.Exit(1)
    try:
        if not num_steps and (topk or num_draft_tokens):  # SGLang refuses these without num_steps too
            given = " ".join(f"--{name} {v}" for name, v in (("topk", topk), ("num-draft-tokens", num_draft_tokens))
                             if v)
            raise ValueError(f"{given} without --num-steps: the current setting needs --num-steps N as well "
                             "(as SGLang's --speculative-eagle-topk / --speculative-num-draft-tokens need "
                             "--speculative-num-steps); add --num-steps N, or drop them")
        current = _spec_from_flags(False, draft, num_steps, topk or 1, num_draft_tokens) if num_steps else None
        cfg = TuneConfig(max_tokens, probe_steps, topks, max_tree_tokens,
                         num_measure, min_speedup, current, repeats=repeats)
        _set_threads(threads)
        report = tune_paths(target, draft, prompts, cfg, device, _torch_dtype(dtype),
                            progress=lambda text: console.print(text, markup=False))
    except (ValueError, FileNotFoundError, OSError, CheckpointError) as e:
        console.print(f"error: {e}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    console.print(render(report), markup=False, highlight=False, soft_wrap=True)
    if json_out:
        Path(json_out).write_text(json.dumps(report.to_dict(), indent=2))


if __name__ == "__main__":  # `torchrun -m specdraft.cli train ...`, `python -m specdraft.cli`
    app()
