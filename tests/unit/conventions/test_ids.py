"""Aux-layer conventions per engine (table-driven over target depths) and the vocabulary map."""

import itertools

import pytest
import torch

from specdraft.conventions import (
    ConventionError,
    aux_layers_from_config,
    default_aux_layers,
    default_layers_captured,
    engine_default_ids,
    from_engine_ids,
    lint_sglang_ids,
    to_engine_ids,
)
from specdraft.conventions.rules import ENGINE_RULES
from specdraft.data.vocab import (
    build_vocab_map,
    draft_to_target_ids,
    target_ids_of_draft_vocab,
    validate_vocab_map,
)

# L -> (specdraft default, SGLang ids on Llama class, any version)
DEPTHS = {
    4: ([1, 2, 3], [0, 1, 2]),
    5: ([2, 3, 4], [1, 2, 3]),
    8: ([2, 4, 5], [1, 3, 4]),
    12: ([2, 6, 9], [1, 5, 8]),
    32: ([2, 16, 29], [1, 15, 28]),
    61: ([2, 30, 58], [1, 29, 57]),
}
SGLANG_VERSIONS = [None, "0.5.12", "0.5.13", "0.5.14", "0.5.21", "0.5.22", "0.5.23"]


@pytest.mark.parametrize("num_layers", sorted(DEPTHS))
def test_defaults_and_ids_per_depth(num_layers):
    layers, sglang_ids = DEPTHS[num_layers]
    assert default_aux_layers(num_layers) == layers
    assert to_engine_ids(layers, "sglang", num_layers) == sglang_ids
    assert to_engine_ids(layers, "vllm", num_layers) == layers
    assert to_engine_ids(layers, "speculators", num_layers) == layers
    assert from_engine_ids(sglang_ids, "sglang", num_layers) == layers
    assert from_engine_ids(layers, "vllm", num_layers) == layers


@pytest.mark.parametrize("num_layers", sorted(DEPTHS))
def test_round_trip_wherever_expressible(num_layers):
    candidates = [
        default_aux_layers(num_layers),
        [1, 2, num_layers - 1],
        [0, 3, num_layers],
        [3, num_layers // 2 + 1, num_layers - 1],
    ]
    num_round_trips = 0
    for engine, target_class, version, layers in itertools.product(
        ["sglang", "vllm", "speculators"], ["llama", "deepseek"], SGLANG_VERSIONS, candidates
    ):
        try:
            ids = to_engine_ids(layers, engine, num_layers, target_class, version)
        except ConventionError:
            continue
        assert from_engine_ids(ids, engine, num_layers, target_class, version) == layers
        num_round_trips += 1
    assert num_round_trips >= 60


def test_engine_defaults_pinned_and_equal():
    assert engine_default_ids("sglang", 32) == [1, 15, 28]
    assert engine_default_ids("vllm", 32) == [2, 16, 29]
    for num_layers in (8, 12, 32, 61):
        expected = [2, num_layers // 2, num_layers - 3]
        assert default_layers_captured(num_layers) == expected
        for engine in ("sglang", "vllm"):
            ids = engine_default_ids(engine, num_layers)
            assert from_engine_ids(ids, engine, num_layers) == expected
    assert default_layers_captured(5) == [2]  # the default collapses: write explicit ids


def test_small_depth_defaults():
    assert default_aux_layers(6) == [2, 3, 5]
    assert default_aux_layers(7) == [2, 3, 4]
    for bad in (0, 3, True):
        with pytest.raises(ConventionError, match="at least 4"):
            default_aux_layers(bad)


def test_case_s3_conventions_small():
    # 12-layer target trained on [0, 3, 7]; serving config SGLang ids meaning [3, 7, 10].
    assert to_engine_ids([0, 3, 7], "vllm", 12) == [0, 3, 7]
    with pytest.raises(ConventionError) as err:
        to_engine_ids([0, 3, 7], "sglang", 12)
    assert "id -1 (embeddings) is not capturable on Llama-class targets in SGLang" in str(err.value)
    assert from_engine_ids([2, 6, 9], "sglang", 12) == [3, 7, 10]


@pytest.mark.parametrize("version", [None, "0.5.12", "0.5.21"])
def test_sglang_llama_embeddings_refused(version):
    with pytest.raises(ConventionError, match=r"id -1 \(embeddings\) is not capturable on Llama"):
        to_engine_ids([0, 3, 7], "sglang", 12, sglang_version=version)
    with pytest.raises(ConventionError, match="embeddings"):
        from_engine_ids([-1, 2, 6], "sglang", 12, sglang_version=version)


def test_sglang_llama_embeddings_from_0_5_22():
    assert to_engine_ids([0, 3, 7], "sglang", 12, sglang_version="0.5.22") == [-1, 2, 6]
    assert from_engine_ids([-1, 2, 6], "sglang", 12, sglang_version="0.5.23") == [0, 3, 7]


@pytest.mark.parametrize("target_class", ["llama", "deepseek"])
@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_sglang_cannot_capture_last_layer(target_class, version):
    with pytest.raises(ConventionError, match="before the final norm"):
        to_engine_ids([2, 6, 12], "sglang", 12, target_class, version)
    with pytest.raises(ConventionError, match="before the final norm"):
        from_engine_ids([1, 5, 11], "sglang", 12, target_class, version)  # first id 1: all add 1


def test_vllm_last_layer_and_embeddings_by_class():
    assert to_engine_ids([0, 6, 12], "vllm", 12) == [0, 6, 12]
    assert from_engine_ids([0, 6, 12], "vllm", 12) == [0, 6, 12]
    # vLLM 0.32 deepseek_v2.py: index L is appended after the loop; index 0 has no residual yet
    assert to_engine_ids([2, 6, 12], "vllm", 12, "deepseek") == [2, 6, 12]
    assert from_engine_ids([2, 6, 12], "vllm", 12, "deepseek") == [2, 6, 12]
    with pytest.raises(
        ConventionError,
        match="id 0 .embeddings. is not capturable on DeepSeek-class targets in vLLM",
    ):
        to_engine_ids([0, 6, 9], "vllm", 12, "deepseek")
    with pytest.raises(ConventionError, match="outside 0..12"):
        from_engine_ids([2, 6, 13], "vllm", 12)


def test_sglang_deepseek_first_id_rule():
    # first index 2 -> first id 1: every SGLang version adds 1, so no version is needed
    assert to_engine_ids([2, 16, 29], "sglang", 32, "deepseek") == [1, 15, 28]
    assert from_engine_ids([1, 15, 28], "sglang", 32, "deepseek") == [2, 16, 29]
    # any other first id reads differently before and after 0.5.13
    with pytest.raises(ConventionError, match="pass --sglang-version"):
        to_engine_ids([3, 16, 29], "sglang", 32, "deepseek")
    with pytest.raises(ConventionError, match="pass --sglang-version"):
        from_engine_ids([2, 16, 29], "sglang", 32, "deepseek")
    assert to_engine_ids([3, 16, 29], "sglang", 32, "deepseek", "0.5.12") == [2, 15, 28]
    assert to_engine_ids([3, 16, 29], "sglang", 32, "deepseek", "0.5.13.post1") == [3, 16, 29]
    assert from_engine_ids([2, 16, 29], "sglang", 32, "deepseek", "0.5.12") == [3, 17, 30]
    assert from_engine_ids([2, 16, 29], "sglang", 32, "deepseek", "0.5.14") == [2, 16, 29]
    # Llama class always adds 1, whatever the first id
    assert from_engine_ids([2, 16, 29], "sglang", 32, "llama", "0.5.23") == [3, 17, 30]


def test_sglang_deepseek_first_index_1_and_embeddings():
    assert to_engine_ids([1, 2, 3], "sglang", 4, "deepseek", "0.5.12") == [0, 1, 2]
    with pytest.raises(ConventionError, match="index 1 cannot be the first"):
        to_engine_ids([1, 2, 3], "sglang", 4, "deepseek", "0.5.13")
    with pytest.raises(ConventionError, match="index 1 cannot be the first"):
        to_engine_ids([1, 2, 3], "sglang", 4, "deepseek")
    with pytest.raises(ConventionError, match="embeddings"):
        to_engine_ids([0, 3, 7], "sglang", 12, "deepseek", "0.5.13")
    assert to_engine_ids([0, 3, 7], "sglang", 12, "deepseek", "0.5.14") == [0, 3, 7]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("layers", [[2, 6], [2, 4, 6, 9]])
def test_exactly_three_for_sglang_and_vllm(engine, layers):
    with pytest.raises(ConventionError, match="SGLang and vLLM both read exactly 3 aux states"):
        to_engine_ids(layers, engine, 12)
    with pytest.raises(ConventionError, match="SGLang and vLLM both read exactly 3 aux states"):
        from_engine_ids(layers, engine, 12)


def test_speculators_count_free():
    assert to_engine_ids([2, 4, 6, 9], "speculators", 12) == [2, 4, 6, 9]


@pytest.mark.parametrize("layers", [[3, 2, 9], [2, 2, 9], [-1, 2, 9], [2, 6, 13], [2, 6.0, 9]])
def test_bad_layer_lists_refused(layers):
    with pytest.raises(ConventionError):
        to_engine_ids(layers, "vllm", 12)


def test_from_engine_ids_order_and_duplicates():
    assert from_engine_ids([9, 2, 6], "vllm", 12) == [2, 6, 9]  # captured in layer order
    with pytest.raises(ConventionError, match="twice"):
        from_engine_ids([2, 2, 6], "vllm", 12)


def test_bad_arguments():
    with pytest.raises(ConventionError, match="unknown engine"):
        to_engine_ids([2, 6, 9], "tensorrt", 12)
    with pytest.raises(ConventionError, match="unknown target class"):
        to_engine_ids([2, 6, 9], "vllm", 12, "gpt-oss")
    with pytest.raises(ConventionError, match="cannot parse SGLang version"):
        to_engine_ids([2, 6, 9], "sglang", 12, sglang_version="latest")
    assert issubclass(ConventionError, ValueError)


def test_rule_table_rows_name_sources_and_cover_versions():
    for rule in ENGINE_RULES:
        assert rule.source and rule.evidence
        assert rule.offset in ("plus1", "as_is", "plus1_if_first_is_1", "plus1_unless_last_is_L")
    for version in ("0.4.0", "0.5.13", "0.5.14", "9.0.0"):
        for target_class in ("llama", "deepseek"):
            # exactly one SGLang row per class and version
            to_engine_ids([2, 6, 9], "sglang", 12, target_class, version)


def test_aux_layers_from_config_readings():
    nested_only = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
    reading = aux_layers_from_config(nested_only, 32)
    assert (reading.sglang, reading.vllm) == ([2, 16, 29], [1, 15, 28])
    assert reading.default == [2, 16, 29]
    assert reading.differs
    both = dict(nested_only, eagle_aux_hidden_state_layer_ids=[2, 16, 29])
    assert not aux_layers_from_config(both, 32).differs
    neither = aux_layers_from_config(
        {"eagle_config": {}, "eagle_aux_hidden_state_layer_ids": []}, 32
    )
    assert (neither.sglang, neither.vllm) == (None, None)
    assert neither.captured("sglang") == neither.captured("vllm") == [2, 16, 29]
    assert neither.problems() == []
    with pytest.raises(ConventionError, match="SGLang captures no aux states"):
        aux_layers_from_config({"eagle_config": {"eagle_aux_hidden_state_layer_ids": []}}, 32)
    top_only = aux_layers_from_config({"eagle_aux_hidden_state_layer_ids": [0, 3, 7]}, 12)
    assert top_only.sglang is None and top_only.vllm == [0, 3, 7]
    assert top_only.captured("sglang") == [2, 6, 9] and top_only.differs


def test_aux_layers_from_config_deepseek_needs_version():
    config = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}}
    with pytest.raises(ConventionError, match="pass --sglang-version"):
        aux_layers_from_config(config, 32, "deepseek")
    assert not aux_layers_from_config(config, 32, "deepseek", "0.5.14").differs
    assert aux_layers_from_config(config, 32, "deepseek", "0.5.12").differs


def test_lint_sglang_ids():
    assert lint_sglang_ids([1, 15, 28], "deepseek") == []
    assert lint_sglang_ids(None, "deepseek") == []
    (problem,) = lint_sglang_ids([2, 16, 29], "deepseek")
    assert "not 1" in problem and "0.5.13" in problem


# ------------------------------------------------------------------------------ vocabulary map


def test_build_vocab_map_top_n_ties_and_order():
    counts = torch.tensor([5, 9, 0, 9, 1, 7, 9, 0], dtype=torch.int64)
    vmap = build_vocab_map(counts, 4)
    # counts 9, 9, 9 (ids 1, 3, 6), then 7 (id 5); ids ascending
    assert target_ids_of_draft_vocab(vmap.d2t).tolist() == [1, 3, 5, 6]
    assert vmap.d2t.tolist() == [1, 2, 3, 3]
    assert vmap.d2t.dtype == torch.int64 and vmap.t2d.dtype == torch.bool
    assert vmap.t2d.nonzero().flatten().tolist() == [1, 3, 5, 6]
    tie = build_vocab_map(torch.tensor([3, 3, 3, 3]), 2)  # ties broken by the lower id
    assert target_ids_of_draft_vocab(tie.d2t).tolist() == [0, 1]


def test_build_vocab_map_limit_and_fill():
    counts = torch.tensor([0, 4, 0, 0, 2, 0, 50, 60])  # ids 6, 7 are embedding padding rows
    vmap = build_vocab_map(counts, 4, vocab_limit=6)
    # two ids with counts (1, 4), then the lowest unused ids (0, 2) fill the rest
    assert target_ids_of_draft_vocab(vmap.d2t).tolist() == [0, 1, 2, 4]
    assert vmap.t2d.shape == (8,) and not vmap.t2d[6:].any()


def test_build_vocab_map_refusals():
    counts = torch.ones(8, dtype=torch.int64)
    with pytest.raises(ValueError, match="usable"):
        build_vocab_map(counts, 7, vocab_limit=6)
    with pytest.raises(ValueError, match="negative"):
        build_vocab_map(torch.tensor([1, -1, 2]), 2)
    with pytest.raises(ValueError, match="integer"):
        build_vocab_map(torch.ones(8), 2)
    with pytest.raises(ValueError, match="vocab_limit"):
        build_vocab_map(counts, 2, vocab_limit=9)


def test_draft_to_target_ids():
    d2t = torch.tensor([1, 2, 3, 3])
    draft_ids = torch.tensor([[0, 3], [2, 1]], dtype=torch.int32)
    out = draft_to_target_ids(draft_ids, d2t)
    assert out.dtype == torch.int64 and out.tolist() == [[1, 6], [5, 3]]


def test_validate_vocab_map_bounds_the_map_by_the_tokenizers_length():
    """Target ids from `usable` (the tokenizer's length) on are embedding padding: a map into
    them is refused, one that stops below it passes; a full vocabulary has no map to refuse."""
    vmap = build_vocab_map(torch.tensor([0, 5, 0, 4, 0, 3, 2, 1]), 4)  # target ids 1, 3, 5, 6
    assert validate_vocab_map(vmap.d2t, vmap.t2d, 8, 4, usable=7) == []
    assert validate_vocab_map(vmap.d2t, vmap.t2d, 8, 4) == []  # no bound recorded: the vocabulary's
    (problem,) = validate_vocab_map(vmap.d2t, vmap.t2d, 8, 4, usable=6)
    assert problem.startswith(
        "d2t maps 1 draft ids to target ids 6..6, past the tokenizer's 6 tokens "
        "(rows 6..7 of the target's embedding are padding"
    )
    assert "vocab_limit=6" in problem
    full = build_vocab_map(torch.ones(8, dtype=torch.int64), 8)
    assert validate_vocab_map(full.d2t, full.t2d, 8, 8, usable=6) == []


def test_a_users_dtype_and_aux_layers_are_refused_as_specdraft_errors():
    from specdraft.conventions import (
        ConventionError,
        UnknownDtype,
        check_aux_flag,
        parse_dtype,
        split_aux_option,
    )
    from specdraft.errors import SpecdraftError

    with pytest.raises(UnknownDtype, match="unknown dtype 'int4'; use one of bfloat16, bf16") as e:
        parse_dtype("int4")
    assert isinstance(e.value, SpecdraftError) and isinstance(e.value, ValueError)
    with pytest.raises(ConventionError, match="'hf' is no aux-id convention; write specdraft"):
        split_aux_option("hf:1,2,3")
    with pytest.raises(ConventionError, match=r"--aux-layers 3,2,1: .*give 3 increasing layers"):
        check_aux_flag([3, 2, 1], 8)


def test_unknown_sglang_version_names_each_refusing_range_and_where_the_rule_changes():
    """DeepSeek, embeddings among the aux layers (issue #34 item 11): SGLang < 0.5.13 and 0.5.13
    both refuse them (0.5.13 captures before layer 0 too); the rule changes at 0.5.14."""
    with pytest.raises(ConventionError) as err:
        to_engine_ids([0, 3, 5], "sglang", 7, "deepseek")
    message = str(err.value)
    assert "targets in SGLang < 0.5.13;" in message
    assert "targets in SGLang >= 0.5.13, < 0.5.14;" in message
    assert message.endswith("pass --sglang-version if you serve SGLang >= 0.5.14, which can")
    assert to_engine_ids([0, 3, 5], "sglang", 7, "deepseek", "0.5.14") == [0, 3, 5]


def test_misreadings_name_the_classes_that_read_ids_as_other_layers():
    from specdraft.conventions import misreadings

    # SGLang ids 0, 2, 4 (layers 1, 3, 5 on Llama): DeepSeek's first-id rule reads them as-is
    # from 0.5.14, and 0.5.13 cannot capture id 0's layer: only the as-is reading is a misread
    assert misreadings([0, 2, 4], "sglang", 7, [1, 3, 5]) == [
        "DeepSeek-class targets in SGLang >= 0.5.14"
    ]
    assert misreadings([0, 2, 4], "sglang", 7, [1, 3, 5], "0.5.13") == []
    assert misreadings([1, 2, 3], "sglang", 5, [2, 3, 4]) == []  # a first id 1 reads +1 alike
    assert misreadings([2, 3, 4], "vllm", 5, [2, 3, 4]) == []
