"""The doctor's checks of a block drafter (DFlash): the files load as the drafter they say they
are, the engine's block setting serves the trained block, the mask token is the training one in
the serving tokenizer, each engine captures the training layers and runs each draft layer's
attention as training did; with the EAGLE-3 doctor's checks of the target, tokenizer and chat
template against the manifest. Each reads the engine rules of `conventions.dflash_reads` (sources:
`conventions.dflash.DFLASH_FACTS`) and returns a Result; `BLOCK_CHECKS` is their order, ending
with the seeds' method (`block_acceptance`: the drafter alone on samples against training's
record, and a live server against the drafter alone).
"""

from __future__ import annotations

from typing import Any

from specdraft.checkpoint import CheckpointError
from specdraft.checkpoint.dflash import load_dflash_draft, trained_block
from specdraft.checkpoint.dflash_forms import dflash_form, read_dflash_config, weights_kind
from specdraft.checkpoint.layouts import MANIFEST_FILE, READ_ARCHITECTURES, TargetNeeded
from specdraft.conventions import dflash_reads as reads
from specdraft.conventions.dflash import DFLASH_FACTS
from specdraft.dflash import DFLASH_ARCHITECTURE, DFlashConfig, DFlashDraft
from specdraft.doctor.audit import target_matches_training
from specdraft.doctor.block_acceptance import block_acceptance_offline, block_acceptance_online
from specdraft.doctor.evidence import Evidence
from specdraft.doctor.file_evidence import Broken, Unavailable, memo
from specdraft.doctor.parity import chat_template_matches_manifest, tokenizer_matches_manifest
from specdraft.doctor.verdict import Result, engine_name, fail, ok

ALGORITHM = {"sglang": "DFLASH", "vllm": "dflash"}
ENGINE_ARGS_FIX = (
    'pass the launch command (--engine-args "python -m sglang.launch_server ..." or "vllm serve '
    '..."), as specdraft export prints it'
)
REEXPORT = "re-export it from its training run (specdraft export RUN/draft OUT --engine ENGINE)"


class BlockEvidence(Evidence):
    """`Evidence` of a DFlash drafter: its manifest read as one, the drafter loaded strictly."""

    reads_dflash = True

    @memo
    def drafter(self) -> DFlashDraft:
        """The drafter, loaded strictly (`load_dflash_draft`; the --target's layer count reads a
        form that does not record it); Broken with the loader's one line."""
        layers = self.facts.num_layers if self.inputs.target is not None else None
        self.need_dflash_config()
        try:
            return load_dflash_draft(self.path, target_num_layers=layers)[0]
        except TargetNeeded as e:  # a form without the target's layer count: an input missing
            raise Unavailable(
                str(e), "pass the target's transformers directory (--target DIR)"
            ) from None
        except CheckpointError as e:
            raise Broken(str(e), REEXPORT) from None

    def need_dflash_config(self) -> dict[str, Any]:
        """config.json when it is a DFlash drafter's (`dflash_forms.dflash_form`); a skip naming
        `config_kind_matches_weights` (which fails it) when it is another."""
        if dflash_form(self.config) is None:
            raise Unavailable(
                "config.json is not a DFlash drafter's (config_kind_matches_weights)",
                self.reexport,
            )
        return self.config

    @property
    def reexport(self) -> str:
        """The command that rewrites this directory's files from the training run."""
        return (
            f"re-export it from its training run (specdraft export RUN/draft {self.path} "
            "--engine sglang|vllm|speculators)"
        )

    def need_drafter(self) -> DFlashDraft:
        """The drafter for a check that reads it: a skip when it does not load (the fail is
        `dflash_files_load`'s, once)."""
        try:
            return self.drafter
        except Broken:
            raise Unavailable("the drafter does not load (dflash_files_load)", REEXPORT) from None
        # an Unavailable (no --target for a speculators form) skips as it is

    def need_config_read(self) -> DFlashConfig:
        """config.json as a DFlashConfig (`dflash_forms.read_dflash_config`) without the loader's
        comparison with the training record, for the checks that make that comparison and name
        the cause themselves; a skip when it does not read (`dflash_files_load` fails it)."""
        self.need_dflash_config()
        if self.inputs.target is not None:
            layers = self.facts.num_layers
        else:
            layers = (self.manifest.target or {}).get("num_layers") if self.manifest else None
        try:
            return read_dflash_config(self.config, self.path / "config.json", layers)
        except TargetNeeded as e:
            raise Unavailable(
                str(e), "pass the target's transformers directory (--target DIR)"
            ) from None
        except CheckpointError:
            raise Unavailable("config.json does not read (dflash_files_load)", REEXPORT) from None

    @property
    def engines(self) -> list[str]:
        """The named engine, else both that serve DFlash (speculators' form: vLLM only)."""
        if self.engine is not None:
            return [self.engine]
        return ["vllm"] if self.layout == "speculators" else list(reads.DFLASH_ENGINES)

    def reading(self, engine: str) -> dict[str, Any]:
        """config.json as `engine` reads it (vLLM translates a speculators config first)."""
        config = self.need_dflash_config()
        return reads.vllm_reading(config) if engine == "vllm" else config


def dflash_files_load(ev: BlockEvidence) -> Result:
    """The files load strictly as the DFlash drafter config.json describes (every tensor matched,
    every value finite), the config's settings being ones the drafter computes."""
    try:
        draft = ev.drafter
    except Broken as e:
        return fail(e.reason, e.fix)
    state = draft.state_dict()
    bad = [k for k, v in state.items() if not v.isfinite().all()]
    if bad:
        return fail(f"tensors with NaN or inf values: {', '.join(bad[:8])}", REEXPORT)
    return ok(
        f"{len(state)} tensors, each a parameter of the {draft.cfg.num_hidden_layers}-layer drafter, all finite"
    )


def config_kind_matches_weights(ev: BlockEvidence) -> Result:
    """config.json says DFlash and the weights are a DFlash drafter's, not EAGLE-3's; a config
    of another drafter over the DFlash weights and manifest is named as the cause."""
    kind = weights_kind(ev.tensors)
    if dflash_form(ev.config) is None:
        return _other_config(ev, kind)
    if kind == "eagle3":
        return fail(
            f"config.json names {DFLASH_ARCHITECTURE}, but {ev.weights_file} holds EAGLE-3 "
            f"tensors ({', '.join(sorted(ev.tensors)[:4])}, ...): an engine would build a DFlash "
            "drafter and fill nothing of it",
            "give the EAGLE-3 weights their EAGLE-3 config (or the DFlash config its weights); "
            + REEXPORT,
        )
    if kind is None:
        return fail(f"{ev.weights_file} holds neither drafter's tensors", REEXPORT)
    return ok(f"config.json names {DFLASH_ARCHITECTURE}; the tensors are a DFlash drafter's")


def _other_config(ev: BlockEvidence, kind: str | None) -> Result:
    """The fail of a config.json that is no DFlash drafter's, in a directory whose manifest
    records DFlash training (`doctor.run.evidence_and_checks`)."""
    named = ", ".join(ev.config.get("architectures") or []) or ev.config.get(
        "speculators_model_type"
    )
    eagle = named in READ_ARCHITECTURES or named == "eagle3"
    weights = {
        "dflash": "the weights are a DFlash drafter's",
        "eagle3": "the weights are EAGLE-3's",
    }.get(kind, "the weights are neither drafter's")
    return fail(
        f"config.json names {named or 'no architecture'}"
        f"{' (an EAGLE-3 architecture)' if eagle else ''}, not {DFLASH_ARCHITECTURE}; "
        f"{weights} and {MANIFEST_FILE} records a DFlash training run: an engine would build "
        "another drafter than the one trained",
        f"restore config.json: {ev.reexport}",
    )


def block_size_matches_engine(ev: BlockEvidence) -> Result:
    """The launch line runs DFlash with a setting that serves the TRAINED block (the manifest's
    record, else config.json's): SGLang's --speculative-num-draft-tokens = block_size (another
    value is only a warning there; unset, SGLang reads config.json's), vLLM's
    num_speculative_tokens <= block_size - 1 (more drafts positions never trained)."""
    try:
        args = ev.engine_args
    except Unavailable as e:
        return fail(e.reason, e.fix)
    if args is None:
        raise Unavailable("no --engine-args", ENGINE_ARGS_FIX)
    block, engine = trained_block_size(ev), args.engine
    want = reads.engine_num_speculative_tokens(engine, block)
    if served_method(args) != ALGORITHM[engine].lower():
        return fail(
            f"{engine_name(engine)} runs {args.algorithm or 'no speculative method'}, not "
            f"{ALGORITHM[engine]}: the DFlash drafter would not be run as one",
            f"launch with {launch_setting(engine, want)} (specdraft export prints the line)",
        )
    given = args.num_draft_tokens if engine == "sglang" else args.num_steps
    if given is None and engine == "sglang":
        read = reads.config_block_size(ev.config)
        if read == block:
            return ok(f"SGLang reads the block from config.json: {block}")
        return fail(
            f"SGLang reads the block from config.json: {read}; the drafter was trained on "
            f"blocks of {block} ({MANIFEST_FILE})",
            f"launch with {launch_setting(engine, want)}, and write block_size {block} in "
            "config.json",
        )
    if given is None or given > want or (engine == "sglang" and given != want):
        return fail(
            f"{engine_name(engine)} drafts {'an unset number of' if given is None else given} "
            f"tokens a round; the drafter was trained on blocks of {block} "
            f"({block - 1} drafts after the anchor)",
            f"launch with {launch_setting(engine, want)}",
        )
    fewer = f" (of the {want} trained)" if given < want else ""
    return ok(f"{launch_setting(engine, given)}{fewer} serves the trained block of {block}")


def trained_block_size(ev: BlockEvidence) -> int:
    """The block the drafter was trained on: its manifest's record (`checkpoint.dflash.
    trained_block`), else the loaded drafter's (config.json's); a skip when neither is had."""
    recorded = trained_block(ev.manifest)
    return recorded if recorded is not None else ev.need_drafter().cfg.block_size


def served_method(args) -> str:
    """The speculative method the launch line runs, lower case: the one named, else (vLLM) the one
    vLLM 0.32 guesses from the draft path, "dflash" when the path names it
    (config/speculative.py); "" for none."""
    if args.algorithm:
        return args.algorithm.lower()
    named = args.engine == "vllm" and "dflash" in (args.draft_model or "").lower()
    return "dflash" if named else ""


def launch_setting(engine: str, value: int) -> str:
    """The engine's flag for a DFlash setting of `value`."""
    if engine == "sglang":
        return f"--speculative-algorithm DFLASH --speculative-num-draft-tokens {value}"
    return f'--speculative-config \'{{"method": "dflash", "num_speculative_tokens": {value}}}\''


def mask_token_matches_training(ev: BlockEvidence) -> Result:
    """The config's mask token id is training's (the manifest's), a row of the target's
    embedding, and the serving tokenizer neither holds the mask token's text at another id
    (SGLang refuses to start) nor a token of its own at that id."""
    cfg = ev.need_config_read()
    manifest = ev.need_manifest()
    trained = (manifest.draft or {}).get("mask_token_id")
    if trained != cfg.mask_token_id:
        return fail(
            f"config.json's mask token {cfg.mask_token_id} is not training's ({trained}): the "
            "engines fill the block with another row than the one trained",
            f"set dflash_config.mask_token_id to {trained}, or {REEXPORT}",
        )
    if ev.facts.vocab_size != cfg.vocab_size:
        return fail(
            f"the target has {ev.facts.vocab_size} embedding rows, the drafter was trained on "
            f"{cfg.vocab_size}: mask token {cfg.mask_token_id} is another row, or none",
            "serve the target it was trained on",
        )
    return _mask_in_tokenizer(ev, cfg.mask_token_id, (manifest.tokenizer or {}).get("length"))


def _mask_in_tokenizer(ev: BlockEvidence, mask: int, trained_length: int | None) -> Result:
    """The serving tokenizer's side of `mask_token_matches_training`."""
    tokenizer = ev.tokenizer
    conflict = reads.mask_token_conflict(ev.reading("sglang"), tokenizer.get_vocab())
    if conflict is not None:
        text, found = conflict
        return fail(
            f"the serving tokenizer holds {text!r} at id {found}, the drafter's mask token is "
            f"{mask}: SGLang refuses to start (its mask_token_id check)",
            f"serve the tokenizer training used, or drop {text!r} from it",
        )
    held = tokenizer.convert_ids_to_tokens(mask) if mask < len(tokenizer) else None
    spare_at_training = trained_length is not None and mask >= trained_length
    if spare_at_training and held not in (None, reads.mask_token_text(ev.config)):
        return fail(
            f"mask token {mask} was a spare row at training (tokenizer length {trained_length}), "
            f"the serving tokenizer ({len(tokenizer)} ids) has {held!r} there: that token would "
            "read as the mask",
            "serve the tokenizer training used",
        )
    return ok(
        f"mask token {mask}: training's, in the target's embedding, no other token in the serving tokenizer"
    )


def target_layers_as_engines_read(ev: BlockEvidence) -> Result:
    """Each engine checked captures the training layers (count and order; SGLang and vLLM number
    them 0-based, + 1: `DFLASH_FACTS`), all inside the target."""
    cfg = ev.need_drafter().cfg
    trained = tuple(ev.manifest.aux_layers) if ev.manifest else cfg.aux_layers
    layers = ev.facts.num_layers
    if max(trained) > layers or layers != cfg.target_num_layers:
        past = "reach past" if max(trained) > layers else "were chosen for a target of"
        return fail(
            f"training layers {list(trained)} (specdraft indices) {past} the target's {layers} "
            f"layers (trained on {cfg.target_num_layers})",
            "serve the target it was trained on",
        )
    seen = {e: reads.engine_aux_layers(ev.reading(e), e, layers) for e in ev.engines}
    wrong = {e: got for e, got in seen.items() if got != trained}
    if wrong:
        named = "; ".join(
            f"{engine_name(e)} captures {both_numberings(g) if g else 'none'}"
            for e, g in wrong.items()
        )
        sources = {
            f.source for f in DFLASH_FACTS if f.fact == "target layer ids" and f.engine in wrong
        }
        return fail(
            f"{named}; the drafter was trained on {both_numberings(trained)} "
            f"({'; '.join(sorted(sources))})",
            f"write dflash_config.target_layer_ids {[i - 1 for i in trained]} (0-based target "
            "layer ids) and no other id list (specdraft export writes it)",
        )
    engines = " and ".join(engine_name(e) for e in seen)
    return ok(f"{engines} capture {both_numberings(trained)} of {layers} layers, as trained")


def both_numberings(aux_layers) -> str:
    """Aux layers named in both numberings: "[2, 3, 4] (specdraft indices; 0-based target layer
    ids [1, 2, 3])", the second being what dflash_config.target_layer_ids holds."""
    ids = [i - 1 for i in aux_layers]
    return f"{list(aux_layers)} (specdraft indices; 0-based target layer ids {ids})"


def draft_attention_as_engines_run(ev: BlockEvidence) -> Result:
    """Each engine checked runs every draft layer with training's attention: a sliding window
    where training had one (SGLang reads layer_types only), full and bidirectional elsewhere."""
    trained = reads.trained_attention(ev.need_dflash_config())
    problems = []
    for engine in ev.engines:
        runs = reads.engine_attention(ev.reading(engine), engine)
        for i, (want, got) in enumerate(zip(trained, runs)):
            if want != got:
                problems.append(
                    f"{engine_name(engine)} runs layer {i} {got.describe()}, trained {want.describe()}"
                )
    if problems:
        return fail(
            "; ".join(problems[:6]),
            "write layer_types naming each layer's attention (sliding_attention with "
            "sliding_window; speculators: sliding_window_non_causal true for bidirectional "
            "layers), or serve with an engine that reads them",
        )
    kinds = sorted({a.describe() for a in trained})
    return ok(
        f"every draft layer runs {' / '.join(kinds)} in {' and '.join(map(engine_name, ev.engines))}, as trained"
    )


BLOCK_CHECKS = (
    target_matches_training,  # the EAGLE-3 doctor's, on the manifest and --target alike
    config_kind_matches_weights,
    dflash_files_load,
    block_size_matches_engine,
    mask_token_matches_training,
    tokenizer_matches_manifest,
    chat_template_matches_manifest,
    target_layers_as_engines_read,
    draft_attention_as_engines_run,
    block_acceptance_offline,
    block_acceptance_online,
)
