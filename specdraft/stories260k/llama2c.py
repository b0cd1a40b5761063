"""llama2.c's legacy checkpoint format (`Config` and `read_checkpoint` in llama2.c's run.c): the
7-int32 header, the float32 tensors in file order, and their transformers `LlamaForCausalLM`
names and config. Format: shared/models/README.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig

from specdraft.errors import SpecdraftError

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2  # llama2.c's fixed ids of the special pieces
ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-5


class Llama2cError(SpecdraftError, ValueError):
    """A llama2.c file (checkpoint or tokenizer) cut short, damaged or not the one expected, or
    an output folder that holds something else than a conversion; names the file and the fix."""


HEADER = struct.Struct("<7i")


@dataclass(frozen=True)
class Llama2cHeader:
    """The 7-int32 header of a llama2.c legacy checkpoint (`Config` in llama2.c's run.c)."""

    dim: int
    hidden_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: (
        bool  # stored as the sign of vocab_size: positive = classifier is the embedding
    )

    @property
    def head_size(self) -> int:
        return self.dim // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_size

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the stored float32 arrays, in file order (rows = out, columns = in)."""
        num_layers, dim, hidden, kv_dim = self.num_layers, self.dim, self.hidden_dim, self.kv_dim
        shapes = {
            "token_embedding": (self.vocab_size, dim),
            "rms_att": (num_layers, dim),
            "wq": (num_layers, dim, dim),
            "wk": (num_layers, kv_dim, dim),
            "wv": (num_layers, kv_dim, dim),
            "wo": (num_layers, dim, dim),
            "rms_ffn": (num_layers, dim),
            "w1": (num_layers, hidden, dim),
            "w2": (num_layers, dim, hidden),
            "w3": (num_layers, hidden, dim),
            "rms_final": (dim,),
            # Precomputed RoPE tables, unused: the rotation is recomputed from theta.
            "freq_cis_real": (self.seq_len, self.head_size // 2),
            "freq_cis_imag": (self.seq_len, self.head_size // 2),
        }
        if not self.shared_classifier:
            shapes["wcls"] = (self.vocab_size, dim)
        return shapes

    def num_file_bytes(self) -> int:
        """The exact size of a file with this header."""
        return HEADER.size + 4 * sum(int(np.prod(shape)) for shape in self.tensor_shapes().values())


def read_llama2c_checkpoint(path: Path) -> tuple[Llama2cHeader, dict[str, torch.Tensor]]:
    """Read a llama2.c legacy checkpoint: its header and float32 tensors in llama2.c's layout.

    Tensors are named as in llama2.c (`token_embedding` [V, D], `wq` [L, D, D], `w1` [L, H, D],
    ..., `rms_final` [D], `wcls` [V, D] only when the classifier is not shared); the unused
    RoPE tables are dropped. Raises Llama2cError (a ValueError) naming the file when the header is implausible
    or the size differs from what the header implies (truncated or not this format).
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) < HEADER.size:
        raise Llama2cError(f"{path}: {len(data)} bytes, too short for a llama2.c checkpoint header")
    header = _parse_header(path, HEADER.unpack_from(data, 0))
    expected = header.num_file_bytes()
    if len(data) != expected:
        raise Llama2cError(
            f"{path}: {len(data):,} bytes, but its header {header} implies {expected:,}: "
            f"truncated, or not a llama2.c legacy checkpoint"
        )
    values = np.frombuffer(data, dtype="<f4", offset=HEADER.size)
    tensors, start = {}, 0
    for name, shape in header.tensor_shapes().items():
        count = int(np.prod(shape))
        if not name.startswith("freq_cis"):
            tensors[name] = torch.from_numpy(values[start : start + count].reshape(shape).copy())
        start += count
    if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
        raise Llama2cError(f"{path}: contains NaN or infinite weights: corrupted checkpoint")
    return header, tensors


def _parse_header(path: Path, fields: tuple[int, ...]) -> Llama2cHeader:
    dim, hidden_dim, num_layers, num_heads, num_kv_heads, vocab_size, seq_len = fields
    plausible = (
        min(dim, hidden_dim, num_layers, num_heads, num_kv_heads, seq_len, abs(vocab_size)) > 0
        and max(dim, hidden_dim, abs(vocab_size), seq_len) <= 1 << 20
        and dim % num_heads == 0
        and num_heads % num_kv_heads == 0
        and (dim // num_heads) % 2 == 0
    )
    if not plausible:
        raise Llama2cError(
            f"{path}: implausible llama2.c header {fields}: corrupted or not a llama2.c file"
        )
    return Llama2cHeader(
        dim,
        hidden_dim,
        num_layers,
        num_heads,
        num_kv_heads,
        abs(vocab_size),
        seq_len,
        vocab_size > 0,
    )


def llama_state_dict(
    header: Llama2cHeader, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Map llama2.c tensors to transformers `LlamaForCausalLM` names (float32, tied head).

    llama2.c rotates interleaved (even, odd) pairs of a head, transformers the two halves, so
    the rows of wq and wk are permuted per head: (head_size/2, 2) pairs -> (2, head_size/2).
    """
    embedding = tensors["token_embedding"]
    state = {"model.embed_tokens.weight": embedding, "model.norm.weight": tensors["rms_final"]}
    state["lm_head.weight"] = embedding if header.shared_classifier else tensors["wcls"]
    for layer in range(header.num_layers):
        prefix = f"model.layers.{layer}."
        state |= {
            prefix + "input_layernorm.weight": tensors["rms_att"][layer],
            prefix + "self_attn.q_proj.weight": _halves_from_pairs(
                tensors["wq"][layer], header.num_heads
            ),
            prefix + "self_attn.k_proj.weight": _halves_from_pairs(
                tensors["wk"][layer], header.num_kv_heads
            ),
            prefix + "self_attn.v_proj.weight": tensors["wv"][layer],
            prefix + "self_attn.o_proj.weight": tensors["wo"][layer],
            prefix + "post_attention_layernorm.weight": tensors["rms_ffn"][layer],
            prefix + "mlp.gate_proj.weight": tensors["w1"][layer],
            prefix + "mlp.up_proj.weight": tensors["w3"][layer],
            prefix + "mlp.down_proj.weight": tensors["w2"][layer],
        }
    return {name: tensor.contiguous() for name, tensor in state.items()}


def _halves_from_pairs(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    # weight: [num_heads * head_size, dim], rows (r0, i0, r1, i1, ...) per head -> (r0, r1, ..., i0, i1, ...)
    rows, dim = weight.shape
    return weight.view(num_heads, rows // num_heads // 2, 2, dim).transpose(1, 2).reshape(rows, dim)


def llama_config(header: Llama2cHeader) -> LlamaConfig:
    """The transformers `LlamaConfig` of a llama2.c checkpoint (theta 10000, eps 1e-5, float32)."""
    return LlamaConfig(
        vocab_size=header.vocab_size,
        hidden_size=header.dim,
        intermediate_size=header.hidden_dim,
        num_hidden_layers=header.num_layers,
        num_attention_heads=header.num_heads,
        num_key_value_heads=header.num_kv_heads,
        head_dim=header.head_size,
        max_position_embeddings=header.seq_len,
        rms_norm_eps=RMS_NORM_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=header.shared_classifier,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        dtype="float32",
    )
