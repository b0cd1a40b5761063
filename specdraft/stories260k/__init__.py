"""stories260K, the bundled default target: read its llama2.c files, convert it to transformers.

The package ships Karpathy's stories260K (a 260K-parameter TinyStories Llama, MIT) and its
512-piece tokenizer in llama2.c's binary formats (`specdraft/assets/stories260K/`, README
there for provenance). `convert_stories260k` writes a float32 `LlamaForCausalLM` directory
with a matching tokenizer, which the rest of specdraft loads like any transformers target.
The checkpoint format and its transformers names: `llama2c`; the tokenizer's, here.
Formats: shared/models/README.md and llama2.c's `run.c` (`read_checkpoint`, `encode`).
"""

from __future__ import annotations

import json
import shutil
import struct
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
from tokenizers.models import BPE
from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdraft.checkpoint import file_sha256
from specdraft.files import atomic_dir
from specdraft.stories260k.llama2c import (
    BOS_ID,
    EOS_ID,
    UNK_ID,
    Llama2cError,
    llama_config,
    llama_state_dict,
    read_llama2c_checkpoint,
)

CHECKPOINT_FILE = "stories260K.bin"
TOKENIZER_FILE = "tok512.bin"
SAMPLE_FILE = "tinystories_sample.txt"
EXPECTED_TOKENS_FILE = "expected_tokens.json"
LICENSE_FILE = "LICENSE"
SOURCE_SHA256 = {
    CHECKPOINT_FILE: "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696",
    TOKENIZER_FILE: "037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312",
}
# Written into a converted directory; a directory whose record matches is not converted again.
SOURCE_RECORD_FILE = "specdraft_source.json"
CONVERTER_VERSION = 2  # 2: generation_config.json ends at BOS too (`END_IDS`)
CONVERTER = f"specdraft.stories260k v{CONVERTER_VERSION}"  # recorded in a conversion; the demo's cache keys on it
CONVERTED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")

# The ids a generation ends at (generation_config.json's eos_token_id): EOS, and BOS, which
# the model emits where a story ends (llama2.c's tinystories.py encodes each training story
# with bos=True, eos=False); llama2.c's run.c stops there: "the BOS (=1) token delimits sequences".
END_IDS = [EOS_ID, BOS_ID]
SPECIAL_PIECES = ("<unk>", "<s>", "</s>")
BYTE_OFFSET = 3  # byte b is id 3 + b, piece "<0xBB>"
SPACE_PIECE = "\u2581"  # "▁", SentencePiece's visible space


def bundled_dir() -> Path:
    """The folder of the packaged stories260K files (weights, tokenizer, sample text, license)."""
    folder = resources.files("specdraft.assets") / "stories260K"
    if not isinstance(folder, Path):
        raise RuntimeError(
            f"specdraft's assets are not on the file system ({folder}); install it unzipped"
        )
    return folder


def verify_sha256(path: Path, expected: str) -> str:
    """Return the file's sha256 if it equals `expected`, else raise a one-line Llama2cError (a
    ValueError).

    The error names the file and both digests. A modified stories260K.bin with the original
    size and header circulates in public repositories (it generates gibberish), hence a hash
    rather than a size check.
    """
    actual = file_sha256(path)
    if actual != expected:
        raise Llama2cError(
            f"{path}: sha256 {actual}, expected {expected}: corrupted or a different file (a modified "
            f"copy of stories260K.bin with the same size and header circulates and generates gibberish); "
            f"use the files bundled in specdraft/assets/stories260K"
        )
    return actual


def read_llama2c_tokenizer(path: Path) -> list[tuple[bytes, float]]:
    """Read a llama2.c tokenizer file: (piece bytes, score) per id, in id order.

    Layout: int32 max_token_length, then per piece float32 score, int32 length, bytes. Spaces
    are stored as " " (not "▁"); llama2.c stores BOS/EOS as "\\n<s>\\n" and "\\n</s>\\n".
    Raises Llama2cError (a ValueError) naming the file when it is truncated or malformed.
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 4:
        raise Llama2cError(f"{path}: {len(data)} bytes, too short for a llama2.c tokenizer")
    (max_length,) = struct.unpack_from("<i", data, 0)
    pieces, offset = [], 4
    while offset < len(data):
        if offset + 8 > len(data):
            raise Llama2cError(f"{path}: truncated in the entry of token {len(pieces)}")
        score, length = struct.unpack_from("<fi", data, offset)
        offset += 8
        if not 0 < length <= max_length or offset + length > len(data):
            raise Llama2cError(
                f"{path}: token {len(pieces)} has length {length} (max {max_length}): truncated or corrupt"
            )
        pieces.append((data[offset : offset + length], score))
        offset += length
    return pieces


def build_tokenizer(
    pieces: list[tuple[bytes, float]], *, model_max_length: int = 512
) -> PreTrainedTokenizerFast:
    """A transformers tokenizer that encodes exactly as llama2.c's `encode` (with BOS) does.

    llama2.c's encoder: prepend " " to non-empty text, start from one piece per code point
    (bytes absent from the vocabulary fall back to ids 3 + byte), then repeatedly merge the
    adjacent pair whose concatenation is the highest-scoring piece. Here that is a
    `tokenizers` BPE with byte fallback, "▁" for spaces, a Prepend("▁") normalizer (which
    leaves empty text alone) and every (left, right) split of every piece as a merge, ranked
    by the merged piece's score. BOS (`<s>` = 1) is added, never EOS (`</s>` = 2). Known
    differences from llama2.c, both on text it never sees in practice: a literal "▁" encodes
    as a space (llama2.c: 3 bytes), and "<s>", "</s>", "<unk>" as their special ids (as every
    transformers Llama tokenizer does; llama2.c spells them out).
    """
    bos = SPECIAL_PIECES[BOS_ID]
    return PreTrainedTokenizerFast(
        tokenizer_object=_bpe_tokenizer(pieces),
        unk_token=SPECIAL_PIECES[UNK_ID],
        bos_token=bos,
        eos_token=SPECIAL_PIECES[EOS_ID],
        add_bos_token=True,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


def _bpe_tokenizer(pieces: list[tuple[bytes, float]]) -> Tokenizer:
    """`build_tokenizer`'s `tokenizers` object: the BPE model with byte fallback and merges by
    score, the "▁" normalizer and decoder, the special pieces, BOS prepended."""
    vocab, scores = _vocab_and_scores(pieces)
    model = BPE(
        vocab=vocab,
        merges=_merges_by_score(vocab, scores),
        unk_token=SPECIAL_PIECES[UNK_ID],
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend(SPACE_PIECE), normalizers.Replace(" ", SPACE_PIECE)]
    )
    tokenizer.decoder = decoders.Sequence(  # the Strip drops the space that Prepend added
        [
            decoders.Replace(SPACE_PIECE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tokenizer.add_special_tokens(
        [AddedToken(p, special=True, normalized=False) for p in SPECIAL_PIECES]
    )
    bos = SPECIAL_PIECES[BOS_ID]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, BOS_ID)]
    )
    return tokenizer


def _vocab_and_scores(pieces: list[tuple[bytes, float]]) -> tuple[dict[str, int], list[float]]:
    """Piece strings in the "▁" convention, checking llama2.c's fixed ids for specials and bytes."""
    first_regular = BYTE_OFFSET + 256
    if len(pieces) <= first_regular:
        raise Llama2cError(
            f"tokenizer has {len(pieces)} pieces; llama2.c's layout needs over {first_regular}"
        )
    vocab = {}
    for token_id, (raw, _) in enumerate(pieces):
        if token_id < BYTE_OFFSET:
            piece = SPECIAL_PIECES[token_id]
            if raw.strip() != piece.encode():
                raise Llama2cError(f"tokenizer piece {token_id} is {raw!r}, expected {piece!r}")
        elif token_id < first_regular:
            piece = f"<0x{token_id - BYTE_OFFSET:02X}>"
            if raw != piece.encode():
                raise Llama2cError(
                    f"tokenizer piece {token_id} is {raw!r}, expected byte piece {piece!r}"
                )
        else:
            piece = raw.decode("utf-8").replace(" ", SPACE_PIECE)
        if piece in vocab:
            raise Llama2cError(
                f"tokenizer piece {piece!r} appears twice (ids {vocab[piece]} and {token_id})"
            )
        vocab[piece] = token_id
    return vocab, [score for _, score in pieces]


def _merges_by_score(vocab: dict[str, int], scores: list[float]) -> list[tuple[str, str]]:
    """Every split of every regular piece into two regular pieces, best merged score first."""
    regular = {piece for piece, token_id in vocab.items() if token_id >= BYTE_OFFSET + 256}
    ranked = []
    for piece in regular:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in regular and right in regular:
                ranked.append((-scores[vocab[piece]], vocab[piece], cut, left, right))
    return [(left, right) for *_, left, right in sorted(ranked)]


def convert_stories260k(out_dir: Path, *, source_dir: Path | None = None) -> Path:
    """Write stories260K as a transformers `LlamaForCausalLM` directory; return `out_dir`.

    Reads `stories260K.bin` and `tok512.bin` from `source_dir` (default: the bundled files),
    checks their sha256, and writes config.json, generation_config.json (ending at `END_IDS`),
    model.safetensors (float32, tied embeddings), the tokenizer files, the MIT LICENSE and a
    record of the source hashes and the converter (`CONVERTER`). Written to a temporary sibling
    folder, then renamed into place. Returns at once when `out_dir` already holds a conversion
    of the same files by this converter version (an older one's is converted again).
    Raises Llama2cError (a ValueError) for a bad source file, or when `out_dir` is a non-empty
    folder that is
    not a stories260K conversion (it is never overwritten).
    """
    out_dir = Path(out_dir)
    source_dir = bundled_dir() if source_dir is None else Path(source_dir)
    record = _source_record(source_dir)
    if _holds_conversion(out_dir, record):
        return out_dir
    _check_replaceable(out_dir)
    with atomic_dir(out_dir) as staging:
        _write_conversion(staging, source_dir, record)
    return out_dir


def is_converted(out_dir: Path, *, source_dir: Path | None = None) -> bool:
    """True when `out_dir` already holds what `convert_stories260k` would write there (it returns at
    once): a conversion of the same source files (default: the bundled ones) by this converter version.
    Raises Llama2cError (a ValueError) for a bad source file."""
    return _holds_conversion(
        Path(out_dir), _source_record(bundled_dir() if source_dir is None else Path(source_dir))
    )


def _source_record(source_dir: Path) -> dict:
    """The record a conversion of `source_dir`'s files writes: the converter and the checked hashes."""
    return {
        "converter": CONVERTER,
        "sha256": {
            name: verify_sha256(source_dir / name, digest) for name, digest in SOURCE_SHA256.items()
        },
    }


def _holds_conversion(out_dir: Path, record: dict) -> bool:
    return _read_record(out_dir) == record and all(
        (out_dir / name).is_file() for name in CONVERTED_FILES
    )


def _write_conversion(folder: Path, source_dir: Path, record: dict) -> None:
    header, tensors = read_llama2c_checkpoint(source_dir / CHECKPOINT_FILE)
    pieces = read_llama2c_tokenizer(source_dir / TOKENIZER_FILE)
    if len(pieces) != header.vocab_size:
        raise Llama2cError(
            f"{source_dir / TOKENIZER_FILE}: {len(pieces)} pieces, "
            f"but {CHECKPOINT_FILE} has vocab {header.vocab_size}"
        )
    model = LlamaForCausalLM(llama_config(header))
    model.load_state_dict(llama_state_dict(header, tensors), strict=True)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=END_IDS)
    model.save_pretrained(folder)
    _add_legacy_rope_theta(folder / "config.json")
    build_tokenizer(pieces, model_max_length=header.seq_len).save_pretrained(folder)
    shutil.copyfile(bundled_dir() / LICENSE_FILE, folder / LICENSE_FILE)
    (folder / SOURCE_RECORD_FILE).write_text(json.dumps(record, indent=1) + "\n")


def _add_legacy_rope_theta(config_path: Path) -> None:
    # transformers 5 keeps theta in `rope_parameters`; loaders written for 4.x read only the
    # top-level key and silently fall back to 10000, so write both (transformers 5 accepts it).
    config = json.loads(config_path.read_text())
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _read_record(out_dir: Path) -> dict | None:
    path = out_dir / SOURCE_RECORD_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def _check_replaceable(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise Llama2cError(f"{out_dir}: exists and is not a folder; choose another output folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / SOURCE_RECORD_FILE).exists():
        raise Llama2cError(
            f"{out_dir}: not empty and not a stories260K conversion (no {SOURCE_RECORD_FILE}); "
            f"choose an empty or new folder"
        )
