"""Load a transformers target; aux hidden states + logits through forward hooks.

specdraft names a residual stream by index (shared/DESIGN.md, "Aux hidden-state layers"):
0 = input of decoder layer 1 (the embedding output, after any scaling the model applies);
k in 1..L = output of decoder layer k (1-based). Index L is the last layer's output *before*
the final norm, which transformers' `hidden_states[L]` is not (it is taken after the norm).

The parts are found from the model (`text_decoder`: transformers 5's `get_decoder()`, which
multimodal wrappers point at their language model); the text model_type must be in
`TARGET_CLASSES` (the engines' rule classes); checked against transformers 5.24.
A target's config.json is read as published by `target.config.read_target_config` (every check
that needs only sizes and class uses it): never a remote-code prompt, never a quantization kernel.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from specdraft.conventions import ConventionError
from specdraft.targets.config import (
    DEFAULT_CLASSES,
    TARGET_CLASSES,
    TargetConfigError,
    TargetFileError,
    TargetFileMissing,
    check_target_weights,
    read_target_config,
    target_class_of,
)

# Per-class deviations (transformers 5.24 modeling_gemma2.py / modeling_gemma3.py, 5.25
# modeling_qwen3_5.py / modeling_qwen3_5_moe.py Qwen3_5RMSNorm): the final norm scales by
# (1 + weight), so the Llama-form weight a store records is 1 + weight. (Gemma 4's scales by w.)
_NORM_PLUS_ONE = frozenset({"gemma2", "gemma3_text", "qwen3_5_text", "qwen3_5_moe_text"})


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

    Attributes: `model` (as given); `config`, the text model's config (for Llava:
    `config.text_config`); `causal_lm`, the module whose forward gives the logits (`causal_lm`);
    `text_model`, the text decoder (embedding -> layers -> final norm on input_ids, no lm_head)
    and its `embed_tokens`, `layers` (L modules) and `final_norm`; `lm_head`; `num_layers` (L),
    `hidden_size`, `vocab_size`; `architecture`, the transformers class name, e.g. "LlamaForCausalLM".

    Raises TargetConfigError (a ValueError) naming the class when its text model_type is not in
    `TARGET_CLASSES` or no text decoder with embed_tokens, layers and norm is found.
    """

    def __init__(self, model: PreTrainedModel):
        name = type(model).__name__
        text_config = model.config.get_text_config()
        if text_config.model_type not in TARGET_CLASSES:
            raise TargetConfigError(
                f"unsupported text model_type {text_config.model_type!r} in {name}; "
                f"supported: {', '.join(TARGET_CLASSES)}"
            )
        decoder = text_decoder(model)
        self.model = model
        self.causal_lm = causal_lm(model)
        self.config: PretrainedConfig = text_config
        self.text_model = decoder
        self.embed_tokens: nn.Module = decoder.embed_tokens
        self.layers: nn.ModuleList = decoder.layers
        self.final_norm: nn.Module = decoder.norm
        self.lm_head: nn.Module = model.get_output_embeddings()
        self.num_layers = len(self.layers)
        self.hidden_size, self.vocab_size = text_config.hidden_size, text_config.vocab_size
        self.architecture = name
        if len(self.layers) != text_config.num_hidden_layers:
            raise TargetConfigError(
                f"{name} has {len(self.layers)} decoder layers but its text config "
                f"says num_hidden_layers={text_config.num_hidden_layers}"
            )

    @property
    def target_class(self) -> str:
        """The engines' rule class (`target_class_of`): "llama" (Llama, Mistral, Phi-3), "qwen"
        (Qwen2, Qwen3), "deepseek" (DeepSeek-V2/V3, Kimi-K2.5), "llava" (Llava, Mistral3), or
        the class's own."""
        return target_class_of(self.architecture, self.config.model_type)

    def head_norm_weight(self) -> torch.Tensor:
        """The final norm as a Llama-form RMSNorm weight [H] (x * rsqrt(mean x^2 + eps) * w):
        the norm's weight, or 1 + weight for Gemma 2 / 3 and Qwen3.5 (`_NORM_PLUS_ONE`)."""
        return llama_form_norm(self.final_norm.weight.detach(), self.config.model_type)

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
        Raises ConventionError (a ValueError) for an index out of 0..L, a repeated index or a
        non-int.
        """
        indices = self._check_aux_layers(aux_layers)
        last = self.num_layers
        logits = None
        with torch.inference_mode(), capture_states(self.layers, {*indices, last}) as states:
            kwargs = dict(
                input_ids=input_ids,
                attention_mask=attention_mask,
                use_cache=False,
                output_hidden_states=False,
            )
            if return_logits:
                logits = self.causal_lm(**kwargs).logits.float()
            else:
                self.text_model(**kwargs)
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
                raise ConventionError(
                    f"aux layer {k!r} is not a specdraft index in 0..{self.num_layers} "
                    f"(0 = embeddings, {self.num_layers} = last layer output before the norm)"
                )
        if len(set(indices)) != len(indices):
            raise ConventionError(f"aux layers {indices} repeat an index; name each layer once")
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
    Raises TargetFileMissing (a FileNotFoundError) for a path without config.json,
    TargetConfigError (a ValueError) for an EAGLE-3 drafter directory, an unsupported class (naming
    it) or a checkpoint whose weights do not match the model (TargetFileError, an OSError, for
    weight files transformers cannot read), DamagedFile (also a ValueError) for a truncated
    weights file (`check_target_weights`).
    """
    if isinstance(source, PretrainedConfig):
        model_class = _model_class(source)
        model = _init_from_config(model_class, source, dtype, torch.device(device), seed)
    else:
        model = _load_directory(Path(source), dtype, device)
    return Target(model.eval())


def llama_form_norm(weight: torch.Tensor, text_model_type: str) -> torch.Tensor:
    """A final-norm weight as a Llama-form RMSNorm weight: 1 + weight for Gemma 2 / 3, Qwen3.5
    (`_NORM_PLUS_ONE`: x * rsqrt(mean x^2 + eps) * (1 + w)), else the weight itself."""
    return weight + 1 if text_model_type in _NORM_PLUS_ONE else weight


def head_weight_keys(config: PretrainedConfig) -> tuple[str, dict[str, str]]:
    """The class `config` builds and the checkpoint keys of the parts a capture store keeps
    ("norm.weight", "lm_head.weight", "embed_tokens.weight" -> e.g. "model.norm.weight"): the
    module paths of its text decoder's norm and embedding and of its lm_head (`text_decoder`),
    in the class built on the meta device (no memory, no weights read). What a capture that runs
    the network elsewhere (vLLM) reads from the files. Raises TargetConfigError naming an
    unsupported class."""
    model_class = _model_class(config)
    with torch.device("meta"):
        model = model_class(copy.deepcopy(config))
    decoder = text_decoder(model)
    path = {module: name for name, module in model.named_modules()}
    parts = {
        "norm.weight": decoder.norm,
        "lm_head.weight": model.get_output_embeddings(),
        "embed_tokens.weight": decoder.embed_tokens,
    }
    return model_class.__name__, {name: f"{path[module]}.weight" for name, module in parts.items()}


def target_embedding(path: str | Path) -> torch.Tensor:
    """The input embedding [vocab, hidden] of the target directory `path`, as stored (its dtype),
    read from its safetensors files by the key its class gives it (`head_weight_keys`); nothing
    else is read. Raises TargetFileMissing (a FileNotFoundError) naming the directory when no
    file holds it, DamagedFile for a file cut short (`checkpoint.open_safetensors`)."""
    from specdraft.checkpoint import open_safetensors
    from specdraft.targets.config import TARGET_WEIGHTS_FIX, target_weight_files

    key = head_weight_keys(read_target_config(path))[1]["embed_tokens.weight"]
    for file in target_weight_files(path):
        if file.is_file():
            with open_safetensors(file, TARGET_WEIGHTS_FIX) as f:
                if key in f.keys():
                    return f.get_tensor(key)
    raise TargetFileMissing(f"{path}: no safetensors file holds the target's embedding {key}")


def _model_class(config: PretrainedConfig) -> type[PreTrainedModel]:
    architectures = getattr(config, "architectures", None) or []
    name = architectures[0] if architectures else DEFAULT_CLASSES.get(config.model_type)
    model_class = getattr(transformers, name, None) if name else None
    if model_class is None:
        raise TargetConfigError(
            f"unsupported target class {name or '(none)'} (model_type {config.model_type!r}); "
            f"supported: {', '.join(DEFAULT_CLASSES.values())}"
        )
    return model_class


def causal_lm(model: PreTrainedModel) -> nn.Module:
    """The module to run for logits: a wrapper's `language_model` when that is a causal LM owning
    the wrapper's lm_head (Llama4ForConditionalGeneration: its own forward fails on text-only
    input in transformers 5.24, reading image_outputs of the text model's output), else `model`."""
    inner = getattr(model, "language_model", None)
    if (
        isinstance(inner, PreTrainedModel)
        and inner.get_output_embeddings() is model.get_output_embeddings()
    ):
        return inner
    return model


def text_decoder(model: PreTrainedModel) -> nn.Module:
    """The text decoder of a causal LM or a multimodal wrapper: `get_decoder()` (transformers 5),
    else its `.model` (Llama4ForCausalLM: get_decoder() returns itself in 5.24, its
    base_model_prefix names no attribute; Llama4ForConditionalGeneration's is that class).
    Raises TargetConfigError naming the class when the decoder lacks embed_tokens, layers or norm."""
    decoder = model.get_decoder()
    for _ in range(2):  # Llama4ForConditionalGeneration: get_decoder() is a Llama4ForCausalLM
        inner = getattr(decoder, "model", None)
        if hasattr(decoder, "layers") or not isinstance(inner, nn.Module):
            break
        decoder = inner
    missing = [part for part in ("embed_tokens", "layers", "norm") if not hasattr(decoder, part)]
    if missing or model.get_output_embeddings() is None:
        raise TargetConfigError(
            f"unsupported target class {type(model).__name__}: its text decoder "
            f"{type(decoder).__name__} has no {', '.join(missing) or 'lm_head'}; specdraft "
            "reads a decoder with embed_tokens, layers and norm under an lm_head"
        )
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
        raise TargetFileMissing(f"{path}: no config.json; pass a transformers model directory")
    wrong = wrong_dir_message(path, "target")
    if wrong:
        raise TargetConfigError(wrong)
    config = read_target_config(path)  # as published: never prompts for remote code
    model_class = _model_class(config)
    check_target_weights(path)
    try:
        with no_progress_bars():
            model, info = model_class.from_pretrained(
                path, config=config, local_files_only=True, dtype=dtype, output_loading_info=True
            )
    except OSError as e:  # a weight file transformers looks for and does not find
        raise TargetFileError(str(e)) from e
    problems = {k: sorted(info[k]) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        raise TargetConfigError(f"{path}: weights do not match {model_class.__name__}: {problems}")
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
