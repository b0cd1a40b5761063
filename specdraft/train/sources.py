"""Training data sources: what the trainer reads, and the two sources that provide it.

A training source (`TrainData`) must provide:

- `batch(sample_ids, max_length, device)`: one rank's share of a global batch as a `Batch` of
  right-padded input_ids and loss mask [B, T], the target's aux hidden states
  [B, T, n_aux·H_target] and the target's logits [B, T, V];
- `token_counts(sample_ids)`: loss-masked target-token counts [V] over those samples (the
  training split), from which the draft vocabulary is built;
- `info`: a `TargetInfo`, what the drafter takes from its target (config, aux layers,
  embedding) and what its manifest records about it;
- `len()`: the number of samples.

`store_data.StoreData` reads an offline capture store; `OnlineData` runs a live target at every
batch. `loop.open_data` turns a store directory, an `OnlineSource` (target directory + data file)
or a TrainData as is into a source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from specdraft.conventions import default_aux_layers
from specdraft.data.labels import token_counts
from specdraft.data.render import RenderInfo, Sample, data_hash, tokenizer_fingerprint
from specdraft.train.errors import BadTrainSetting


@dataclass
class Batch:
    """One rank's share of a global batch, right-padded (pad id 0, loss_mask 0).

    sample_ids: the source's sample indices; input_ids/loss_mask: [B, T] long/bool;
    aux_hidden: [B, T, n_aux·H_target]; target_logits: [B, T, V] float32.
    """

    sample_ids: list[int]
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux_hidden: torch.Tensor
    target_logits: torch.Tensor


@dataclass
class TargetInfo:
    """What the drafter takes from its target, and what its manifest records about it.

    config: transformers text config or its dict (sizes, rope, rms_norm_eps).
    manifest_fields: Manifest fields known from the source: target, tokenizer, chat_template,
    data_hash. vocab_limit: tokenizer length (draft vocabulary never past it), or None.
    lm_head_weight: the target's lm_head (a DFlash drafter shares it), or None.
    """

    config: Any
    aux_layers: tuple[int, ...]
    embed_weight: torch.Tensor  # [V, H_target]
    manifest_fields: dict[str, Any]
    vocab_limit: int | None = None
    lm_head_weight: torch.Tensor | None = None  # [V, H_target]


class TrainData(Protocol):
    """A training source: offline capture store (StoreData) or online target (OnlineData)."""

    info: TargetInfo

    def __len__(self) -> int: ...

    def token_counts(self, sample_ids: Sequence[int]) -> torch.Tensor: ...

    def batch(self, sample_ids: Sequence[int], max_length: int, device: torch.device) -> Batch: ...


def pad_samples(samples: Sequence[Sample], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncate to `max_length` and right-pad: (input_ids [B, T] long, loss_mask [B, T] bool)."""
    samples = [s.truncated(max_length) for s in samples]
    t_len = max(len(s.input_ids) for s in samples)
    ids = torch.zeros(len(samples), t_len, dtype=torch.long)
    mask = torch.zeros(len(samples), t_len, dtype=torch.bool)
    for i, s in enumerate(samples):
        ids[i, : len(s.input_ids)] = torch.tensor(s.input_ids)
        mask[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.bool)
    return ids, mask


@dataclass(frozen=True)
class OnlineSource:
    """Where online training reads: a target directory (model + tokenizer) and a data file.

    data: JSONL chats/texts, a `save_to_disk` directory or a text file (`specdraft.data`);
    chat=False renders plain text (base models); template_kwargs go to apply_chat_template;
    chat_template: a Jinja file rendering the chats instead of the tokenizer's template
    (`data.template`). tokenizer: the tokenizer directory (default: the target's).
    target_dtype: the dtype the target runs in ("float32" | "bfloat16" | "float16", or fp32 /
    bf16 / fp16; its aux states and logits reach the drafter as float32 either way).
    skip_bad: skip and count bad data records instead of refusing the file (as capture does).
    reasoning: "keep" | "drop" (`specdraft.data.reasoning`).
    Raises BadTrainSetting (a ValueError) naming --target-dtype for an unknown dtype, and for a
    capture store given as the data.
    """

    target: str
    data: str
    chat: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    tokenizer: str | None = None
    target_dtype: str = "float32"
    skip_bad: bool = False
    reasoning: str = "keep"

    def __post_init__(self) -> None:
        from specdraft.capture.store import INDEX
        from specdraft.conventions import DTYPES
        from specdraft.data.template import check_template_mode

        check_template_mode(self.chat_template, self.chat)

        if self.target_dtype not in DTYPES:
            raise BadTrainSetting(
                f"--target-dtype {self.target_dtype!r}: choose one of {', '.join(DTYPES)}"
            )
        if (Path(self.data) / INDEX).is_file():
            raise BadTrainSetting(
                f"{self.data} is a capture store (specdraft capture), not a data file: drop --online "
                f"to train on the store offline (--target only if the target it recorded moved)"
            )


class OnlineData:
    """Token sequences run through a live target at every batch (no store on disk).

    target: a `specdraft.targets.Target`; samples: `specdraft.data.render.Sample`s; aux_layers:
    specdraft indices (default: `conventions.default_aux_layers(L)`). name_or_path, tokenizer
    and render_info (`data.RenderInfo`), when known, are recorded in the drafter's manifest.
    num_skipped: bad records skipped while reading the data (OnlineSource.skip_bad).
    """

    def __init__(
        self,
        target: Any,
        samples: Sequence[Sample],
        aux_layers: Sequence[int] | None = None,
        *,
        name_or_path: str | None = None,
        tokenizer: Any = None,
        render_info: RenderInfo | None = None,
        num_skipped: int = 0,
    ) -> None:
        from specdraft.capture.forward import target_meta
        from specdraft.conventions import check_aux_flag

        self.target, self.samples, self.num_skipped = target, list(samples), num_skipped
        if aux_layers:
            check_aux_flag(aux_layers, target.num_layers)
        name_or_path = name_or_path or getattr(target.config, "_name_or_path", None)
        self.info = TargetInfo(
            config=target.config,
            aux_layers=tuple(aux_layers or default_aux_layers(target.num_layers)),
            embed_weight=target.embed_tokens.weight.detach(),
            manifest_fields={
                "target": target_meta(target, name_or_path),
                "tokenizer": tokenizer_fingerprint(tokenizer) if tokenizer else None,
                "chat_template": render_info.to_dict() if render_info else None,
                "data_hash": data_hash(self.samples),
            },
            vocab_limit=len(tokenizer) if tokenizer else None,
            lm_head_weight=target.lm_head.weight.detach(),
        )

    @classmethod
    def load(
        cls,
        source: OnlineSource,
        aux_layers: Sequence[int] | None = None,
        device: str | torch.device = "cpu",
    ) -> OnlineData:
        """Load `source`'s target onto `device` in `source.target_dtype` and render its data with
        the target's tokenizer. Raises DataError naming the data file for a bad record (unless
        source.skip_bad), ValueError for a tokenizer that does not belong to the target."""
        from specdraft.capture.stage import load_inputs

        target, tokenizer, data = load_inputs(source, device)
        return cls(
            target,
            data.samples,
            aux_layers,
            name_or_path=str(Path(source.target).resolve()),
            tokenizer=tokenizer,
            render_info=data.render_info,
            num_skipped=data.num_skipped,
        )

    def __len__(self) -> int:
        return len(self.samples)

    def token_counts(self, sample_ids: Sequence[int]) -> torch.Tensor:
        """Loss-masked target-token counts [V] over the samples `sample_ids`."""
        return token_counts([self.samples[i] for i in sample_ids], self.target.vocab_size)

    def batch(self, sample_ids: Sequence[int], max_length: int, device: torch.device) -> Batch:
        ids, mask = pad_samples([self.samples[i] for i in sample_ids], max_length)
        lengths = torch.tensor(
            [min(len(self.samples[i].input_ids), max_length) for i in sample_ids]
        )
        attention = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
        t_device = self.target.embed_tokens.weight.device
        out = self.target.forward(
            ids.to(t_device), attention.to(t_device), aux_layers=self.info.aux_layers
        )
        # clone: the target runs in inference mode, and autograd cannot save inference tensors
        return Batch(
            list(sample_ids),
            ids.to(device),
            mask.to(device),
            out.aux_hidden.clone().to(device, torch.float32),
            out.logits.clone().to(device),
        )


def serving_note(info: TargetInfo) -> str | None:
    """`conventions.serving_problem` for the target and aux layers the drafter trains on (the
    class from the recorded architecture, else the recorded target class); None when served."""
    from specdraft.data.serving import serving_problem
    from specdraft.targets.config import recorded_target_class

    target = info.manifest_fields.get("target") or {}
    if not target.get("num_layers"):
        return None
    target_class = recorded_target_class(target)
    return serving_problem(info.aux_layers, target["num_layers"], target_class)
