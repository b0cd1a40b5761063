"""SGLang in this process, on the CPU: the stand-in modules, the single-process set-up, loading a
model directory through the server's loader and running SGLang's own forward.

Everything SGLang needs set before its first import happens in `prepare()` (conftest calls it):
`SGLANG_USE_CPU_ENGINE=1` (else rotary embedding imports vLLM's custom ops; with it every layer
runs its native torch path) and two stand-in modules. The path taken is the server's:
`ModelConfig` -> `model_loader.get_model` -> `DefaultModelLoader` -> the model's `load_weights`,
then `forward` with the torch-native attention backend over SGLang's own KV pool.

The version switches (comment at each): how the server-args object is published, how the parallel
state is read, where the attention backend and the pools live during a forward. Each is told
apart by the API the installed release has, so a release between the pinned ones takes the branch
of the API it ships.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import types
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

VERSION = importlib.metadata.version("sglang")
_STARTED: list[bool] = []


class _Placeholder(type):
    """A class whose every attribute is another placeholder (`InterpolationMode.BILINEAR`)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})


class _AnyName(types.ModuleType):
    """torchvision's stand-in: any attribute is a placeholder class (imported by transformers'
    and SGLang's image code, never called on this path)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})


class _NoKernels(types.ModuleType):
    """sgl_kernel's stand-in: any name imports, and calling it raises (none is called on this path).

    Submodules stay missing, so `from sgl_kernel.scalar_type import ...` fails and SGLang takes
    its own fallback."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def never(*args, **kwargs):
            raise RuntimeError(f"sgl_kernel.{name} called: the CPU tier has no sgl_kernel")

        return never


# Stand-ins by top-level name. sgl_kernel.scalar_type stays missing: SGLang then builds its own
# scalar types (a stand-in would give it placeholders that fail at import).
_STAND_INS = {"torchvision": _AnyName, "sgl_kernel": _NoKernels}
_MISSING = ("sgl_kernel.scalar_type",)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stand-ins and every submodule of them (VLM configs import torchvision's
    transforms; 0.5.1x's host KV pool imports sgl_kernel.kvcacheio)."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _STAND_INS and name not in _MISSING:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _STAND_INS[spec.name.split(".")[0]](spec.name)

    def exec_module(self, module):
        module.__version__ = "0.0.0"
        module.__path__ = []


def prepare() -> None:
    """Set SGLang's CPU engine switch and install the stand-ins, before sglang is first imported.

    transformers sees the torchvision stand-in as installed (version 0.0.0 from its
    `__version__`: no metadata) and imports placeholders from it; >= 5.6 refuses to register
    SGLang's image processors without it. No CPU sgl-kernel wheel exists.
    """
    if "sglang" in sys.modules:
        raise RuntimeError("sglang was imported before the tier's set-up (tests/sglang_tier)")
    if importlib.util.find_spec("torchvision") is not None:
        raise RuntimeError("torchvision is installed in the SGLang venv; the tier needs it absent")
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    sys.meta_path.insert(0, _StandInFinder())


def _publish(path: Path, dtype: str):
    """A server-args object for `path` (CPU, torch-native attention, `dtype`), published
    process-wide."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(path),
        device="cpu",
        dtype=dtype,
        attention_backend="torch_native",
        skip_tokenizer_init=True,
    )
    try:  # switch 1: >= 0.5.2x publishes through runtime_context (re-publishing: last one wins)
        from sglang.srt.runtime_context import SpawnRanks, publish
    except ImportError:  # 0.5.1x and older: a module-level global in server_args
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(args)
    else:
        publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    return args


def _start() -> None:
    """A one-process gloo 'distributed' state (world size 1) and model-parallel groups of 1."""
    if _STARTED:
        return
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
    )
    # switch 2: >= 0.5.2x reads the widths from the published args, older takes them as
    # arguments; both default to 1
    initialize_model_parallel()
    _STARTED.append(True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Loaded:
    """A model SGLang built and loaded from a directory.

    model: SGLang's model (LlamaForCausalLMEagle3 for a drafter). given: every (name, tensor) the
    server's loader handed to its load_weights, in order. unwritten: the parameters still NaN
    after loading (every parameter is NaN-filled first, so SGLang's silence shows here).
    """

    model: torch.nn.Module
    given: dict[str, torch.Tensor]
    unwritten: list[str]


def load(path: str | Path, *, draft: bool, dtype: str) -> Loaded:
    """Build and load the model in `path` as the server does (draft: as the speculative draft),
    in `dtype` ("float32" | "bfloat16": the server's --dtype; its "auto" runs a float32 config
    in float16). Every parameter is filled with NaN before SGLang's load_weights runs."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model
    from sglang.srt.model_loader.utils import get_model_architecture

    args = _publish(Path(path), dtype)
    _start()
    config = ModelConfig.from_server_args(args, model_path=str(path), is_draft_model=draft)
    _dp_attention(args, config)
    cls = get_model_architecture(config)[0]
    with _nan_first(cls) as given:
        model = get_model(
            model_config=config,
            load_config=LoadConfig(load_format="auto"),
            device_config=DeviceConfig("cpu"),
        )
    unwritten = [n for n, p in model.named_parameters() if torch.isnan(p.float()).any()]
    return Loaded(model.eval(), given, unwritten)


def _dp_attention(args, config) -> None:
    """switch 6: 0.5.1x keeps the attention data-parallel widths (size 1 here) in module globals
    that its initialize_dp_attention(args, model_config) sets and Qwen3's attention reads;
    >= 0.5.2x derives them from the published args."""
    import inspect

    from sglang.srt.layers import dp_attention

    if "model_config" in inspect.signature(dp_attention.initialize_dp_attention).parameters:
        dp_attention.initialize_dp_attention(args, config)


def set_embed(model: torch.nn.Module, embedding: torch.Tensor) -> None:
    """SGLang's own `set_embed(target embedding)`, as its EAGLE worker calls it on an EAGLE-3
    drafter. switch 5: 0.5.1x ends it with torch.cuda.empty_cache / synchronize, which a CPU
    torch refuses: no-ops while it runs (>= 0.5.2x asks the platform)."""
    weight = torch.nn.Parameter(embedding.clone(), requires_grad=False)
    cuda = torch.cuda.empty_cache, torch.cuda.synchronize
    torch.cuda.empty_cache = torch.cuda.synchronize = lambda *a, **k: None
    try:
        model.set_embed(weight)
    finally:
        torch.cuda.empty_cache, torch.cuda.synchronize = cuda


@contextmanager
def _nan_first(cls):
    """While active, `cls.load_weights` NaN-fills the model's parameters first and records what
    it is given."""
    original, given = cls.load_weights, {}

    def load_weights(self, weights):
        with torch.no_grad():
            for p in self.parameters():
                if p.is_floating_point():
                    p.fill_(float("nan"))

        def recorded():
            for name, tensor in weights:
                given[name] = tensor.detach().clone()
                yield name, tensor

        return original(self, recorded())

    cls.load_weights = load_weights
    try:
        yield given
    finally:
        cls.load_weights = original


class Runner:
    """SGLang's request table, KV pool and torch-native attention backend for one model, and the
    model's own forward over one request: `extend` (a prompt, or more tokens after it) and
    `decode` (one token). The request sits in table row 1 (0.5.2x keeps row 0 as padding), its
    tokens in KV slots 1.. in order."""

    def __init__(self, model: torch.nn.Module, capacity: int = 128) -> None:
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

        attns = [m for m in model.modules() if isinstance(m, RadixAttention)]
        dtype = next(model.parameters()).dtype
        self.model, self.length = model, 0
        self.req = ReqToTokenPool(
            size=2, max_context_len=capacity, device="cpu", enable_memory_saver=False
        )
        self.kv = MHATokenToKVPool(
            size=capacity + 1,
            page_size=1,
            dtype=dtype,
            head_num=attns[0].tp_k_head_num,
            head_dim=attns[0].qk_head_dim,
            layer_num=max(a.layer_id for a in attns) + 1,
            device="cpu",
            enable_memory_saver=False,
        )
        self.req.req_to_token[1] = torch.arange(1, capacity + 1, dtype=self.req.req_to_token.dtype)
        # switch 3: >= 0.5.2x backends keep the pools they were built with; older ones read them
        # from each ForwardBatch
        pools = SimpleNamespace(device="cpu", req_to_token_pool=self.req, token_to_kv_pool=self.kv)
        self.backend = TorchNativeAttnBackend(pools)

    def extend(self, ids: torch.Tensor, hidden: torch.Tensor | None = None, capture=None):
        """SGLang's forward in EXTEND mode over `ids` [T] (long) after the tokens already run;
        hidden: the drafter's input states [T, width] (spec_info.hidden_states), None for a
        target. capture: a CaptureHiddenMode (default FULL: the aux states of every position).
        Returns SGLang's LogitsProcessorOutput (next_token_logits of the last position)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        return self._forward(ForwardMode.EXTEND, ids, hidden, capture)

    def decode(self, ids: torch.Tensor, hidden: torch.Tensor | None = None, capture=None):
        """SGLang's forward in DECODE mode for one token `ids` [1]; as `extend` otherwise."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        return self._forward(ForwardMode.DECODE, ids, hidden, capture)

    @torch.no_grad()
    def _forward(self, mode, ids, hidden, capture):
        batch = self._batch(mode, ids, hidden, capture)
        with self._context(batch):
            self.backend.init_forward_metadata(batch)
            out = self.model.forward(ids, batch.positions, batch)
        self.length += len(ids)
        return out

    def _batch(self, mode, ids, hidden, capture):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

        n, past = len(ids), self.length
        return ForwardBatch(
            forward_mode=mode,
            batch_size=1,
            input_ids=ids,
            req_pool_indices=torch.tensor([1]),
            seq_lens=torch.tensor([past + n]),
            seq_lens_cpu=torch.tensor([past + n]),
            out_cache_loc=torch.arange(past + 1, past + n + 1),
            seq_lens_sum=past + n,
            positions=torch.arange(past, past + n),
            extend_prefix_lens=torch.tensor([past]),
            extend_seq_lens=torch.tensor([n]),
            extend_prefix_lens_cpu=[past],
            extend_seq_lens_cpu=[n],
            extend_num_tokens=n,
            spec_info=None if hidden is None else SimpleNamespace(hidden_states=hidden),
            capture_hidden_mode=capture or CaptureHiddenMode.FULL,
        )

    def _context(self, batch):
        """switch 4: >= 0.5.2x layers find the backend in a forward context; older ones in the
        ForwardBatch, with the pools."""
        try:
            from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
        except ImportError:
            batch.attn_backend = self.backend
            batch.req_to_token_pool, batch.token_to_kv_pool = self.req, self.kv
            return nullcontext()
        return forward_context(ForwardContext(attn_backend=self.backend))
