"""The options and arguments more than one command takes, each declared once (a typer `Annotated`
alias: type, default, help, range, callback); a command's signature names the alias alone.

Options with a fixed set of values are `Literal`s: click refuses any other value (exit 2, the
choices listed) and --help shows them. Each mirrors the library's own table
(tests/cli/test_cli_choices.py keeps them equal), written out here so that importing the CLI stays
free of torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import typer

from specdraft.cli.checks import (
    aux_override,
    check_device,
    check_drafter,
    check_model_dir,
    check_sglang_version,
    check_top_p,
    json_object,
)
from specdraft.cli.declared import DeclaredOption
from specdraft.machine_load import DEFAULT_THREADS

DtypeName = Literal["bf16", "fp16", "fp32", "bfloat16", "float16", "float32"]  # conventions.DTYPES
EngineDtype = Literal["fp32", "bf16", "fp16"]  # engine_dtype
Layout = Literal["sglang", "speculators", "specdraft"]  # checkpoint.LAYOUTS
LayerNames = Literal["midlayer", "layers.0"]  # checkpoint.layouts.LAYER_NAMES
ExportEngine = Literal["sglang", "vllm", "speculators"]  # export.EXPORT_ENGINES
DoctorEngine = Literal["sglang", "vllm"]  # doctor.inputs.DOCTOR_ENGINES
CaptureEngine = Literal["transformers", "vllm"]  # capture.stage.ENGINES
EndpointApi = Literal["chat", "completions"]  # regenerate.backends.EndpointBackend
ReasoningMode = Literal["keep", "drop"]  # data.reasoning.REASONING_MODES


def option(default: Any, *names: str, **kwargs) -> DeclaredOption:
    """An option that defaults to `default`, declared with its type in one alias
    (`Annotated[int, option(8, min=1, help=...)]`, the default first as in `typer.Option(8, ...)`);
    a command names the alias alone and `declared.declared_signature` gives it
    the default. names: its flags
    (default: the parameter's name, `--max-tokens`); kwargs: typer.Option's settings."""
    return DeclaredOption(default, typer.Option(*names, **kwargs))


def flag(name: str, help: str, **kwargs) -> Any:
    """The alias of a boolean option set by `name` alone, off by default
    (`Annotated[bool, option(False, ...)]`: a flag is always a bool, so the alias is the call,
    `NoSpec = flag("--no-spec", help=...)`); its help shows no value type (typer would show
    `--name <bool>`). kwargs: more typer.Option settings."""
    return Annotated[bool, option(False, name, help=help, metavar="", **kwargs)]


def argument(metavar: str, help: str, **kwargs):
    """A required positional argument named `metavar` (upper case, as the commands' docstrings name
    it) in usage lines (`Command`), help and errors: typer 0.27+ shows the parameter's own lower-case
    name (`{checkpoint}`) otherwise. kwargs: more typer.Argument settings (a callback)."""
    return typer.Argument(metavar=metavar, help=help, **kwargs)


REASONING_HELP = (
    "keep: train the assistants' reasoning as the chat template renders it; drop: the "
    "template's non-thinking rendering, without it."
)
DRAFTER_HELP = "Draft checkpoint directory, or a training checkpoint (RUN/checkpoints/step-N.pt)"
TRUST_REMOTE_CODE_HELP = (
    "Read a --target config.json whose model_type only its own code (auto_map) defines, "
    "running that code (default: refused; known published types are read without it)."
)
# --aux-layers' help, then what the command needs for it (AUX_NEEDS_TARGET: where --target is optional)
AUX_OVERRIDE_HELP = (
    "Aux layers of a drafter without a manifest, replacing what its config.json says (default: its "
    "ids, else the engines' default [2, L//2, L-3]): specdraft indices '2,16,29', or ids in a named "
    "convention, 'vllm:2,16,29' or 'sglang:1,15,28' (read by the --target's class)."
)
AUX_NEEDS_TARGET = AUX_OVERRIDE_HELP + " Needs --target."
AUX_NEEDS_DRAFT = " Used only with --draft (refused without it or with --no-spec)."
ENGINE_DEVICE_HELP = "Device the target and drafter run on: cpu, cuda or cuda:N."
COMPILE_HELP = (
    "CUDA: compiled target layers replayed as CUDA graphs, decode / verify through Triton kernels "
    "with bf16 / fp16 (a warm-up generation compiles first, a minute or more on large targets)."
)
THREADS_HELP = (
    "CPU threads torch uses (torch.set_num_threads, set before loading): one by default, the "
    "fastest for small models and for servers sharing a machine (torch slows down sharply when "
    "its threads compete for cores); more, e.g. --threads 8, for a large model with the cores to "
    "itself."
)

# the drafters and targets
TargetDir = Annotated[
    str,
    typer.Option(
        help="Target directory (transformers, with its tokenizer).", callback=check_model_dir
    ),
]
TargetForIds = Annotated[
    str,
    option(
        "",
        help="Target directory: needed to read aux ids without a manifest.",
        callback=check_model_dir,
    ),
]
AuxOverride = Annotated[str | None, option(None, help=AUX_NEEDS_TARGET, callback=aux_override)]
DraftAuxOverride = Annotated[
    str | None, option(None, help=AUX_OVERRIDE_HELP + AUX_NEEDS_DRAFT, callback=aux_override)
]
SglangVersion = Annotated[
    str,
    option(
        "",
        help="Pin the SGLang version whose reading of eagle_config ids and of --aux-layers "
        "sglang:IDS applies (it depends on the version on DeepSeek/Kimi-class targets), e.g. 0.5.23.",
        callback=check_sglang_version,
    ),
]
TrustRemoteCode = flag("--trust-remote-code", help=TRUST_REMOTE_CODE_HELP)

# running torch here
EngineDevice = Annotated[str, option("cpu", help=ENGINE_DEVICE_HELP, callback=check_device)]
EngineDtypeOption = Annotated[
    EngineDtype, option("fp32", help="Dtype the target and drafter run in.")
]
Threads = Annotated[int, option(DEFAULT_THREADS, min=1, help=THREADS_HELP)]
MaxSeqLen = Annotated[int, option(0, min=0, help="Cache size (0 = min(max positions, 4096)).")]
Compile = flag("--compile", help=COMPILE_HELP)
TopP = Annotated[
    float, option(1.0, help="Nucleus sampling mass, in (0, 1] (1 = off).", callback=check_top_p)
]

# the data
SkipBad = flag("--skip-bad", help="Skip and count bad records.")
TemplateKwargs = Annotated[
    str, option("{}", help="JSON kwargs for the chat template.", callback=json_object)
]
CHAT_TEMPLATE_HELP = (
    "Jinja chat template file that renders chats in place of the tokenizer's own, as vllm serve "
    "and SGLang take --chat-template FILE (training records its hash; doctor: the one served)."
)
ChatTemplate = Annotated[str, option("", metavar="FILE", help=CHAT_TEMPLATE_HELP)]

# the speculative setting (SGLang's names): generate's and serve's, then export's
NUM_DRAFT_TOKENS_HELP = (
    "Verified nodes incl. the root (0 = num_steps + 1 for a chain; a tree, --topk > 1, "
    "needs a value)."
)
TOPK_HELP = "Draft tree: children per node (SGLang --speculative-eagle-topk)"
NUM_STEPS_HELP = "Draft depth (SGLang --speculative-num-steps)"
DraftTopk = Annotated[
    int | None, option(None, min=1, help=TOPK_HELP + "; default 1; used only with --draft.")
]
DraftNumSteps = Annotated[
    int | None,
    option(
        None,
        min=1,
        help=NUM_STEPS_HELP
        + "; default 3 (a DFlash drafter: its block_size - 1); used only with --draft.",
    ),
]
DraftNumDraftTokens = Annotated[
    int | None, option(None, min=0, help=NUM_DRAFT_TOKENS_HELP + " Used only with --draft.")
]
ServeTopk = Annotated[int | None, option(None, min=1, help=TOPK_HELP + "; default 1.")]
ServeNumSteps = Annotated[
    int | None,
    option(
        None, min=1, help=NUM_STEPS_HELP + "; default 3 (a DFlash drafter: its block_size - 1)."
    ),
]
ServeNumDraftTokens = Annotated[int | None, option(None, min=0, help=NUM_DRAFT_TOKENS_HELP)]
ExportNumSteps = Annotated[
    int | None,
    option(
        None,
        min=1,
        help=NUM_STEPS_HELP + " in the launch command (vLLM: num_speculative_tokens); default 3. "
        "A DFlash drafter: its drafts a round, vLLM 1..block-1 (default block-1, the trained "
        "block); SGLang serves the trained block only.",
    ),
]
ExportTopk = Annotated[
    int | None,
    option(None, min=1, help=TOPK_HELP + "; default 1, a chain, the only shape vLLM runs."),
]
ExportNumDraftTokens = Annotated[int, option(0, min=0, help=NUM_DRAFT_TOKENS_HELP)]

# the prompts of bench and tune (`bench.prompts.load_prompts`)
PROMPTS_HELP = (
    '\'builtin\' or a JSONL file of {"prompt": ...}, {"text": ...} or chat {"messages": [...]} rows'
)

# the draft of generate / serve / tune
PlainDraft = Annotated[
    str, option("", help=DRAFTER_HELP + " (omit for plain decoding).", callback=check_drafter)
]
ServeDraft = Annotated[
    str, option("", help=DRAFTER_HELP + " (omit with --no-spec).", callback=check_drafter)
]
TuneDraft = Annotated[str, typer.Option(help=DRAFTER_HELP + ".", callback=check_drafter)]
