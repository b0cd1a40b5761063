"""specdraft.bench.tune_load / load_schedule / load_render: `tune --concurrency` on the tiny
target through the batching engine (acceptance and tokens real, seconds from a cost model in
which speculation wins at batch 1 and loses at batch 8: `tests.support.load_helpers`), the
schedule's rows, its files and launch lines, and the refusals of a bad schedule file."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdraft.bench.load_render import launch_lines, load_report, write_and_render
from specdraft.bench.load_schedule import (
    LoadReport,
    schedule_rows,
    write_schedule_files,
)
from specdraft.bench.tune_load import BatchRun, Level, LoadBench, LoadModel, line_fit
from specdraft.bench.tune_model import TuneConfig
from specdraft.cli import app
from specdraft.conventions.spec_schedule import VLLM_SCHEDULE_KEY
from specdraft.engine.requests import SpecMetrics
from specdraft.engine.schedule import TREES_KEY, BatchSchedule, ScheduleError, read_schedule
from specdraft.engine.spec_config import SpecConfig
from tests.support.cli import cli_args, flat
from tests.support.dflash import engine_dflash_draft, save_engine_dflash
from tests.support.engine_helpers import (  # noqa: F401
    copy_with_word_tokenizer,
    greedy_sequences,
    one_thread,
    random_prompts,
    tiny_setup,
)
from tests.support.load_helpers import modelled_load_bench
from tests.support.serve_helpers import saved_pair, text_prompts, write_prompts

COSTS = {"fixed_s": 0.010, "row_s": 0.002, "draft_s": 0.004}


@pytest.fixture(scope="module")
def report() -> LoadReport:
    setup = tiny_setup("llama")
    cfg = TuneConfig(max_new_tokens=16, probe_steps=3, topks=(1,), repeats=3)
    prompts = random_prompts(3, 8, seed=2)  # among the drafter's training prompts: tau ~2
    bench = modelled_load_bench(setup.target, setup.trained, prompts, cfg, **COSTS)
    return load_report(bench, (1, 2, 8), 1024, draft_path="/ckpt/draft")


def test_each_batch_size_measures_plain_and_every_chain_depth(report):
    assert [level.batch_size for level in report.levels] == [1, 2, 8]
    for level in report.levels:
        assert list(level.candidates) == [SpecConfig.chain(k) for k in (1, 2, 3)]
        assert level.plain_tps > 0
        assert len(level.plain_runs) == 3 and all(len(r) == 3 for r in level.runs.values())
        for k, cand in level.candidates.items():
            # the model is linear in K and in B as the modelled costs are: prediction ~ measurement
            assert cand.predicted_tps == pytest.approx(cand.measured_tps, rel=0.2), (level, k)
            assert cand.measured_tau == pytest.approx(cand.predicted_tau, abs=0.2)
        assert level.plain_predicted_tps == pytest.approx(level.plain_tps, rel=0.05)
    # a round of b rows at K costs fixed + row b (K + 1) + draft b K: the fitted lines recover it
    assert report.model.a == pytest.approx((0.010, 0.002), abs=2e-3)
    assert report.model.b == pytest.approx((0.0, 0.006), abs=1e-3)


def test_speculation_wins_at_batch_1_and_loses_at_batch_8(report):
    one, _, eight = report.levels
    assert one.chosen is not None and one.candidates[one.chosen].speedup >= 1.05
    assert eight.chosen is None and all(c.speedup < 1.05 for c in eight.candidates.values())
    rows = report.rows()
    assert rows[0][:2] == [1, rows[0][1]] and rows[0][2] == one.chosen_k
    assert rows[-1] == [rows[-1][0], 1024, 0] and rows[-1][0] in (2, 8)
    BatchSchedule.of(rows).check_depth(report.depth)  # contiguous, 1..1024


def test_launch_lines_and_files(report, tmp_path):
    config = json.loads(report.vllm_flags().split("--speculative-config ")[1].split("' ")[0][1:])
    assert config[VLLM_SCHEDULE_KEY] == report.rows()
    assert config["num_speculative_tokens"] == report.max_k == max(k for *_, k in report.rows())
    assert config["method"] == "eagle3" and report.vllm_flags().endswith("--max-num-seqs 1024")
    written = write_schedule_files(report, tmp_path)
    data = json.loads(written["serve"].read_text())
    assert data == {VLLM_SCHEDULE_KEY: report.rows()}
    assert read_schedule(written["serve"], report.depth).entries == tuple(map(tuple, report.rows()))
    adaptive = json.loads(written["sglang"].read_text())
    assert adaptive == {str(lo): {"candidate_steps": [k]} for lo, _, k in report.rows()}
    text = write_and_render(report, tmp_path)
    assert f"--speculative-adaptive-config {written['sglang']}" in text
    assert f"--num-steps {report.max_k} --spec-schedule {written['serve']}" in text
    assert "B 8: K 3" in text and "pred tok/s" in text and "(no tree: --topks 1)" in text
    assert json.loads(json.dumps(report.to_dict()))[VLLM_SCHEDULE_KEY] == report.rows()


def level(batch_size: int, chosen: int | SpecConfig) -> Level:
    """A level choosing chosen (a chain's K, 0 for none, or a setting)."""
    if isinstance(chosen, int):
        chosen = SpecConfig.chain(chosen) if chosen else None
    return Level(batch_size, [], {}, chosen=chosen)


def test_rows_cover_one_to_max_num_seqs_and_merge_equal_k():
    levels = [level(1, 3), level(2, 3), level(4, 2), level(16, 0), level(32, 0)]
    assert schedule_rows(levels, 256) == [[1, 3, 3], [4, 15, 2], [16, 256, 0]]
    assert schedule_rows([level(4, 2)], 8) == [[1, 8, 2]]  # the first row starts at 1
    assert schedule_rows([level(1, 1), level(64, 0)], 32) == [[1, 63, 1], [64, 64, 0]]


def test_trees_are_tried_under_load_with_their_own_tau():
    """--topks 1,2: every batch size also runs the depth-3 tree of topk 2 (11 nodes) through the
    batch engine; its predicted tau is its run's, its round time the model's at 10 drafts."""
    setup = tiny_setup("llama")
    cfg = TuneConfig(max_new_tokens=12, probe_steps=3, topks=(1, 2), repeats=1)
    bench = modelled_load_bench(
        setup.target, setup.trained, random_prompts(2, 8, seed=2), cfg, **COSTS
    )
    tree = SpecConfig(3, 2, 11)
    report = load_report(bench, (1, 2), 64)
    for lv in report.levels:
        assert list(lv.candidates) == [*(SpecConfig.chain(k) for k in (1, 2, 3)), tree]
        cand = lv.candidates[tree]
        assert cand.predicted_tau == cand.measured_tau > 1.0 and cand.speedup > 0
        # its round predicted as a chain's of 10 verified drafts (the chain-fitted line)
        seconds = report.model.round_s(lv.batch_size, 10)
        assert cand.predicted_tps == pytest.approx(lv.batch_size * cand.predicted_tau / seconds)


def test_a_chosen_tree_is_written_as_its_depth_for_vllm_and_as_the_tree_for_serve(tmp_path):
    tree = SpecConfig(3, 2, 6)
    model = LoadModel((0.0, 0.0), (0.0, 0.0), (0.01, 0.0))
    levels = [level(1, tree), level(2, tree), level(4, 2), level(16, 0)]
    for lv in levels:  # a plain run each, for the report's text
        lv.plain_runs = [BatchRun(lv.batch_size, None, 10, 1.0, {lv.batch_size: 5}, SpecMetrics())]
    report = LoadReport(TuneConfig(), levels, model, 3, 64, "/d", "/t")
    assert report.rows() == [[1, 3, 3], [4, 15, 2], [16, 64, 0]]
    assert report.schedule().to_json()[TREES_KEY] == [[1, 3, 2, 6]]
    written = write_schedule_files(report, tmp_path)
    served = read_schedule(written["serve"], 3)
    assert [served.setting(b) for b in (1, 4, 16)] == [tree, SpecConfig.chain(2), None]
    config = json.loads(report.vllm_flags().split("--speculative-config ")[1].split("' ")[0][1:])
    assert config[VLLM_SCHEDULE_KEY] == report.rows() and config["num_speculative_tokens"] == 3
    assert json.loads(written["sglang"].read_text())["1"] == {"candidate_steps": [3]}
    text = write_and_render(report, tmp_path)
    assert "trees (trees_per_batch_size in the serve file): [[1, 3, 2, 6]]" in text
    assert "tree (steps 3, topk 2, draft tokens 6) chosen" in text
    assert report.to_dict()["levels"][0]["setting"] == {
        "num_steps": 3,
        "topk": 2,
        "num_draft_tokens": 6,
    }


def test_no_speculation_anywhere_gives_no_speculative_flags():
    model = LoadModel((0.0, 0.0), (0.0, 0.0), (0.01, 0.0))
    none = LoadReport(TuneConfig(), [level(1, 0), level(4, 0)], model, 3, 128, "/d", "/t")
    assert none.rows() == [[1, 128, 0]] and none.sglang_adaptive() is None
    assert none.vllm_flags().startswith("launch without --speculative-config")
    assert none.serve_flags() == "specdraft serve --target /t --no-spec"
    assert "SGLang: launch without --speculative-* flags" in launch_lines(none, {})[1]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1, 2, 3], [4, 8, 1]], "a gap before it; start it at batch size 3"),
        ([[1, 4, 3], [3, 8, 1]], "it overlaps the one before"),
        ([[1, 8, 5]], "K 5 exceeds the drafter's depth 3"),
        ([[2, 8, 1]], "a gap before it; start it at batch size 1"),
        ([[1, 8]], "need (min_batch, max_batch, K)"),
    ],
)
def test_a_bad_schedule_file_is_refused_in_one_line(tmp_path, rows, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({VLLM_SCHEDULE_KEY: rows}))
    with pytest.raises(ScheduleError) as caught:
        read_schedule(path, 3)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_schedule_file_without_the_key_or_not_json_is_refused(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"schedule": []}')
    with pytest.raises(ScheduleError, match=VLLM_SCHEDULE_KEY):
        read_schedule(path, 3)
    path.write_text("[[1, 8, 3]")
    with pytest.raises(ScheduleError, match="not JSON"):
        read_schedule(path, 3)


def test_a_schedule_runs_on_the_drafters_engine_even_where_it_says_k_0():
    setup = tiny_setup("llama")
    cfg = TuneConfig(max_new_tokens=12, probe_steps=2, topks=(1,), repeats=1)
    bench = LoadBench(setup.target, setup.trained, random_prompts(2, 8, seed=2), cfg)
    specs, engine = [], bench.engine
    bench.engine = lambda spec: specs.append(spec) or engine(spec)
    schedule = BatchSchedule.of([[1, 1, 2], [2, 2, 0]])
    depth = SpecConfig.chain(2)
    at_1, at_2 = bench.run_batch(1, depth, schedule), bench.run_batch(2, depth, schedule)
    assert [s.num_steps for s in specs] == [2, 2]  # chains of the depth, both times
    assert at_1.metrics.num_drafted_tokens > 0 and at_1.metrics.accept_length > 1.0
    assert at_2.metrics.num_drafted_tokens == 0  # CatchUp rounds
    assert at_2.tokens == 2 * 11 and at_2.rounds_by_batch == {2: 11}
    plain = bench.run_batch(2, None)
    assert specs[-1] is None and plain.tokens == at_2.tokens


def test_line_fit():
    assert line_fit([1, 2, 4], [3, 5, 9]) == pytest.approx((1.0, 2.0))
    assert line_fit([2], [7]) == (7.0, 0.0)


def test_tune_cli_concurrency_writes_the_schedule(tmp_path):
    """Real timings (no assertion on them): the files, a valid schedule, the launch lines."""
    setup = tiny_setup("llama")
    target, draft = saved_pair(setup, tmp_path)
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=31))
    args = cli_args(
        "tune",
        target=target,
        draft=draft,
        prompts=prompts,
        max_tokens=6,
        probe_steps=2,
        repeats=1,
        concurrency="1,2",
        max_num_seqs=64,
        schedule_dir=tmp_path,
        json_out=tmp_path / "load.json",
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "spec_schedule.json").read_text())[VLLM_SCHEDULE_KEY]
    data = json.loads((tmp_path / "load.json").read_text())
    depth = max(c["num_steps"] for lv in data["levels"] for c in lv["candidates"])  # timing picks
    assert (
        rows[0][0] == 1 and rows[-1][1] == 64 and BatchSchedule.of(rows).check_depth(depth) is None
    )
    assert data[VLLM_SCHEDULE_KEY] == rows and [lv["batch_size"] for lv in data["levels"]] == [1, 2]
    assert "B 2: K 2" in result.output and "vLLM: " in result.output
    assert "specdraft: specdraft serve" in result.output


def test_tune_cli_concurrency_refusals(tmp_path):
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    (target / "config.json").write_text("{}")
    draft.mkdir()
    base = ["tune", "--target", str(target), "--draft", str(draft), "--concurrency"]
    bad = CliRunner().invoke(app, [*base, "1,0"])
    assert bad.exit_code == 2 and "integers >= 1" in flat(bad.output)
    suite = CliRunner().invoke(app, [*base, "1,2", "--suite", "mt-bench"])
    assert suite.exit_code == 1 and "--concurrency tunes on --prompts: drop --suite" in suite.output
    where = CliRunner().invoke(app, [*base, "1", "--schedule-dir", str(tmp_path / "nope")])
    assert where.exit_code == 1 and "--schedule-dir" in where.output


def test_tune_cli_concurrency_tunes_a_dflash_drafter(tmp_path):
    """A DFlash drafter's chains (K = 1..block_size - 1, no tree) through the batch engine."""
    setup = tiny_setup("llama")
    copy_with_word_tokenizer(setup, tmp_path / "target")
    sequences = greedy_sequences(setup.target, [[1, 5, 9, 13]], 8)
    draft = engine_dflash_draft(setup.target, sequences, 4, 2)
    draft_dir = save_engine_dflash(draft, setup.target, tmp_path / "draft")
    prompts = write_prompts(tmp_path / "prompts.jsonl", text_prompts(2, 8, seed=31))
    load = {"concurrency": "1,2", "max_num_seqs": 8, "schedule_dir": tmp_path}
    args = cli_args("tune", target=tmp_path / "target", draft=draft_dir, prompts=prompts, **load)
    result = CliRunner().invoke(app, [*args, "--max-tokens", "6", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "spec_schedule.json").read_text())
    assert TREES_KEY not in data and data[VLLM_SCHEDULE_KEY][-1][1] == 8
    assert "B 2: K 3" in result.output and "(no tree: --topks 1)" in result.output
    text = flat(result.output)
    if max(k for *_, k in data[VLLM_SCHEDULE_KEY]):  # speculation won somewhere (real timings)
        assert f"`specdraft export {draft_dir} OUT --engine vllm --num-steps" in text
        assert "EAGLE3" not in text and '"method": "eagle3"' not in text


def test_the_launch_lines_name_the_export_to_run_first(tmp_path):
    _, draft = saved_pair(tiny_setup("llama"), tmp_path / "run")  # specdraft's training layout
    model = LoadModel((0.0, 0.0), (0.0, 0.0), (0.01, 0.0))
    levels = [level(1, 3), level(4, 2), level(16, 0)]
    for lv in levels:
        lv.plain_runs = [BatchRun(lv.batch_size, None, 10, 1.0, {lv.batch_size: 5}, SpecMetrics())]
    report = LoadReport(TuneConfig(), levels, model, 3, 64, str(draft), "/t")
    assert f'"model": "{draft}-vllm"' in report.vllm_flags()  # not on disk: export writes it
    assert report.export_command("vllm") == (
        f"specdraft export {draft} {draft}-vllm --engine vllm --target /t --num-steps 3"
    )
    assert report.export_command("sglang") == (
        f"specdraft export {draft} {draft}-sglang --engine sglang --target /t --num-steps 3 "
        "--topk 1 --num-draft-tokens 4"
    )
    text = flat(write_and_render(report, tmp_path))
    assert f"first run {report.export_command('vllm')}" in text
    assert f"first run {report.export_command('sglang')}" in text
    assert text.index(f"first run {report.export_command('vllm')}") > text.index("vLLM: vllm serve")


def test_a_dflash_drafters_launch_lines_are_its_exports(tmp_path):
    setup = tiny_setup("llama")
    sequences = greedy_sequences(setup.target, [[1, 5, 9, 13]], 8)
    draft = save_engine_dflash(
        engine_dflash_draft(setup.target, sequences, 4, 2), setup.target, tmp_path / "d"
    )
    model = LoadModel((0.0, 0.0), (0.0, 0.0), (0.01, 0.0))
    report = LoadReport(TuneConfig(), [level(1, 2), level(4, 0)], model, 3, 64, str(draft), "/t")
    assert report.vllm_flags() == (
        f"a DFlash drafter, 2 drafts per round: `specdraft export {draft} OUT --engine vllm "
        "--num-steps 2` writes its export and prints the launch line"
    )
    assert "(SGLang serves the trained block only)" in report.sglang_flags()
    assert not any("EAGLE3" in line for line in launch_lines(report, {}))
