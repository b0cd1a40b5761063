"""What the commands that run specdraft's engine (generate, serve, tune) build from their options:
the speculative setting (`engine.spec_config.SpecConfig`, built once and passed whole), the torch
dtype, and the --compile warm-up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdraft.cli.common import USAGE_ERROR, OptionError, user_errors
from specdraft.cli.declared import OptionGroup
from specdraft.cli.options import (
    Compile,
    DraftAuxOverride,
    DraftNumDraftTokens,
    DraftNumSteps,
    DraftTopk,
    EngineDevice,
    EngineDtype,
    EngineDtypeOption,
    MaxSeqLen,
    ServeNumDraftTokens,
    ServeNumSteps,
    ServeTopk,
    SglangVersion,
    Threads,
)

WARM_UP_TOKENS = 16  # the --compile warm-up: enough steps to compile and capture decode and verify
DEFAULT_NUM_STEPS = 3  # generate's and serve's chain without --num-steps (tune measures it too)


@dataclass(frozen=True)
class DraftingOptions(OptionGroup):
    """serve's drafting options as given, one option each (`declared.OptionGroup`): ints or None
    (left out: --topk 1 and --num-steps 3 then), --aux-layers as `checks.aux_override` parsed it
    (None: left out), --sglang-version "" when not pinned."""

    topk: ServeTopk
    num_steps: ServeNumSteps
    num_draft_tokens: ServeNumDraftTokens
    aux_layers: DraftAuxOverride
    sglang_version: SglangVersion

    def given(self) -> str:
        """The options given, as flags: "--topk, --num-steps" ("" for none)."""
        values = {
            "--topk": self.topk,
            "--num-steps": self.num_steps,
            "--num-draft-tokens": self.num_draft_tokens,
            "--aux-layers": self.aux_layers,
            "--sglang-version": self.sglang_version or None,
        }
        return ", ".join(name for name, value in values.items() if value is not None)


@dataclass(frozen=True)
class PlainDrafting(DraftingOptions):
    """generate's drafting options: serve's, whose help says they are used only with --draft
    (generate decodes plainly without one)."""

    topk: DraftTopk
    num_steps: DraftNumSteps
    num_draft_tokens: DraftNumDraftTokens


@dataclass(frozen=True)
class EngineRun(OptionGroup):
    """generate's and serve's options of the engine they run here (`declared.OptionGroup`): the
    cache size (0: the target's positions, at most 4096), the device, the dtype's name, --compile
    and the torch threads."""

    max_seq_len: MaxSeqLen
    device: EngineDevice
    dtype: EngineDtypeOption
    compile: Compile
    threads: Threads

    def torch_dtype(self):
        """--dtype as a torch dtype (`engine_dtype`)."""
        return engine_dtype(self.dtype)


def decoding_spec(
    drafting: DraftingOptions,
    draft: str,
    no_spec: bool,
    compile: bool,
    device: str,
    plain_without_draft: bool = False,
):
    """generate's / serve's SpecConfig of its drafting options, None for plain decoding (--no-spec,
    or no --draft when `plain_without_draft`; else --draft is required). A combination of options
    that cannot run (`refuse_compile_off_cuda`, `refuse_unused_drafting`, `spec_from_flags`) is a
    usage error: one line, exit `USAGE_ERROR`, as click's for a bad value, before anything loads.
    A DFlash drafter (`dflash_block_size`) drafts block_size - 1 tokens without --num-steps (one
    less than --num-draft-tokens when that is given), and refuses what it cannot run
    (`refuse_block_options`)."""
    with user_errors(None, exit_code=USAGE_ERROR):  # no Ctrl-C message: nothing runs yet
        refuse_compile_off_cuda(compile, device)
        refuse_unused_drafting(drafting.given(), no_spec, draft)
        block_size = None if no_spec else dflash_block_size(draft)
        num_steps = drafting.num_steps
        if block_size is not None:
            num_steps = refuse_block_options(drafting, block_size, draft)
        return spec_from_flags(
            no_spec or (plain_without_draft and not draft),
            draft,
            DEFAULT_NUM_STEPS if num_steps is None else num_steps,
            1 if drafting.topk is None else drafting.topk,
            drafting.num_draft_tokens or 0,
        )


def dflash_block_size(draft: str) -> int | None:
    """The block size of the DFlash drafter `draft` (`checkpoint.dflash.is_dflash_drafter`: a
    directory's config.json read strictly against its manifest (`read_dflash_dir_config`), a
    CheckpointError naming the file; a DFlash run's
    training checkpoint, loaded), None for any other path."""
    if not draft:
        return None
    from pathlib import Path

    from specdraft.checkpoint import is_training_checkpoint
    from specdraft.checkpoint.dflash import (
        is_dflash_drafter,
        load_dflash_draft,
        read_dflash_dir_config,
    )

    path = Path(draft)
    if not is_dflash_drafter(path):
        return None
    if is_training_checkpoint(path):
        return load_dflash_draft(path)[0].cfg.block_size
    return read_dflash_dir_config(path)[0].block_size


def refuse_block_options(drafting: DraftingOptions, block_size: int, draft: str) -> int:
    """The drafts per round of the DFlash drafter `draft` (block size `block_size`): --num-steps,
    else --num-draft-tokens - 1, else block_size - 1. OptionError naming the option for more than
    block_size - 1, a tree (--topk > 1), or an option that reads EAGLE-3 aux ids (--aux-layers,
    --sglang-version: a DFlash config names its target layers)."""
    most, where = block_size - 1, f"the DFlash drafter {draft} (block size {block_size})"
    if drafting.topk is not None and drafting.topk > 1:
        raise OptionError(
            f"--topk {drafting.topk} drafts an EAGLE-3 tree; {where} proposes one chain per "
            "block: drop --topk"
        )
    aux_reading = {"--aux-layers": drafting.aux_layers, "--sglang-version": drafting.sglang_version}
    for flag in [flag for flag, value in aux_reading.items() if value]:
        raise OptionError(
            f"{flag} reads an EAGLE-3 drafter's aux layer ids; {where} names its target "
            f"layers in config.json (dflash_config.target_layer_ids): drop {flag}"
        )
    if drafting.num_steps is not None:
        steps, given = drafting.num_steps, f"--num-steps {drafting.num_steps}"
    elif drafting.num_draft_tokens:
        steps, given = (
            drafting.num_draft_tokens - 1,
            f"--num-draft-tokens {drafting.num_draft_tokens}",
        )
    else:
        return most
    if steps > most:
        raise OptionError(
            f"{given}: {where} proposes at most {most} drafts per round (block size - 1): "
            f"pass --num-steps 1..{most}"
        )
    return steps


def refuse_compile_off_cuda(compile: bool, device: str) -> None:
    """--compile replays CUDA graphs: OptionError naming the fix on a non-CUDA --device (call it
    before any model loads)."""
    if compile and not device.startswith("cuda"):
        raise OptionError(
            f"--compile needs a CUDA device (CUDA graphs), not --device {device}: "
            f"pass --device cuda, or drop --compile"
        )


def refuse_unused_drafting(named: str, no_spec: bool, draft: str) -> None:
    """OptionError when drafting options are given explicitly (`named`: `DraftingOptions.given`)
    but would be ignored: with --no-spec, or without --draft."""
    if named and no_spec:
        raise OptionError(
            f"{named}: drafting settings, but --no-spec decodes plainly (they would be "
            f"ignored): drop {named}, or drop --no-spec"
        )
    if named and not draft:
        raise OptionError(
            f"{named}: drafting settings, but no --draft is given (plain decoding): "
            f"add --draft CKPT, or drop {named}"
        )


def spec_from_flags(no_spec: bool, draft: str, num_steps: int, topk: int, num_draft_tokens: int):
    """The SpecConfig of the speculative flags (None with --no-spec); OptionError names the rule."""
    from specdraft.engine.spec_config import SpecConfig, max_draft_tokens

    if no_spec:
        return None
    if not draft:
        raise OptionError("--draft CKPT is required for speculative decoding (or pass --no-spec)")
    if topk > 1 and not num_draft_tokens:
        most = max_draft_tokens(num_steps, topk)
        raise OptionError(
            f"--topk {topk} drafts a tree, which needs --num-draft-tokens (nodes verified per "
            f"step incl. the root: 2..{most} with --num-steps {num_steps}), e.g. "
            f"--num-draft-tokens {min(most, num_steps * topk + 1)}; or --topk 1 for a chain"
        )
    return SpecConfig(num_steps, topk, num_draft_tokens or num_steps + 1)


def current_setting(draft: str, num_steps: int, topk: int | None, num_draft_tokens: int):
    """The SpecConfig of tune's current-setting flags; without --num-steps the chain generate and
    serve run by default (DEFAULT_NUM_STEPS), so tune always measures the setting a user has.
    OptionError for --topk / --num-draft-tokens without --num-steps (SGLang refuses these without
    num_steps too)."""
    if not num_steps and (topk or num_draft_tokens):
        given = " ".join(
            f"--{name} {v}"
            for name, v in (("topk", topk), ("num-draft-tokens", num_draft_tokens))
            if v
        )
        raise OptionError(
            f"{given} without --num-steps: the current setting needs --num-steps N as well "
            "(as SGLang's --speculative-eagle-topk / --speculative-num-draft-tokens need "
            "--speculative-num-steps); add --num-steps N, or drop them"
        )
    return spec_from_flags(
        False, draft, num_steps or DEFAULT_NUM_STEPS, topk or 1, num_draft_tokens
    )


def engine_dtype(name: EngineDtype):
    """--dtype of generate / serve / tune as a torch dtype (`conventions.parse_dtype`)."""
    from specdraft.conventions import parse_dtype

    return parse_dtype(name)


def warm_up_compiled(generation: Callable[[int], object], console) -> None:
    """--compile: run `generation(WARM_UP_TOKENS)`, one short generation of at most that many
    tokens that compiles the target layers and captures the CUDA graphs, timed in one line, so
    what runs next (generate's metrics, serve's requests) is the engine's time, not the
    compiler's."""
    import time

    started = time.perf_counter()
    generation(WARM_UP_TOKENS)
    console.print(
        f"compiled and captured CUDA graphs in {time.perf_counter() - started:.1f} s "
        f"(a warm-up generation, not in the metrics)",
        markup=False,
    )
