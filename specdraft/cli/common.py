"""The typer app and what every command shares: option validators, the one line an error prints."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import typer

from specdraft.cli.command import App
from specdraft.errors import SpecdraftError, UnusableInput

app = App()


# Options with a fixed set of values: click refuses any other value (exit 2, the choices listed) and
# --help shows them. Each mirrors the library's own table (tests/cli/test_cli_choices.py keeps them equal),
# written out here so that importing the CLI stays free of torch.
DtypeName = Literal["bf16", "fp16", "fp32", "bfloat16", "float16", "float32"]  # conventions.DTYPES


EngineDtype = Literal["fp32", "bf16", "fp16"]  # engine_dtype


Precision = Literal["fp32", "bf16"]  # train.config.PRECISIONS


Layout = Literal["sglang", "speculators", "specdraft"]  # checkpoint.LAYOUTS


ExportEngine = Literal["sglang", "vllm", "speculators"]  # export.EXPORT_ENGINES


DoctorEngine = Literal["sglang", "vllm"]  # doctor.inputs.DOCTOR_ENGINES

CaptureEngine = Literal["transformers", "vllm"]  # capture.stage.ENGINES

EndpointApi = Literal["chat", "completions"]  # regenerate.backends.EndpointBackend


ReasoningMode = Literal["keep", "drop"]  # data.reasoning.REASONING_MODES
REASONING_HELP = (
    "keep: train the assistants' reasoning as the chat template renders it; drop: the "
    "template's non-thinking rendering, without it."
)


def check_device(value: str) -> str:
    """--device: a torch device this install can use (one line instead of a traceback)."""
    import torch

    try:
        device = torch.device(value)
    except RuntimeError as e:
        raise typer.BadParameter(f"{value!r} is not a torch device (use cpu or cuda[:N])") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter(
            f"{value!r}: this torch build ({torch.__version__}) sees no CUDA GPU; "
            "use --device cpu or install a CUDA build of torch"
        )
    return value


def check_model_dir(value: str, param: typer.CallbackParam = None) -> str:
    """--target: empty (not given) or a directory holding config.json, and no drafter. A file
    (e.g. DIR/config.json) or a `~` the shell left unexpanded (`--target=~/m`) is named as such."""

    path = Path(value)
    if value and not (path / "config.json").is_file():
        if not path.expanduser().exists():
            raise typer.BadParameter(
                f"{value}: no such directory; pass a transformers model directory"
            )
        if path.is_file():
            raise typer.BadParameter(
                f"{value} is a file; pass the model directory that holds it ({path.parent})"
            )
        if (path.expanduser() / "config.json").is_file():
            raise typer.BadParameter(
                f"{value}: ~ was not expanded (a shell leaves it as is after '='); pass "
                f"{path.expanduser()}"
            )
        refuse_wrong_kind(value, "target", param)  # a capture store: named as one
        raise typer.BadParameter(
            f"{value}: no config.json here; pass a transformers model directory"
        )
    if value:
        refuse_wrong_kind(value, "target", param)
    return value


def refuse_wrong_kind(value: str, want: str, param) -> None:
    """A drafter given as target or a target as drafter: `checkpoint.wrong_dir_message`, exit 1."""
    from specdraft.checkpoint import wrong_dir_message

    given_as = param.opts[0] if param is not None and param.param_type_name == "option" else ""
    message = wrong_dir_message(value, want, given_as)
    if message:
        error(ValueError(message))
        raise typer.Exit(1)


def check_checkpoint_dir(value: str, param: typer.CallbackParam = None) -> str:
    """CKPT: an existing directory, not a target model's. A file path is refused; its directory is
    named when it holds a checkpoint (config.json and weights: a path to its model.safetensors)."""

    if not value:  # an optional --draft left out
        return value
    path = Path(value)
    if path.is_file():
        from specdraft.checkpoint import WEIGHT_FILES

        parent = path.parent
        holds = (parent / "config.json").is_file() and any(
            (parent / name).is_file() for name in WEIGHT_FILES
        )
        raise typer.BadParameter(
            f"{value} is a file; pass the checkpoint directory that holds config.json "
            f"and model.safetensors{f' (here: {parent})' if holds else ''}, not the file"
        )
    if not path.is_dir():
        raise typer.BadParameter(
            f"{value}: no such directory; pass a draft checkpoint directory "
            "(config.json and model.safetensors)"
        )
    refuse_wrong_kind(value, "drafter", param)
    return value


UNWRAPPED_WIDTH = (
    100_000  # columns of a redirected command's Console: no line of its output is this long
)


REDIRECTED_TEXT_WIDTH = (
    100  # columns a redirected table's long text cells wrap in, at spaces (doctor's evidence)
)


def make_console(stderr: bool = False):
    """The rich Console every command prints with (stdout, or stderr): at a terminal, the terminal's
    width; redirected (a file, a pipe, CliRunner), `UNWRAPPED_WIDTH` and soft wrap, so a line keeps
    its paths and table cells whole (rich would wrap them at 80 columns)."""
    from rich.console import Console

    console = Console(stderr=stderr)
    return (
        console
        if console.is_terminal
        else Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True)
    )


def error(e: Exception, skip_bad_hint: str = "") -> None:
    """Print `error: ...` to stderr (stdout keeps only what the command produced); for one bad data
    record (data.records.BadRecord) add `skip_bad_hint`, how this command skips such records
    (commands without --skip-bad give none or another way)."""
    from specdraft.data.records import BadRecord

    hint = skip_bad_hint if isinstance(e, BadRecord) else ""
    make_console(stderr=True).print(f"error: {e}{hint}", style="red", markup=False, soft_wrap=True)


# What a command reports as one line and exit 1: specdraft's own errors, bad values and files the OS
# refused. Anything else is a bug and keeps its traceback.
USER_ERRORS = (SpecdraftError, ValueError, OSError)


# click's exit code for a bad option value; also that of specdraft's checks of option combinations and
# of any input the user must fix before anything can run (errors.UnusableInput: a file cut short, ...)
USAGE_ERROR = 2


@contextmanager
def user_errors(
    console,
    skip_bad_hint: str = "",
    interrupted: Callable[[], str] | None = None,
    exit_code: int = 1,
) -> Iterator[None]:
    """The one exit-code mapping of every command: a `USER_ERRORS` exception prints one line
    (`error`) and exits `exit_code` (1; `USAGE_ERROR` around checks of the options alone), an
    `errors.UnusableInput` (a damaged file, an output that is the input, ...) `USAGE_ERROR` wherever
    it is raised; Ctrl-C prints `interrupted; <interrupted()>` when given (what was kept and how to
    resume) and exits 130. Usage errors (typer.BadParameter) exit 2 before a command runs."""
    try:
        yield
    except KeyboardInterrupt:
        if interrupted is not None:
            console.print(f"interrupted; {interrupted()}", markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except USER_ERRORS as e:
        error(e, skip_bad_hint)
        raise typer.Exit(USAGE_ERROR if isinstance(e, UnusableInput) else exit_code) from e


def flag(name: str, help: str, **kwargs):
    """A boolean option off by default and set by `name` alone; its help shows no value type
    (typer would show `--name <bool>`, as if it took a value). kwargs: more typer.Option settings."""
    return typer.Option(False, name, help=help, metavar="", **kwargs)


def argument(metavar: str, help: str, **kwargs):
    """A required positional argument named `metavar` (upper case, as the commands' docstrings name
    it) in usage lines (`Command`), help and errors: typer 0.27+ shows the parameter's own lower-case
    name (`{checkpoint}`) otherwise. kwargs: more typer.Argument settings (a callback)."""
    return typer.Argument(..., metavar=metavar, help=help, **kwargs)


SKIP_BAD_HINT = " (or pass --skip-bad to skip and count bad records)"


NUM_DRAFT_TOKENS_HELP = (
    "Verified nodes incl. the root (0 = num_steps + 1 for a chain; a tree, --topk > 1, "
    "needs a value)."
)


TOPK_HELP = "Draft tree: children per node (SGLang --speculative-eagle-topk)"


NUM_STEPS_HELP = "Draft depth (SGLang --speculative-num-steps)"


def url_option(value: str) -> str:
    """--url / --baseline-url / --endpoint: `client.check_port` as a usage error (exit 2) before
    anything runs; "" (not given) passes."""
    if not value:
        return value
    from specdraft.client import BadURL, check_port

    try:
        check_port(value)
    except BadURL as e:
        raise typer.BadParameter(str(e)) from None
    return value


def check_top_p(value: float) -> float:
    """--top-p: nucleus mass in (0, 1] (SamplingParams' rule), a usage error before anything loads
    (typer's min / max cannot leave 0 out)."""
    if not 0 < value <= 1:
        raise typer.BadParameter(f"{value}: must be in (0, 1] (1 = off)")
    return value


LIST_EXAMPLES = {
    "aux_layers": "2,16,29",
    "topks": "1,2,4",
}  # per option; others: bench --concurrency's


def list_example(param) -> str:
    return LIST_EXAMPLES.get(getattr(param, "name", None), "1,4,16")


def int_list(value: str, param: typer.CallbackParam = None) -> tuple[int, ...]:
    """A comma-separated integer option ("1,4,16") as the tuple the command receives; "" = ()."""
    numbers = []
    for item in value.split(",") if value.strip() else []:
        try:
            numbers.append(int(item))
        except ValueError:
            raise typer.BadParameter(
                f"{value!r}: {item.strip()!r} is not an integer; give comma-separated "
                f"integers, e.g. {list_example(param)}"
            ) from None
    return tuple(numbers)


def positive_int_list(value: str, param: typer.CallbackParam = None) -> tuple[int, ...]:
    """`int_list` of at least one integer, each >= 1 (bench --concurrency, tune --topks)."""
    numbers = int_list(value, param)
    if not numbers or min(numbers) < 1:
        raise typer.BadParameter(
            f"{value!r}: give comma-separated integers >= 1, e.g. {list_example(param)}"
        )
    return numbers


def aux_layer_list(value: str | None, param: typer.CallbackParam = None) -> tuple[int, ...] | None:
    """capture / train --aux-layers: None when left out (the default layers); given empty, a usage error."""
    if value is None:
        return None
    if not value.strip():
        raise typer.BadParameter(
            f"{value!r} is empty; leave --aux-layers out for the default layers "
            f"([2, L//2, L-3] for an L-layer target), or give three layers, e.g. "
            f"{list_example(param)}"
        )
    return int_list(value, param)


# --aux-layers' help, then what the command needs for it (AUX_NEEDS_TARGET: where --target is optional)
AUX_OVERRIDE_HELP = (
    "Aux layers of a drafter without a manifest, replacing what its config.json says (default: its "
    "ids, else the engines' default [2, L//2, L-3]): specdraft indices '2,16,29', or ids in a named "
    "convention, 'vllm:2,16,29' or 'sglang:1,15,28' (read by the --target's class)."
)
AUX_NEEDS_TARGET = AUX_OVERRIDE_HELP + " Needs --target."


def sglang_version_option():
    """--sglang-version of every command that reads aux ids (`id_reading`): "" = not pinned."""
    return typer.Option(
        "",
        help="Pin the SGLang version whose reading of eagle_config ids and of --aux-layers "
        "sglang:IDS applies (it depends on the version on DeepSeek/Kimi-class targets), e.g. 0.5.23.",
        callback=check_sglang_version,
    )


def check_sglang_version(value: str) -> str:
    """--sglang-version: "" (not pinned) or a version `conventions.parse_version` reads; a usage
    error naming the value and the form expected otherwise (a typo would silently pin nothing)."""
    from specdraft.conventions import ConventionError, parse_version

    if value:
        try:
            parse_version(value)
        except ConventionError:
            raise typer.BadParameter(f"{value!r} is not a version: write one like 0.5.23") from None
    return value


def threads_option():
    """--threads of every command that runs torch here: None (left out) keeps torch's default (`set_threads`)."""
    return typer.Option(
        None,
        min=1,
        help="CPU threads torch uses (torch.set_num_threads, set before loading; "
        "default: torch's, all cores). Pin it on a busy or shared machine, e.g. --threads 4: torch "
        "slows down sharply when its threads compete for cores.",
    )


def set_threads(threads: int | None) -> None:
    """--threads N (N >= 1, the option's range): torch.set_num_threads(N) (call it before any model
    loads); None keeps torch's default (all cores)."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)


TRUST_REMOTE_CODE_HELP = (
    "Read a --target config.json whose model_type only its own code (auto_map) defines, "
    "running that code (default: refused; known published types are read without it)."
)


def aux_override(
    value: str | None, param: typer.CallbackParam = None
) -> tuple[str, tuple[int, ...]] | None:
    """inspect / convert / export / doctor --aux-layers: (convention, ids) (`conventions.split_aux_option`,
    the list parsed as capture's --aux-layers), None when left out."""
    from specdraft.conventions import split_aux_option

    if value is None:
        return None
    try:
        convention, text = split_aux_option(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return convention, aux_layer_list(text, param)


def read_target(target: str, trust_remote_code: bool = False):
    """A --target's config.json as published (`target.read_target_config`: read once, for every use
    a command makes of it), None when no --target is given; --trust-remote-code reads one whose
    model_type only its own code defines. ValueError naming the file and the fix when it is
    unreadable or lacks model_type / num_hidden_layers (`refuse_bad_configs`)."""
    if not target:
        return None
    from specdraft.targets.config import read_target_config

    refuse_bad_configs("", target, ("model_type", "num_hidden_layers"))
    return read_target_config(target, trust_remote_code)


def id_reading(
    target_config,
    aux: tuple[str, tuple[int, ...]] | None,
    sglang_version: str = "",
    drafter: str = "",
    target: str = "",
) -> dict:
    """How to read a drafter's aux ids, as `load_draft` / `convert_draft` / `engine.load.load_engine`
    take it: the layer count and class of the --target's config (`read_target`; None without
    --target), the --sglang-version, and --aux-layers as specdraft indices
    (`conventions.layers_of_option`). UnusableInput naming the flag: --aux-layers without --target or
    naming layers its convention cannot; before that, ValueError naming both when the manifest-less
    `drafter` directory's config.json was built for a target of another hidden size or vocabulary
    (`engine.load.refuse_other_target`: the most basic mismatch, which the default aux ids'
    collapse would hide; a manifest names the aux layers, and the loader checks its record)."""
    if target_config is None:
        if aux is not None:
            raise UnusableInput(
                "--aux-layers needs --target DIR: aux ids are read by the target's layer count "
                "and class"
            )
        return {"target_num_layers": None, "sglang_version": sglang_version or None}
    from specdraft.conventions import ConventionError, layers_of_option
    from specdraft.targets.config import TARGET_CLASSES

    text = target_config.get_text_config()
    from specdraft.checkpoint import MANIFEST_FILE

    if (
        drafter
        and (Path(drafter) / "config.json").is_file()
        and not (Path(drafter) / MANIFEST_FILE).is_file()
    ):
        from specdraft.checkpoint import read_config
        from specdraft.checkpoint.config_read import config_target_sizes
        from specdraft.engine.load import refuse_other_target

        refuse_other_target(
            config_target_sizes(read_config(Path(drafter))),
            {"hidden_size": text.hidden_size, "vocab_size": text.vocab_size},
            drafter,
            target,
        )
    target_class = TARGET_CLASSES.get(text.model_type, "llama")
    layers = None
    if aux is not None:
        try:
            layers = layers_of_option(
                aux[0], aux[1], text.num_hidden_layers, target_class, sglang_version or None
            )
        except ConventionError as e:
            typed = ",".join(
                map(str, aux[1])
            )  # as given: a list without a convention name is specdraft's
            given = typed if aux[0] == "specdraft" else f"{aux[0]}:{typed}"
            raise UnusableInput(f"--aux-layers {given}: {e}") from None
    return {
        "target_num_layers": text.num_hidden_layers,
        "target_class": target_class,
        "sglang_version": sglang_version or None,
        "aux_layers": layers,
    }


def print_version(value: bool) -> None:
    """--version: print specdraft's version as `specdraft version` does, then exit 0 (an eager
    option: before any command runs)."""
    if value:
        version()
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    _version: bool = flag(
        "--version", "Print specdraft's version and exit.", callback=print_version, is_eager=True
    ),
) -> None:
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


def json_kwargs(text: str, option: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(
            f"{option} {text!r} is not JSON ({e.msg}); e.g. '{{\"enable_thinking\": false}}'"
        ) from e
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{option} must be a JSON object")
    return value


def refuse_bad_configs(draft: str, target: str, target_keys: tuple[str, ...] | None = None) -> None:
    """ValueError naming the file, what is wrong and the fix when the drafter's or the target's
    config.json is unreadable, not JSON or no object (`doctor.inputs.given_config`, doctor's
    words), or the target's lacks one of `target_keys` (default: all `target.TARGET_REQUIRED_KEYS`).
    Either path may be empty (not given) or lack config.json (left to the loaders)."""

    from specdraft.checkpoint import DRAFTER_CONFIG_FIX
    from specdraft.doctor.inputs import given_config
    from specdraft.targets.config import (
        TARGET_CONFIG_FIX,
        TARGET_REQUIRED_KEYS,
        check_target_config,
    )

    if draft:
        given_config(Path(draft), DRAFTER_CONFIG_FIX)
    config = given_config(Path(target), TARGET_CONFIG_FIX) if target else None
    if config is not None:
        check_target_config(target, config, target_keys or TARGET_REQUIRED_KEYS)


def check_drafter(value: str, param: typer.CallbackParam = None) -> str:
    """The drafter of inspect / convert / export's kin and --draft of generate / serve / tune: a
    drafter directory (`check_checkpoint_dir`) or a training checkpoint (RUN/checkpoints/step-N.pt,
    or a sharded step-N directory), both read by `checkpoint.load_draft`."""
    if value:
        from pathlib import Path

        from specdraft.checkpoint import SOURCE_FORMS, is_training_checkpoint

        if is_training_checkpoint(value):
            return value
        if not Path(value).exists():
            raise typer.BadParameter(f"{value}: no such file or directory; pass {SOURCE_FORMS}")
        if Path(value).is_file() and Path(value).suffix == ".pt":  # torch.save writes a zip archive
            raise typer.BadParameter(
                f"{value}: not a readable training checkpoint (no torch.save archive: cut "
                f"short or damaged); pass another checkpoint of its run, or {SOURCE_FORMS}"
            )
    return check_checkpoint_dir(value, param)


def check_doctor_drafter(value: str, param: typer.CallbackParam = None) -> str:
    """doctor's CHECKPOINT: a drafter directory (`check_checkpoint_dir`). A training checkpoint is
    refused with the command that makes one from it: doctor checks the files an engine loads."""
    from specdraft.checkpoint import is_training_checkpoint

    if is_training_checkpoint(value):
        raise typer.BadParameter(
            f"{value} is a training checkpoint, which no engine loads; doctor checks the "
            f"files an engine does: export it first (specdraft export {value} OUT --engine "
            "sglang, vllm or speculators), then run doctor on OUT"
        )
    return check_checkpoint_dir(value, param)


DRAFTER_HELP = "Draft checkpoint directory, or a training checkpoint (RUN/checkpoints/step-N.pt)"


def spec_from_flags(no_spec: bool, draft: str, num_steps: int, topk: int, num_draft_tokens: int):
    """The SpecConfig of the speculative flags (None with --no-spec); ValueError names the rule."""
    from specdraft.engine.spec_config import SpecConfig, max_draft_tokens

    if no_spec:
        return None
    if not draft:
        raise ValueError("--draft CKPT is required for speculative decoding (or pass --no-spec)")
    if topk > 1 and not num_draft_tokens:
        most = max_draft_tokens(num_steps, topk)
        raise ValueError(
            f"--topk {topk} drafts a tree, which needs --num-draft-tokens (nodes verified per "
            f"step incl. the root: 2..{most} with --num-steps {num_steps}), e.g. "
            f"--num-draft-tokens {min(most, num_steps * topk + 1)}; or --topk 1 for a chain"
        )
    return SpecConfig(num_steps, topk, num_draft_tokens or num_steps + 1)


def engine_dtype(name: EngineDtype):
    """--dtype of generate / serve / tune as a torch dtype (`conventions.parse_dtype`)."""
    from specdraft.conventions import parse_dtype

    return parse_dtype(name)
