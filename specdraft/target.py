"""Load a transformers target; aux hidden states + logits through forward hooks.

specdraft names a residual stream by index (shared/DESIGN.md, "Aux hidden-state layers"):
0 = input of decoder layer 1 (the embedding output, after any scaling the model applies);
k in 1..L = output of decoder layer k (1-based). Index L is the last layer's output *before*
the final norm, which transformers' `hidden_states[L]` is not (it is taken after the norm).

Where each part of a model lives is a table keyed by the model class (`_LAYOUTS`), checked
against transformers 5.17-5.24; an unknown class is an error, never a guess. A target's
config.json is read as published by `read_target_config` (every check that needs only sizes
and class uses it): never a remote-code prompt, never a quantization kernel.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from specdraft.errors import SpecdraftError


@dataclass(frozen=True)
class _Layout:
    """Dotted submodule paths, from the top-level model, of the parts specdraft reads."""

    embed_tokens: str
    layers: str  # nn.ModuleList of decoder layers
    final_norm: str
    lm_head: str
    text_model: str  # module that runs embedding -> layers -> norm on input_ids (no lm_head)


def _causal_lm_layout(base: str) -> _Layout:
    return _Layout(f"{base}.embed_tokens", f"{base}.layers", f"{base}.norm", "lm_head", base)


# Top-level transformers class -> layout. Source: transformers 5.x modeling_{llama,qwen2,qwen3,
# mistral,deepseek_v2,deepseek_v3,llava}.py (Llava: `model.language_model` is the base text
# model, `lm_head` sits on the top-level class).
_LAYOUTS: dict[str, _Layout] = {
    "LlamaForCausalLM": _causal_lm_layout("model"),
    "Qwen2ForCausalLM": _causal_lm_layout("model"),
    "Qwen3ForCausalLM": _causal_lm_layout("model"),
    "MistralForCausalLM": _causal_lm_layout("model"),
    "DeepseekV2ForCausalLM": _causal_lm_layout("model"),
    "DeepseekV3ForCausalLM": _causal_lm_layout("model"),
    "LlavaForConditionalGeneration": _causal_lm_layout("model.language_model"),
}

# Config model_type -> class built when a config names no `architectures`.
_DEFAULT_CLASSES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "llava": "LlavaForConditionalGeneration",
}

# Text config model_type -> target class, the key of the engines' aux-id rules (DESIGN.md:
# SGLang's DeepSeek class reads explicit ids differently from its Llama/Qwen classes).
TARGET_CLASSES: dict[str, str] = {
    "llama": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "mistral": "llama",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
}

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


@dataclass
class TargetOutput:
    """One target forward pass.

    logits:      [B, T, V] float32, or None when `return_logits=False`.
    aux_hidden:  [B, T, len(aux_layers) * H] in the model's dtype; the requested streams
                 concatenated along the last dim in the order requested.
    last_hidden: [B, T, H] in the model's dtype; specdraft index L (pre-final-norm).
    """

    logits: torch.Tensor | None
    aux_hidden: torch.Tensor
    last_hidden: torch.Tensor


class Target:
    """A transformers target model with its parts located through `_LAYOUTS`.

    Raises ValueError naming the class when the model's class or text model_type is unknown.
    """

    def __init__(self, model: PreTrainedModel):
        name = type(model).__name__
        if name not in _LAYOUTS:
            raise ValueError(f"unsupported target class {name}; supported: {', '.join(_LAYOUTS)}")
        text_config = model.config.get_text_config()
        if text_config.model_type not in TARGET_CLASSES:
            raise ValueError(
                f"unsupported text model_type {text_config.model_type!r} in {name}; "
                f"supported: {', '.join(TARGET_CLASSES)}"
            )
        layout = _LAYOUTS[name]
        self.model = model
        self._config = text_config
        self._embed_tokens = model.get_submodule(layout.embed_tokens)
        self._layers = model.get_submodule(layout.layers)
        self._final_norm = model.get_submodule(layout.final_norm)
        self._lm_head = model.get_submodule(layout.lm_head)
        self._text_model = model.get_submodule(layout.text_model)
        if len(self._layers) != text_config.num_hidden_layers:
            raise ValueError(
                f"{name} has {len(self._layers)} decoder layers at {layout.layers} but its config "
                f"says num_hidden_layers={text_config.num_hidden_layers}"
            )

    @property
    def config(self) -> PretrainedConfig:
        """The text model's config (for Llava: `config.text_config`)."""
        return self._config

    @property
    def num_layers(self) -> int:
        """L, the number of decoder layers of the text model."""
        return len(self._layers)

    @property
    def hidden_size(self) -> int:
        return self._config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self._config.vocab_size

    @property
    def architecture(self) -> str:
        """The transformers class name, e.g. "LlamaForCausalLM"."""
        return type(self.model).__name__

    @property
    def target_class(self) -> str:
        """"llama" (Llama, Qwen2, Qwen3, Mistral) or "deepseek" (DeepSeek-V2/V3)."""
        return TARGET_CLASSES[self._config.model_type]

    @property
    def embed_tokens(self) -> nn.Module:
        return self._embed_tokens

    @property
    def final_norm(self) -> nn.Module:
        return self._final_norm

    @property
    def lm_head(self) -> nn.Module:
        return self._lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        aux_layers: Sequence[int],
        return_logits: bool = True,
    ) -> TargetOutput:
        """Run the target once and keep only the requested residual streams.

        input_ids: [B, T] long; attention_mask: [B, T] (1 = real token) or None.
        aux_layers: specdraft indices in 0..L, in the order to concatenate them; no repeats.
        return_logits=False skips the lm_head (logits is None).
        Runs under torch.inference_mode: the outputs are inference tensors (clone them
        outside inference mode before they enter autograd).
        Raises ValueError for an index out of 0..L, a repeated index or a non-int.
        """
        indices = self._check_aux_layers(aux_layers)
        last = self.num_layers
        logits = None
        with torch.inference_mode(), _capture(self._layers, {*indices, last}) as states:
            kwargs = dict(
                input_ids=input_ids,
                attention_mask=attention_mask,
                use_cache=False,
                output_hidden_states=False,
            )
            if return_logits:
                logits = self.model(**kwargs).logits.float()
            else:
                self._text_model(**kwargs)
        last_hidden = states[last]
        if indices:
            aux_hidden = torch.cat([states[i] for i in indices], dim=-1)
        else:
            aux_hidden = last_hidden.new_empty(*last_hidden.shape[:-1], 0)
        return TargetOutput(logits=logits, aux_hidden=aux_hidden, last_hidden=last_hidden)

    __call__ = forward

    def _check_aux_layers(self, aux_layers: Sequence[int]) -> list[int]:
        indices = list(aux_layers)
        for k in indices:
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= self.num_layers:
                raise ValueError(
                    f"aux layer {k!r} is not a specdraft index in 0..{self.num_layers} "
                    f"(0 = embeddings, {self.num_layers} = last layer output before the norm)"
                )
        if len(set(indices)) != len(indices):
            raise ValueError(f"aux layers {indices} repeat an index; name each layer once")
        return indices


class _Recorder:
    """Hook callbacks that store exactly the residual streams asked for, keyed by index."""

    def __init__(self) -> None:
        self.states: dict[int, torch.Tensor] = {}

    def _store(self, index: int, hidden: torch.Tensor) -> None:
        if index in self.states:
            raise RuntimeError(f"residual stream {index} was produced twice in one forward pass")
        self.states[index] = hidden

    def layer_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        # index 0: exactly what layer 1 receives, so any embedding scaling is included
        self._store(0, args[0] if args else kwargs["hidden_states"])

    def layer_output(self, index: int, module: nn.Module, args: tuple, output) -> None:
        self._store(index, output[0] if isinstance(output, tuple) else output)


@contextlib.contextmanager
def _capture(layers: nn.ModuleList, indices: set[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Hooks on the decoder layers for `indices` only; removed on exit, also on error."""
    recorder = _Recorder()
    handles = []
    try:
        for k in sorted(indices):
            if k == 0:
                hook = layers[0].register_forward_pre_hook(recorder.layer_input, with_kwargs=True)
            else:
                hook = layers[k - 1].register_forward_hook(partial(recorder.layer_output, k))
            handles.append(hook)
        yield recorder.states
    finally:
        for hook in handles:
            hook.remove()


def load_target(
    source: str | Path | PretrainedConfig,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> Target:
    """Load a target from a local transformers directory, or build one from a config.

    A directory is loaded with the class its config names (`architectures[0]`), strictly:
    missing or unexpected weights are an error. Nothing is downloaded.
    A config gives a randomly initialised model, seeded by `seed` (values depend on seed,
    dtype and device type); the global RNG is left as it was. The model is in eval mode.
    Raises FileNotFoundError for a path without config.json, ValueError for an EAGLE-3 drafter
    directory, an unsupported class (naming it) or a checkpoint whose weights do not match the model,
    DamagedFile (also a ValueError) for a truncated weights file (`check_target_weights`).
    """
    if isinstance(source, PretrainedConfig):
        model_class = _model_class(source)
        model = _init_from_config(model_class, source, dtype, torch.device(device), seed)
    else:
        model = _load_directory(Path(source), dtype, device)
    return Target(model.eval())


TARGET_CONFIG_FIX = ("restore config.json from where the model came from (its Hugging Face repository or the "
                     "original download), or pass another transformers model directory")
# Keys every decoder target's config.json holds (a multimodal one in text_config) that specdraft reads.
TARGET_REQUIRED_KEYS = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                        "intermediate_size", "vocab_size")


def check_target_config(path: str | Path, config: dict, keys: Sequence[str] = TARGET_REQUIRED_KEYS) -> None:
    """ValueError naming `path`/config.json, the `keys` it lacks (at the top or in text_config)
    and the fix (TARGET_CONFIG_FIX); transformers would default a missing layer count silently."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    missing = [k for k in keys if config.get(k) is None and text.get(k) is None]
    if missing:
        raise ValueError(f"{Path(path) / 'config.json'}: missing {', '.join(missing)}, which a transformers "
                         f"model config holds; {TARGET_CONFIG_FIX}")


# model_type a published config names with its own code (auto_map) -> the transformers model_type
# whose config reads it. kimi_k2: moonshotai/Kimi-K2-Instruct's config.json (architectures
# DeepseekV3ForCausalLM, auto_map configuration_deepseek.DeepseekV3Config): the DeepSeek-V3 class.
PUBLISHED_MODEL_TYPES = {"kimi_k2": "deepseek_v3"}
# Keys of a published config that name its own code, dropped when specdraft's table reads it.
REMOTE_CODE_KEYS = ("auto_map",)


class TargetConfigError(SpecdraftError, ValueError):
    """A target config.json specdraft will not read (unknown remote code); names the file and the fix."""


def read_target_config(path: str | Path, trust_remote_code: bool = False) -> PretrainedConfig:
    """The transformers config of the target directory `path`, read without prompting.

    A model_type of `PUBLISHED_MODEL_TYPES` is read by the transformers class the table names
    (its `auto_map` dropped, nothing executed); a model_type transformers knows is read by
    transformers' own class (`trust_remote_code=False`: a published `auto_map` beside it is not
    run); any other with an `auto_map` raises TargetConfigError naming `--trust-remote-code`
    unless `trust_remote_code`. A `quantization_config` is kept as data: no kernel is imported.
    Raises FileNotFoundError without config.json, ValueError for a config transformers rejects.
    """
    path = Path(path)
    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no config.json; pass the target's transformers directory")
    data = json.loads(file.read_text())
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if model_type in PUBLISHED_MODEL_TYPES:
        fields = {k: v for k, v in data.items() if k not in ("model_type", *REMOTE_CODE_KEYS)}
        return AutoConfig.for_model(PUBLISHED_MODEL_TYPES[model_type], **fields)
    if model_type in CONFIG_MAPPING:
        return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    if isinstance(data, dict) and data.get("auto_map") and not trust_remote_code:
        known = ", ".join(sorted(PUBLISHED_MODEL_TYPES))
        raise TargetConfigError(f"{file}: model_type {model_type!r} is defined by the model's own code (auto_map), "
                                f"which specdraft does not run unasked (it reads {known} and transformers' own "
                                "types); pass --trust-remote-code to run that code, or a target of a known type")
    return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)


TARGET_WEIGHTS_FIX = ("re-download the target's weights from where the model came from (its Hugging Face "
                      "repository or the original download)")


def target_weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a transformers target directory: the shards its
    model.safetensors.index.json names, else model.safetensors (present or not)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return [path / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [path / "model.safetensors"]


def check_target_weights(path: str | Path) -> None:
    """DamagedFile naming the first of `target_weight_files` that is there but cut short or not
    safetensors (`checkpoint.open_safetensors`), with TARGET_WEIGHTS_FIX. Reads the headers only."""
    from specdraft.checkpoint import open_safetensors

    for file in target_weight_files(path):
        if file.is_file():
            with open_safetensors(file, TARGET_WEIGHTS_FIX):
                pass


def head_weight_keys(config: PretrainedConfig) -> tuple[str, dict[str, str]]:
    """The class `config` builds and the checkpoint keys of the parts a capture store keeps
    ("norm.weight", "lm_head.weight", "embed_tokens.weight" -> e.g. "model.norm.weight"), from
    `_LAYOUTS`: what a capture that runs the network elsewhere (vLLM) reads from the files.
    Raises ValueError naming an unsupported class."""
    name = _model_class(config).__name__
    layout = _LAYOUTS[name]
    return name, {"norm.weight": f"{layout.final_norm}.weight", "lm_head.weight": f"{layout.lm_head}.weight",
                  "embed_tokens.weight": f"{layout.embed_tokens}.weight"}


def _model_class(config: PretrainedConfig) -> type[PreTrainedModel]:
    architectures = getattr(config, "architectures", None) or []
    name = architectures[0] if architectures else _DEFAULT_CLASSES.get(config.model_type)
    if name not in _LAYOUTS:
        raise ValueError(
            f"unsupported target class {name or '(none)'} (model_type {config.model_type!r}); "
            f"supported: {', '.join(_LAYOUTS)}"
        )
    return getattr(transformers, name)


def _init_from_config(
    model_class: type[PreTrainedModel],
    config: PretrainedConfig,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
) -> PreTrainedModel:
    rng_devices = [device.index or 0] if device.type == "cuda" else []
    previous_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=rng_devices), device:
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)  # build in the target dtype: no float32 copy of big models
        try:
            model = model_class(copy.deepcopy(config))
        finally:
            torch.set_default_dtype(previous_dtype)
    return model


def _load_directory(path: Path, dtype: torch.dtype, device: str | torch.device) -> PreTrainedModel:
    from specdraft.checkpoint import wrong_dir_message

    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json; pass a transformers model directory")
    wrong = wrong_dir_message(path, "target")
    if wrong:
        raise ValueError(wrong)
    config = read_target_config(path)  # as published: never prompts for remote code
    model_class = _model_class(config)
    check_target_weights(path)
    with no_progress_bars():
        model, info = model_class.from_pretrained(
            path, config=config, local_files_only=True, dtype=dtype, output_loading_info=True
        )
    problems = {k: sorted(info[k]) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        raise ValueError(f"{path}: weights do not match {model_class.__name__}: {problems}")
    return model.to(device)


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """Hide transformers' tqdm bars ("Loading weights", shard loading) inside the block, then
    restore the previous setting. Warnings and log records are untouched. transformers 5.x
    draws these bars through `transformers.utils.logging.tqdm`, which these two switches
    (present since 4.x) turn off and on."""
    hf_logging = transformers.utils.logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    if was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


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
