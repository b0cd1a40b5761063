"""The drafter's config: `DraftConfig` (shape and wiring of an EAGLE-3 drafter), its checks, and
what it reads from a transformers target config (`from_target`, `rope_from_hf_config`).

The norm flags (`NORM_FLAGS`) are the placements of the published EAGLE-3 variants; what each
computes, as SGLang and vLLM compute it: `draft.py`'s module docstring. The drafting methods named
by their flags (`EAGLE3_METHODS`, `method_of`) are declared here, below torch, since
`specdraft train`'s options are built from them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from specdraft.conventions.config_reads import LEGACY_ROPE_TYPES
from specdraft.errors import SpecdraftError


class DraftError(SpecdraftError, ValueError):
    """A drafter config, input or embedding that does not fit this drafter (named in the message)."""


# Rope scaling types this drafter implements; anything else is refused, never approximated.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# The yarn keys that transformers (`_compute_yarn_parameters`), SGLang and vLLM (`get_rope`) all
# read alike (GPT-OSS writes these). attention_factor / attn_factor / extrapolation_factor /
# mscale* are each read by some of the three only, so a drafter holding them is refused.
YARN_KEYS = (
    "rope_type",
    "type",
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "truncate",
)
# The norm placements of published EAGLE-3 variants (`draft.py`'s docstring says what each does).
NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# The EAGLE-3 methods `--method` names, each the NORM_FLAGS it sets (every other one false).
# EAGLE-3.1: one RMSNorm per aux state before fc (fc_norm) and the post-norm output fed to the
# next draft step (norm_output), and no other norm: SpecForge a6b6b023
# configs/qwen3-30B-A3B-eagle3.1.json ("fc_norm": true, "norm_output": true; examples/configs/
# README.md: a draft-config variant trained and served as the eagle3 strategy) and speculators
# c05b95b3 models/eagle3/config.py (fc_norm: "Eagle 3.1 paper approach", docs/cli/train.md;
# norm_output: "(Eagle 3.1)"; norm_before_fc refused beside fc_norm, `_check_norm_flags`).
# Engines serve it as EAGLE-3 (vLLM method eagle3, SGLang EAGLE3), reading both keys from the
# drafter's config.json: `conventions.engines.FLAG_RULES` says which releases do.
EAGLE3_METHODS: dict[str, tuple[str, ...]] = {
    "eagle3": (),
    "eagle3.1": ("fc_norm", "norm_output"),
}


# DraftConfig's widths, head counts and vocabularies (positive ints)
SIZE_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "target_hidden_size",
    "vocab_size",
    "draft_vocab_size",
)


@dataclass(frozen=True)
class DraftConfig:
    """Shape and wiring of an EAGLE-3 drafter.

    Sizes are counts; `aux_layers` are specdraft indices of the target's residual stream
    (0 = embeddings, k = output of decoder layer k, L = last layer before the final norm).
    `vocab_size` is the target's vocabulary, `draft_vocab_size` the drafter's head.
    `embedding_owned`: the drafter carries its own `embed_tokens` at the target's width too
    (speculators' trainer saves one; a drafter that trains its embedding); see `owns_embedding`.
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    aux_layers: tuple[int, ...]
    target_num_layers: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    tie_word_embeddings: bool = False
    embedding_owned: bool = False

    def __post_init__(self) -> None:
        for name in (*SIZE_FIELDS, "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise DraftError(f"DraftConfig.{name} = {getattr(self, name)}: must be positive")
        if self.num_attention_heads % self.num_key_value_heads:
            raise DraftError(
                f"DraftConfig: num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.draft_vocab_size > self.vocab_size:
            raise DraftError(
                f"DraftConfig.draft_vocab_size {self.draft_vocab_size} exceeds the "
                f"target vocab_size {self.vocab_size}"
            )
        if len(set(self.aux_layers)) != len(self.aux_layers) or not self.aux_layers:
            raise DraftError(
                f"DraftConfig.aux_layers {list(self.aux_layers)}: need distinct layers"
            )
        if not all(0 <= k <= self.target_num_layers for k in self.aux_layers):
            raise DraftError(
                f"DraftConfig.aux_layers {list(self.aux_layers)}: each index must be in "
                f"0..{self.target_num_layers} (the target's residual streams)"
            )
        for name in NORM_FLAGS:
            if type(getattr(self, name)) is not bool:  # 1 or "true" from a JSON config is an error
                raise DraftError(
                    f"DraftConfig.{name} = {getattr(self, name)!r}: must be true or false"
                )
        if self.tie_word_embeddings:
            raise DraftError(
                "DraftConfig.tie_word_embeddings must be false: SGLang replaces a tied "
                "drafter's trained lm_head with the embedding"
            )
        check_rope_scaling(self.rope_scaling)

    @property
    def n_aux(self) -> int:
        """Number of aux hidden states the first step fuses (3 for SGLang and vLLM)."""
        return len(self.aux_layers)

    @property
    def owns_embedding(self) -> bool:
        """True when the drafter uses its own `embed_tokens` (saved with it), not the target's:
        always at another width (SGLang and vLLM share the target's only when the widths match),
        and at the same width when `embedding_owned` (the engines differ there:
        `conventions.EMBEDDING_SOURCES`)."""
        return self.embedding_owned or self.hidden_size != self.target_hidden_size

    @classmethod
    def from_target(
        cls,
        target_config: Any,
        aux_layers: tuple[int, ...] | list[int] = (),
        draft_vocab_size: int | None = None,
        **overrides: Any,
    ) -> DraftConfig:
        """Derive a drafter config from a transformers target config.

        Hidden size, heads, intermediate size, rope and max positions default to the target's
        (the drafter then shares the target's embedding); `overrides` replace any field. Raises
        DraftError for a value the target config holds per layer (`_target_value`).
        """
        get = (
            target_config.get
            if isinstance(target_config, dict)
            else functools.partial(_target_value, target_config)
        )
        heads = get("num_attention_heads")
        rope_theta, rope_scaling = rope_from_hf_config(get)
        derived: dict[str, Callable[[], Any]] = dict(  # read only when no override replaces it
            hidden_size=lambda: get("hidden_size"),
            num_attention_heads=lambda: heads,
            num_key_value_heads=lambda: get("num_key_value_heads") or heads,
            head_dim=lambda: get("head_dim") or get("hidden_size") // heads,
            intermediate_size=lambda: get("intermediate_size"),
            target_hidden_size=lambda: get("hidden_size"),
            vocab_size=lambda: get("vocab_size"),
            draft_vocab_size=lambda: draft_vocab_size or get("vocab_size"),
            aux_layers=lambda: tuple(aux_layers),
            target_num_layers=lambda: get("num_hidden_layers"),
            max_position_embeddings=lambda: get("max_position_embeddings"),
            rope_theta=lambda: rope_theta,
            rope_scaling=lambda: rope_scaling,
            rms_norm_eps=lambda: get("rms_norm_eps", 1e-6),
        )
        values = {k: read() for k, read in derived.items() if k not in overrides}
        values.update(overrides)
        values["aux_layers"] = tuple(values["aux_layers"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (aux_layers as a list)."""
        d = asdict(self)
        d["aux_layers"] = list(self.aux_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DraftConfig:
        """Inverse of `to_dict`; an unknown key is an error naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DraftError(f"DraftConfig: unknown keys {unknown}")
        return cls(**{**d, "aux_layers": tuple(d["aux_layers"])})


def check_rope_scaling(scaling: dict[str, Any] | None) -> None:
    """Raise DraftError unless the drafter implements `scaling` as the engines apply it: a type
    in SUPPORTED_ROPE_TYPES; for yarn, `factor` and `original_max_position_embeddings` given and
    no key outside YARN_KEYS."""
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise DraftError(
            f"DraftConfig.rope_scaling type {rope_type!r} is not implemented "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if rope_type != "yarn":
        return
    missing = [k for k in ("factor", "original_max_position_embeddings") if scaling.get(k) is None]
    unread = sorted(set(scaling) - set(YARN_KEYS))
    if missing or unread:
        problem = f"needs {', '.join(missing)}" if missing else f"holds {', '.join(unread)}"
        raise DraftError(
            f"DraftConfig.rope_scaling yarn {problem}: the drafter implements yarn from "
            f"{', '.join(YARN_KEYS[2:])} only (what transformers, SGLang and vLLM read alike); "
            f"give a rope_scaling with those keys (train: draft_overrides)"
        )


def rope_from_hf_config(get: Any) -> tuple[float, dict[str, Any] | None]:
    """Read (rope_theta, rope_scaling) from a transformers config accessor `get(key, default)`.

    transformers 5 stores both in `rope_parameters`; older configs use the two top-level keys.
    A legacy type the engines read as another (Qwen2.5-VL's "mrope" with mrope_section: plain
    rope, `conventions.config_reads.LEGACY_ROPE_TYPES`) is read as they read it.
    """
    params = get("rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        if scaling.get("rope_type", "default") == "default":
            return theta, None
        return theta, scaling
    scaling = get("rope_scaling", None)
    legacy = scaling and "rope_type" not in scaling and "mrope_section" in scaling
    if legacy and scaling.get("type") in LEGACY_ROPE_TYPES:  # Qwen2.5-VL's "mrope": the engines'
        scaling = {**scaling, "type": LEGACY_ROPE_TYPES[scaling["type"]]}  # reading (config_reads)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    if scaling and "rope_type" not in scaling:
        scaling = {**scaling, "rope_type": scaling["type"]}
    return float(get("rope_theta", 10000.0)), scaling


def _target_value(config: Any, key: str, default: Any = None) -> Any:
    """`config.key` (default when absent). A heterogeneous config (Gemma 4's per-layer head_dim:
    transformers raises on the global read) is a DraftError naming the class, the key and the
    override that gives the drafter one value."""
    try:
        return getattr(config, key, default)
    except RuntimeError as e:  # transformers 5.25 AmbiguousGlobalPerLayerAttributeError's base
        reason = str(e).split(". ")[0]  # its first sentence: the key varies across layers
        raise DraftError(
            f"{type(config).__name__}: {key} differs by layer ({reason}); "
            f'the drafter takes one value: pass draft_overrides {{"{key}": N}}'
        ) from None


def method_flags(method: str) -> dict[str, bool]:
    """Every NORM_FLAGS value of EAGLE-3 method `method` (a key of EAGLE3_METHODS)."""
    return {name: name in EAGLE3_METHODS[method] for name in NORM_FLAGS}


def method_of(flags: Any) -> str | None:
    """The EAGLE3_METHODS key whose flags are exactly those `flags` sets (a DraftConfig, or a
    dict of NORM_FLAGS values, absent = false), or None for another variant."""
    get = flags.get if isinstance(flags, dict) else functools.partial(getattr, flags)
    on = tuple(name for name in NORM_FLAGS if get(name, False))
    return next((m for m, named in EAGLE3_METHODS.items() if set(named) == set(on)), None)


def method_label(flags: Any) -> str:
    """What a drafter of these norm flags is, in one phrase: "eagle3.1 (fc_norm, norm_output)",
    "eagle3 (no norm flag)", or "EAGLE-3 variant (norm_before_residual)" (no method of
    EAGLE3_METHODS: trained with draft_overrides). flags: as `method_of`'s."""
    get = flags.get if isinstance(flags, dict) else functools.partial(getattr, flags)
    on = [name for name in NORM_FLAGS if get(name, False)]
    method = method_of(flags)
    named = ", ".join(on) or "no norm flag"
    return f"{method} ({named})" if method else f"EAGLE-3 variant ({named})"
