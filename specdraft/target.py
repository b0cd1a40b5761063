"""Load a transformers target; aux hidden states + logits through forward hooks.

specdraft names a residual stream by index (shared/DESIGN.md, "Aux hidden-state layers"):
0 = input of decoder layer 1 (the embedding output, after any scaling the model applies);
k in 1..L = output of decoder layer k (1-based). Index L is the last layer's output *before*
the final norm, which transformers' `hidden_states[L]` is not (it is taken after the norm).

The parts are found from the model (`text_decoder`: transformers 5's `get_decoder()`, which
multimodal wrappers point at their language model); the text model_type must be in
`TARGET_CLASSES` (the engines' rule classes); checked against transformers 5.24.
A target's config.json is read as published by `read_target_config` (every check that needs
only sizes and class uses it): never a remote-code prompt, never a quantization kernel.
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

# Config model_type -> class built when a config names no `architectures` (transformers 5.24's
# auto mappings: a multimodal model_type builds its conditional-generation wrapper).
_DEFAULT_CLASSES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mistral": "MistralForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "llava": "LlavaForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "mistral3": "Mistral3ForConditionalGeneration",
    "kimi_k25": "Kimi_K25ForConditionalGeneration",
    "llama4": "Llama4ForConditionalGeneration",
}

# Text config model_type -> target class, the key of the engines' aux-id rules
# (`conventions.ENGINE_RULES`; one model file per engine). Phi-3 is "llama": SGLang 0.5.23
# llama.py and vLLM 0.32.0 phi3.py both subclass their LlamaForCausalLM.
TARGET_CLASSES: dict[str, str] = {
    "llama": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "mistral": "llama",
    "phi3": "llama",
    "qwen3_moe": "qwen3_moe",
    "gpt_oss": "gpt_oss",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "llama4_text": "llama4",
    "qwen2_vl_text": "qwen2_vl",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
}

# Multimodal wrappers the engines load as their own class (sglang 0.5.23 llava.py / mistral.py
# / kimi_k25.py, vllm 0.32.0 llava.py / mistral3.py / kimi_k25.py), whatever their text model_type.
# Kimi-K2.5's published config names KimiK25ForConditionalGeneration (remote code), transformers
# 5.24 Kimi_K25ForConditionalGeneration: both load as the engines' KimiK25ForConditionalGeneration.
_WRAPPER_CLASSES: dict[str, str] = {
    "LlavaForConditionalGeneration": "llava",
    "Mistral3ForConditionalGeneration": "llava",
    "Kimi_K25ForConditionalGeneration": "deepseek",
    "KimiK25ForConditionalGeneration": "deepseek",
}


# transformers class -> the class name the engines load the same checkpoint as, where they differ
# (sglang 0.5.23 kimi_k25.py / vllm 0.32.0 kimi_k25.py: KimiK25ForConditionalGeneration, the
# name Kimi-K2.5's published config.json gives).
ENGINE_ARCHITECTURES: dict[str, str] = {"Kimi_K25ForConditionalGeneration": "KimiK25ForConditionalGeneration"}


def target_class_of(architecture: str | None, text_model_type: str) -> str | None:
    """The engines' rule class of a target (`conventions.TARGET_CLASSES`): the wrapper's own
    class for a multimodal wrapper in `_WRAPPER_CLASSES`, else by the text model_type; None
    when neither is known."""
    return _WRAPPER_CLASSES.get(architecture or "") or TARGET_CLASSES.get(text_model_type)


# Per-class deviations (transformers 5.24 modeling_gemma2.py / modeling_gemma3.py): the final
# norm scales by (1 + weight), so the Llama-form weight a store records is 1 + weight.
_NORM_PLUS_ONE = frozenset({"gemma2", "gemma3_text"})


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
    """A transformers decoder LM (or a multimodal wrapper around one) with its text decoder's
    parts located by `text_decoder`.

    Raises ValueError naming the class when its text model_type is not in `TARGET_CLASSES` or
    no text decoder with embed_tokens, layers and norm is found.
    """

    def __init__(self, model: PreTrainedModel):
        name = type(model).__name__
        text_config = model.config.get_text_config()
        if text_config.model_type not in TARGET_CLASSES:
            raise ValueError(
                f"unsupported text model_type {text_config.model_type!r} in {name}; "
                f"supported: {', '.join(TARGET_CLASSES)}"
            )
        decoder = text_decoder(model)
        self.model = model
        self._causal_lm = causal_lm(model)
        self._config = text_config
        self._text_model = decoder
        self._embed_tokens = decoder.embed_tokens
        self._layers = decoder.layers
        self._final_norm = decoder.norm
        self._lm_head = model.get_output_embeddings()
        if len(self._layers) != text_config.num_hidden_layers:
            raise ValueError(
                f"{name} has {len(self._layers)} decoder layers but its text config "
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
        """The engines' rule class (`target_class_of`): "llama" (Llama, Qwen2, Qwen3, Mistral,
        Phi-3), "deepseek" (DeepSeek-V2/V3, Kimi-K2.5), "llava" (Llava, Mistral3), or the class's own."""
        return target_class_of(self.architecture, self._config.model_type)

    @property
    def layers(self) -> nn.ModuleList:
        """The text decoder's layer stack (L modules)."""
        return self._layers

    @property
    def causal_lm(self) -> nn.Module:
        """The module whose forward gives the logits (`causal_lm`)."""
        return self._causal_lm

    @property
    def text_model(self) -> nn.Module:
        """The text decoder: embedding -> layers -> final norm on input_ids (no lm_head)."""
        return self._text_model

    def head_norm_weight(self) -> torch.Tensor:
        """The final norm as a Llama-form RMSNorm weight [H] (x * rsqrt(mean x^2 + eps) * w):
        the norm's weight, or 1 + weight for Gemma 2 / 3 (`_NORM_PLUS_ONE`)."""
        return llama_form_norm(self._final_norm.weight.detach(), self._config.model_type)

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
        with torch.inference_mode(), capture_states(self._layers, {*indices, last}) as states:
            kwargs = dict(
                input_ids=input_ids,
                attention_mask=attention_mask,
                use_cache=False,
                output_hidden_states=False,
            )
            if return_logits:
                logits = self._causal_lm(**kwargs).logits.float()
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
def capture_states(layers: nn.ModuleList, indices: set[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Hooks on the decoder layers for specdraft `indices` only (0 = layer 1's input, k = layer
    k's output); yields {index: [B, T, H]} filled by the forward run inside; removed on exit."""
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


def llama_form_norm(weight: torch.Tensor, text_model_type: str) -> torch.Tensor:
    """A final-norm weight as a Llama-form RMSNorm weight: 1 + weight for Gemma 2 / 3
    (`_NORM_PLUS_ONE`: x * rsqrt(mean x^2 + eps) * (1 + w)), else the weight itself."""
    return weight + 1 if text_model_type in _NORM_PLUS_ONE else weight


def head_weight_keys(config: PretrainedConfig) -> tuple[str, dict[str, str]]:
    """The class `config` builds and the checkpoint keys of the parts a capture store keeps
    ("norm.weight", "lm_head.weight", "embed_tokens.weight" -> e.g. "model.norm.weight"): the
    module paths of its text decoder's norm and embedding and of its lm_head (`text_decoder`),
    in the class built on the meta device (no memory, no weights read). What a capture that runs
    the network elsewhere (vLLM) reads from the files. Raises ValueError naming an unsupported class."""
    model_class = _model_class(config)
    with torch.device("meta"):
        model = model_class(copy.deepcopy(config))
    decoder = text_decoder(model)
    path = {module: name for name, module in model.named_modules()}
    parts = {"norm.weight": decoder.norm, "lm_head.weight": model.get_output_embeddings(),
             "embed_tokens.weight": decoder.embed_tokens}
    return model_class.__name__, {name: f"{path[module]}.weight" for name, module in parts.items()}


def _model_class(config: PretrainedConfig) -> type[PreTrainedModel]:
    architectures = getattr(config, "architectures", None) or []
    name = architectures[0] if architectures else _DEFAULT_CLASSES.get(config.model_type)
    model_class = getattr(transformers, name, None) if name else None
    if model_class is None:
        raise ValueError(
            f"unsupported target class {name or '(none)'} (model_type {config.model_type!r}); "
            f"supported: {', '.join(_DEFAULT_CLASSES.values())}"
        )
    return model_class


def causal_lm(model: PreTrainedModel) -> nn.Module:
    """The module to run for logits: a wrapper's `language_model` when that is a causal LM owning
    the wrapper's lm_head (Llama4ForConditionalGeneration: its own forward fails on text-only
    input in transformers 5.24, reading image_outputs of the text model's output), else `model`."""
    inner = getattr(model, "language_model", None)
    if isinstance(inner, PreTrainedModel) and inner.get_output_embeddings() is model.get_output_embeddings():
        return inner
    return model


def text_decoder(model: PreTrainedModel) -> nn.Module:
    """The text decoder of a causal LM or a multimodal wrapper: `get_decoder()` (transformers 5),
    else its `.model` (Llama4ForCausalLM: get_decoder() returns itself in 5.24, its
    base_model_prefix names no attribute; Llama4ForConditionalGeneration's is that class).
    Raises ValueError naming the class when the decoder lacks embed_tokens, layers or norm."""
    decoder = model.get_decoder()
    for _ in range(2):  # Llama4ForConditionalGeneration: get_decoder() is a Llama4ForCausalLM
        inner = getattr(decoder, "model", None)
        if hasattr(decoder, "layers") or not isinstance(inner, nn.Module):
            break
        decoder = inner
    missing = [part for part in ("embed_tokens", "layers", "norm") if not hasattr(decoder, part)]
    if missing or model.get_output_embeddings() is None:
        raise ValueError(f"unsupported target class {type(model).__name__}: its text decoder "
                         f"{type(decoder).__name__} has no {', '.join(missing) or 'lm_head'}; specdraft "
                         "reads a decoder with embed_tokens, layers and norm under an lm_head")
    return decoder


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
