"""Read the speculative settings out of an SGLang or vLLM launch command line.

Only the flags that decide how an EAGLE-3 drafter is fed and verified are read; every other
flag is passed over. How each engine reads them (re-check when bumping an engine):

- SGLang (`srt/server_args.py`, `srt/speculative/eagle_worker.py`): `--speculative-algorithm`
  (EAGLE3 captures aux hidden states; EAGLE is EAGLE-2 and feeds one hidden state),
  `--speculative-num-steps`, `--speculative-eagle-topk`, `--speculative-num-draft-tokens`
  (with all three unset it picks them itself), `--speculative-draft-model-path`,
  `--model-path`, `--chat-template` (a Jinja file, `srt/managers/template_manager.py`; also a
  built-in template name or a .json conversation file).
- vLLM (`config/speculative.py`, `v1/worker/gpu_model_runner.py`): `--speculative-config
  JSON` (or dotted `--speculative-config.KEY VALUE`) with `method` ("eagle3" captures aux
  states; without a method vLLM guesses it from the draft path: "eagle-" -> eagle, "eagle3"
  -> eagle3), `model`, `num_speculative_tokens` (chain length = num_steps);
  `--default-chat-template-kwargs JSON`, `--chat-template` (a Jinja file, or the template itself);
  the target is `vllm serve MODEL` or `--model`. Started
  on a speculators drafter (`vllm serve DRAFTER`, no --speculative-config), vLLM reads method,
  draft length and target from DRAFTER/config.json (`conventions.engines.SPECULATORS_LAUNCH_READ`).
- Both engines capture aux states only for EAGLE-3 and only when the draft config's
  `eagle_config.use_aux_hidden_state` is not false (default true).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdraft.engine.spec_config import SpecConfig
from specdraft.errors import SpecdraftError

ENGINES = ("sglang", "vllm")
# The algorithm value each engine needs to run an EAGLE-3 drafter with aux capture.
EAGLE3_ALGORITHM = {"sglang": "EAGLE3", "vllm": "eagle3"}
ALGORITHM_FLAG = {"sglang": "--speculative-algorithm", "vllm": '--speculative-config "method"'}
SOURCES = {
    "sglang": "sglang srt/server_args.py, srt/speculative/eagle_worker.py",
    "vllm": "vllm config/speculative.py, v1/worker/gpu_model_runner.py",
}
_SGLANG_INTS = {
    "--speculative-num-steps": "num_steps",
    "--speculative-eagle-topk": "topk",
    "--speculative-num-draft-tokens": "num_draft_tokens",
    # DFLASH's block; SGLang 0.5.22 sets num_draft_tokens to it (arg_groups/speculative_hook.py)
    "--speculative-dflash-block-size": "num_draft_tokens",
}
_SGLANG_STRINGS = {
    "--speculative-algorithm": "algorithm",
    "--speculative-draft-model-path": "draft_model",
    "--speculative-draft": "draft_model",
    "--model-path": "target_model",
    "--model": "target_model",
    "--chat-template": "chat_template",
}
_VLLM_JSON = ("--speculative-config", "--default-chat-template-kwargs")


class EngineArgsError(SpecdraftError, ValueError):
    """A launch command line whose speculative flags cannot be read: a number that is not an
    integer, JSON that does not parse, unbalanced quotes, incomplete SGLang settings."""


@dataclass(frozen=True)
class EngineArgs:
    """The speculative part of one engine's command line (None = not given).

    engine: "sglang" | "vllm". algorithm: SGLang `--speculative-algorithm` or vLLM's
    speculative-config `method`, as written. num_steps: draft depth (vLLM
    num_speculative_tokens). topk / num_draft_tokens: SGLang only (vLLM drafts a chain).
    draft_model / target_model: paths or names as written. template_kwargs: vLLM
    `--default-chat-template-kwargs`. chat_template: `--chat-template`, as written (both
    engines: a Jinja file; a name or inline template otherwise). flags: every flag read, as written (for evidence).
    speculators_config: the speculators drafter's config.json vLLM read algorithm, num_steps and
    target from (`vllm serve DRAFTER`), else None.
    """

    engine: str
    algorithm: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    draft_model: str | None = None
    target_model: str | None = None
    template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    flags: dict[str, str] = field(default_factory=dict)
    speculators_config: str | None = None

    @property
    def uses_eagle3(self) -> bool:
        """True when the algorithm asks the engine for EAGLE-3 (aux hidden-state capture)."""
        return self.algorithm is not None and self.algorithm.lower() == "eagle3"

    def spec_config(self) -> SpecConfig | None:
        """The speculative triple as a validated SpecConfig; None when the engine picks it.

        SGLang: all three of steps / topk / draft tokens, or none (SGLang then chooses).
        vLLM: a chain of num_speculative_tokens. Raises ValueError naming the rule a triple
        breaks (SpecConfig's message: the corrected values), or EngineArgsError (a ValueError)
        naming the missing flags.
        """
        if self.engine == "vllm":
            return None if self.num_steps is None else SpecConfig.chain(self.num_steps)
        given = {
            "--speculative-num-steps": self.num_steps,
            "--speculative-eagle-topk": self.topk,
            "--speculative-num-draft-tokens": self.num_draft_tokens,
        }
        missing = [flag for flag, value in given.items() if value is None]
        if len(missing) == 3:
            return None
        if missing:
            raise EngineArgsError(
                f"SGLang speculative settings are incomplete: {', '.join(missing)} "
                "not given; pass all three (or none to let SGLang choose)"
            )
        return SpecConfig(self.num_steps, self.topk, self.num_draft_tokens)


def detect_engine(command: str | Sequence[str]) -> str | None:
    """'sglang' or 'vllm' from the flags of a command line; None when it names neither."""
    tokens = _tokens(command)
    text = " ".join(tokens)
    if "sglang" in text or any(t.startswith("--speculative-algorithm") for t in tokens):
        return "sglang"
    if "vllm" in text or any(_flag(t).startswith("--speculative-config") for t in tokens):
        return "vllm"
    return None


def parse_engine_args(command: str | Sequence[str], engine: str) -> EngineArgs:
    """Read the speculative flags of an SGLang or vLLM command line (a string or argv list).

    Accepts `--flag value` and `--flag=value`, underscores or hyphens. Raises EngineArgsError (a
    ValueError) naming the flag for a number that is not an integer or a JSON value that does not
    parse, or for a command line with unbalanced quotes.
    """
    if engine not in ENGINES:
        raise EngineArgsError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    pairs = _flag_values(_tokens(command))
    if engine == "sglang":
        return _sglang_args(pairs)
    return _speculators_launch(_vllm_args(pairs, _tokens(command)))


def _speculators_launch(args: EngineArgs) -> EngineArgs:
    """`args` as vLLM reads them when its model is a local speculators drafter and no
    --speculative-config is given (`conventions.engines.SPECULATORS_LAUNCH_READ`): method =
    speculators_model_type, num_steps = proposal_methods[0].speculative_tokens, draft = that
    directory, target = verifier.name_or_path. Any other command line is returned as it is."""
    if args.algorithm is not None or args.draft_model is not None or args.target_model is None:
        return args
    file = Path(args.target_model) / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return args  # not a local directory with a readable config: a target (or a hub name)
    spec = config.get("speculators_config") if isinstance(config, dict) else None
    if not isinstance(spec, dict):
        return args
    methods = spec.get("proposal_methods") or [{}]
    steps = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    verifier = spec.get("verifier") if isinstance(spec.get("verifier"), dict) else {}
    return dataclasses.replace(
        args,
        algorithm=config.get("speculators_model_type"),
        num_steps=None if steps is None else _int("speculative_tokens", steps),
        draft_model=args.target_model,
        target_model=verifier.get("name_or_path"),
        speculators_config=str(file),
    )


def _tokens(command: str | Sequence[str]) -> list[str]:
    """The words of a command line as a shell splits them; EngineArgsError for unbalanced quotes."""
    if not isinstance(command, str):
        return list(command)
    try:
        return shlex.split(command)
    except ValueError as e:  # "No closing quotation"
        raise EngineArgsError(
            f"{command!r}: {e}; quote the launch command as a shell would"
        ) from None


def _flag(token: str) -> str:
    """A flag's name with hyphens (argparse accepts both spellings in these engines)."""
    name = token.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def _flag_values(tokens: list[str]) -> list[tuple[str, str | None]]:
    """(flag, value) pairs in order; a flag followed by another flag has value None."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            i += 1
            continue
        if "=" in token:
            pairs.append((_flag(token), token.split("=", 1)[1]))
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            pairs.append((_flag(token), tokens[i + 1]))
            i += 2
        else:
            pairs.append((_flag(token), None))
            i += 1
    return pairs


def _int(flag: str, value: str | None) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise EngineArgsError(f"{flag} {value!r} is not an integer") from None


def _json(flag: str, value: str | None) -> Any:
    try:
        return json.loads(value)  # type: ignore[arg-type]
    except (TypeError, json.JSONDecodeError) as e:
        raise EngineArgsError(
            f"{flag} {value!r} is not JSON ({e}); write e.g. "
            '\'{"method": "eagle3", "num_speculative_tokens": 3}\''
        ) from None


def _sglang_args(pairs: list[tuple[str, str | None]]) -> EngineArgs:
    values: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for flag, value in pairs:
        if flag in _SGLANG_INTS:
            values[_SGLANG_INTS[flag]] = _int(flag, value)
        elif flag in _SGLANG_STRINGS:
            values[_SGLANG_STRINGS[flag]] = value
        else:
            continue
        flags[flag] = str(value)
    return EngineArgs("sglang", flags=flags, **values)


def _vllm_args(pairs: list[tuple[str, str | None]], tokens: list[str]) -> EngineArgs:
    spec: dict[str, Any] = {}
    flags: dict[str, str] = {}
    template_kwargs, named = None, {}
    target = tokens[tokens.index("serve") + 1] if "serve" in tokens[:-1] else None
    for flag, value in pairs:
        if flag == "--speculative-config":
            parsed = _json(flag, value)
            if not isinstance(parsed, dict):
                raise EngineArgsError(f"{flag} must be a JSON object, got {parsed!r}")
            spec.update(parsed)
        elif flag.startswith("--speculative-config."):
            key = flag.removeprefix("--speculative-config.").replace("-", "_")
            spec[key] = _int(flag, value) if key == "num_speculative_tokens" else value
        elif flag == "--default-chat-template-kwargs":
            template_kwargs = _json(flag, value)
        elif flag in ("--model", "--chat-template"):
            named[flag] = value
        else:
            continue
        flags[flag] = str(value)
    steps = spec.get("num_speculative_tokens")
    return EngineArgs(
        "vllm",
        algorithm=spec.get("method"),
        num_steps=None if steps is None else _int("num_speculative_tokens", steps),
        draft_model=spec.get("model"),
        target_model=named.get("--model", target),
        template_kwargs=template_kwargs,
        chat_template=named.get("--chat-template"),
        flags=flags,
    )


def aux_capture(
    args: EngineArgs | None, draft_config: dict[str, Any], engine: str
) -> tuple[bool, str]:
    """Whether `engine` captures aux hidden states for this drafter, and why.

    Off when the algorithm is not EAGLE-3 (the engine then feeds one H-wide hidden state) or
    the draft config says `eagle_config.use_aux_hidden_state: false`. With no command line
    the algorithm is assumed to be EAGLE-3.
    """
    if args is not None and args.algorithm is not None and not args.uses_eagle3:
        return False, (
            f"{ALGORITHM_FLAG[engine]} {args.algorithm!r} is not "
            f"{EAGLE3_ALGORITHM[engine]!r}, so {engine} captures no aux states"
        )
    eagle_config = draft_config.get("eagle_config")
    if isinstance(eagle_config, dict) and eagle_config.get("use_aux_hidden_state", True) is False:
        return False, "the draft config sets eagle_config.use_aux_hidden_state: false"
    return True, "EAGLE-3 with aux capture"
