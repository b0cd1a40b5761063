"""What a target directory says without building the network: its class in the engines' rule
tables (`TARGET_CLASSES`, `target_class_of`), its config.json read as published
(`read_target_config`: never a remote-code prompt, never a quantization kernel), the config's
hash, its safetensors weight files (headers checked, `check_target_weights`), and the ids its
generations end at (`end_token_ids`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, GenerationConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from specdraft.errors import SpecdraftError, UnusableInput
from specdraft.files import unreadable
from specdraft.targets.classes import (  # noqa: F401 (re-exported: the tables' old home)
    DEFAULT_CLASSES,
    ENGINE_ARCHITECTURES,
    TARGET_CLASSES,
    recorded_target_class,
    target_class_of,
)

# Config fields that say how or where a config was saved or run, not what the network is.
_VOLATILE_CONFIG_KEYS = frozenset(
    {
        "transformers_version",
        "_name_or_path",
        "_commit_hash",
        "torch_dtype",
        "dtype",
        "architectures",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "use_cache",
    }
)


class TargetConfigError(SpecdraftError, ValueError):
    """A target directory specdraft will not read: its config.json (missing keys, not JSON, unknown
    remote code), an unsupported class, weights that do not match it; names the file and the fix."""


class InvalidTargetConfig(TargetConfigError, UnusableInput):
    """A target's config.json that is no valid model config (not JSON, keys a transformers config
    holds missing, a value its config class refuses): an unusable input, which the CLI exits 2
    for in every command, as doctor does."""


class TargetFileError(SpecdraftError, OSError):
    """A file of the target directory the OS or transformers would not read (permissions, a
    directory, a file transformers looks for and does not find); names the file. An OSError, as
    the error it replaces (not a TargetConfigError), whose `strerror` keeps the OS's reason."""

    def __init__(self, message: str, strerror: str | None = None) -> None:
        super().__init__(message)
        self.strerror = strerror


class TargetFileMissing(TargetFileError, FileNotFoundError):
    """A file the target directory must hold and does not (config.json, the embedding's weights)."""


TARGET_CONFIG_FIX = (
    "restore config.json from where the model came from (its Hugging Face repository or the "
    "original download), or pass another transformers model directory"
)


# Keys every decoder target's config.json holds (a multimodal one in text_config) that specdraft reads.
TARGET_REQUIRED_KEYS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


def check_target_config(
    path: str | Path, config: dict, keys: Sequence[str] = TARGET_REQUIRED_KEYS
) -> None:
    """InvalidTargetConfig naming `path`/config.json, the `keys` it lacks (at the top or in text_config)
    and the fix (TARGET_CONFIG_FIX); transformers would default a missing layer count silently."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    missing = [k for k in keys if config.get(k) is None and text.get(k) is None]
    if missing:
        raise InvalidTargetConfig(
            f"{Path(path) / 'config.json'}: missing {', '.join(missing)}, which a transformers "
            f"model config holds; {TARGET_CONFIG_FIX}"
        )


# model_type a published config names with its own code (auto_map) -> the transformers model_type
# whose config reads it. kimi_k2: moonshotai/Kimi-K2-Instruct's config.json (architectures
# DeepseekV3ForCausalLM, auto_map configuration_deepseek.DeepseekV3Config): the DeepSeek-V3 class.
PUBLISHED_MODEL_TYPES = {"kimi_k2": "deepseek_v3"}


# Keys of a published config that name its own code, dropped when specdraft's table reads it.
REMOTE_CODE_KEYS = ("auto_map",)


def read_target_config(path: str | Path, trust_remote_code: bool = False) -> PretrainedConfig:
    """The transformers config of the target directory `path`, read without prompting.

    A model_type of `PUBLISHED_MODEL_TYPES` is read by the transformers class the table names
    (its `auto_map` dropped, nothing executed); a model_type transformers knows is read by
    transformers' own class (`trust_remote_code=False`: a published `auto_map` beside it is not
    run); any other with an `auto_map` raises TargetConfigError naming `--trust-remote-code`
    unless `trust_remote_code`. A `quantization_config` is kept as data: no kernel is imported.
    Raises TargetFileMissing without config.json, InvalidTargetConfig for one that is not JSON or
    holds a field value its strict config class refuses (e.g. a config saved by another release),
    TargetConfigError for one that transformers rejects otherwise, naming the file
    (TargetFileError, an OSError, when transformers cannot read a file).
    """
    path = Path(path)
    file = path / "config.json"
    data = _config_json(file)
    model_type = data.get("model_type") if isinstance(data, dict) else None
    known = model_type in CONFIG_MAPPING
    if model_type not in PUBLISHED_MODEL_TYPES and not known:
        _refuse_remote_code(file, data, model_type, trust_remote_code)
    try:
        if model_type in PUBLISHED_MODEL_TYPES:
            fields = {k: v for k, v in data.items() if k not in ("model_type", *REMOTE_CODE_KEYS)}
            return AutoConfig.for_model(PUBLISHED_MODEL_TYPES[model_type], **fields)
        return AutoConfig.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code and not known
        )
    except OSError as e:
        raise TargetFileError(str(e)) from e
    except ValueError as e:
        raise TargetConfigError(str(e)) from e
    except (TypeError, StrictDataclassError) as e:  # a field value its strict config class rejects
        reason = " ".join(str(e).split())
        raise InvalidTargetConfig(f"{file}: transformers cannot read it ({reason})") from e


def _config_json(file: Path) -> Any:
    """The JSON value of a target's config.json; TargetFileMissing when it is not there,
    TargetFileError when it cannot be read, InvalidTargetConfig when it is not JSON text."""
    if not file.is_file():
        raise TargetFileMissing(
            f"{file.parent}: no config.json; pass the target's transformers directory"
        )
    try:
        return json.loads(file.read_text())
    except OSError as e:
        reason = unreadable(e)
        raise TargetFileError(
            f"{file}: cannot be read ({reason}); {TARGET_CONFIG_FIX}", reason
        ) from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        reason = unreadable(e) if isinstance(e, UnicodeDecodeError) else str(e)
        raise InvalidTargetConfig(f"{file}: not valid JSON ({reason}); {TARGET_CONFIG_FIX}") from e


def _refuse_remote_code(file: Path, data: Any, model_type: Any, trust_remote_code: bool) -> None:
    """TargetConfigError naming `--trust-remote-code` for a model_type only the model's own code
    (`auto_map`) defines, unless `trust_remote_code`."""
    if isinstance(data, dict) and data.get("auto_map") and not trust_remote_code:
        known = ", ".join(sorted(PUBLISHED_MODEL_TYPES))
        raise TargetConfigError(
            f"{file}: model_type {model_type!r} is defined by the model's own code (auto_map), "
            f"which specdraft does not run unasked (it reads {known} and transformers' own "
            "types); pass --trust-remote-code to run that code, or a target of a known type"
        )


TARGET_WEIGHTS_FIX = (
    "re-download the target's weights from where the model came from (its Hugging Face "
    "repository or the original download)"
)


def target_weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a transformers target directory: the shards its
    model.safetensors.index.json names, else model.safetensors (present or not).
    TargetConfigError naming an index that cannot be read or holds no weight_map."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return [path / "model.safetensors"]
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        reason = unreadable(e) if isinstance(e, OSError | UnicodeDecodeError) else repr(e)
        raise TargetConfigError(
            f"{index}: not a sharded-weights index ({reason}); {TARGET_WEIGHTS_FIX}"
        ) from None


def check_target_weights(path: str | Path) -> None:
    """DamagedFile naming the first of `target_weight_files` that is there but cut short or not
    safetensors (`checkpoint.open_safetensors`), with TARGET_WEIGHTS_FIX. Reads the headers only."""
    from specdraft.checkpoint import open_safetensors

    for file in target_weight_files(path):
        if file.is_file():
            with open_safetensors(file, TARGET_WEIGHTS_FIX):
                pass


def config_hash(config: PretrainedConfig) -> str:
    """sha256 hex of the text config, keys sorted, without `_VOLATILE_CONFIG_KEYS`.

    The same network gives the same hash whether its config was built in code or read from
    a saved directory. Uses transformers' diff form (what save_pretrained writes), so a
    transformers release that adds config fields may change it.
    """
    fields = json.loads(config.get_text_config().to_json_string(use_diff=True))
    for key in _VOLATILE_CONFIG_KEYS:
        fields.pop(key, None)
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def target_generation_config(path: str | Path) -> GenerationConfig:
    """The generation config transformers gives a model loaded from the target directory `path`:
    its generation_config.json, else the one built from its config.json (`read_target_config`,
    `GenerationConfig.from_model_config`: config.json's eos_token_id). Raises TargetFileError (an
    OSError) naming a generation_config.json that is not JSON, and what `read_target_config` raises."""
    path = Path(path)
    if (path / "generation_config.json").is_file():
        try:
            return GenerationConfig.from_pretrained(path, local_files_only=True)
        except OSError as e:
            raise TargetFileError(str(e)) from e
    return GenerationConfig.from_model_config(read_target_config(path))


def end_token_ids(tokenizer: Any, generation: str | Path | GenerationConfig) -> list[int]:
    """The ids a generation of the target ends at, sorted: the tokenizer's eos_token_id and the
    generation config's eos_token_id (an int or a list; None adds none), the list transformers
    `generate` and vLLM stop at (Llama-3.1-Instruct: [128001, 128008, 128009], the tokenizer's
    EOS one of them). `generation`: a loaded model's generation_config, or the target directory
    (`target_generation_config`). `generate`, `serve` and `regenerate` stop here.
    Raises TargetConfigError naming the source when eos_token_id is not an int or a list of ints."""
    config = (
        generation
        if isinstance(generation, GenerationConfig)
        else target_generation_config(generation)
    )
    listed = config.eos_token_id
    listed = [listed] if isinstance(listed, int) else (listed or [])
    if not isinstance(listed, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in listed
    ):
        where = "the loaded target" if isinstance(generation, GenerationConfig) else generation
        raise TargetConfigError(
            f"{where}: generation config eos_token_id {config.eos_token_id!r} is not a token id or "
            "a list of them; write an int or a list of ints as eos_token_id in generation_config.json"
        )
    own = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    return sorted({*listed, *own})
