"""vLLM 0.32 accepts the K-by-batch-size schedule `specdraft tune --concurrency` writes
(`bench.load_schedule`; how vLLM reads it: `conventions.spec_schedule`):
- its validation (v1/spec_decode/dynamic/utils.py) passes the rows unchanged, and the dense
  lookup its scheduler runs on (`build_dynamic_sd_schedule_lookup` with max_num_seqs and
  num_speculative_tokens) gives at every batch size 1..max_num_seqs the K specdraft's
  `BatchSchedule` gives;
- a row whose setting is a tree is written as its depth K, which vLLM reads as any row;
- vLLM refuses the overlapping, not-from-1 and negative schedules `BatchSchedule` refuses;
- the --speculative-config of the vLLM launch line, given to `EngineArgs` as `vllm serve` gives
  it, builds a `SpeculativeConfig` holding the schedule (dynamic speculative decoding on) with
  num_speculative_tokens = the deepest K.
Skipped where vllm does not import (conftest.py).
"""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from specdraft.bench.load_schedule import LoadReport
from specdraft.bench.tune_load import Level, LoadModel
from specdraft.bench.tune_model import TuneConfig
from specdraft.checkpoint import save_draft
from specdraft.conventions.spec_schedule import VLLM_SCHEDULE_KEY
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig
from specdraft.engine.schedule import BatchSchedule, ScheduleError
from specdraft.engine.spec_config import SpecConfig
from specdraft.targets import load_target
from tests.vllm_tier.harness import AUX_LAYERS, build_target

MAX_NUM_SEQS = 64
TREE = SpecConfig(3, 2, 6)  # written for vLLM as its depth K = 3
# (batch size, setting chosen) as tune_load leaves them
CHOSEN = ((1, TREE), (2, TREE), (4, SpecConfig.chain(2)), (16, None))


def tuned_report(max_num_seqs: int, draft: str = "DRAFT", target: str = "TARGET") -> LoadReport:
    levels = [Level(size, [], {}, chosen=spec) for size, spec in CHOSEN]
    model = LoadModel((0.0, 0.0), (0.0, 0.0), (0.0, 0.0))
    return LoadReport(TuneConfig(), levels, model, 3, max_num_seqs, draft, target)


def test_vllm_reads_the_schedule_as_specdraft_does():
    from vllm.v1.spec_decode.dynamic.utils import (
        build_dynamic_sd_schedule_lookup,
        validate_and_normalize_dynamic_sd_schedule,
    )

    rows = tuned_report(MAX_NUM_SEQS).rows()
    assert rows == [[1, 3, 3], [4, 15, 2], [16, MAX_NUM_SEQS, 0]]
    assert validate_and_normalize_dynamic_sd_schedule(rows) == [tuple(r) for r in rows]
    dense = build_dynamic_sd_schedule_lookup(rows, MAX_NUM_SEQS, max(k for *_, k in rows))
    schedule = BatchSchedule.of(rows)
    assert dense[1:] == [schedule.num_steps(b) for b in range(1, MAX_NUM_SEQS + 1)]


@pytest.mark.parametrize("rows", [[[1, 4, 3], [3, 8, 1]], [[2, 8, 1]], [[1, 8, -1]]])
def test_vllm_refuses_what_specdraft_refuses(rows):
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    with pytest.raises(ValueError):
        validate_and_normalize_dynamic_sd_schedule(rows)
    with pytest.raises(ScheduleError):
        BatchSchedule.of(rows)


def test_engine_args_build_the_speculative_config_of_the_launch_line(tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    target_dir = build_target(tmp_path / "target")
    cfg = DraftConfig.from_target(load_target(target_dir).config, AUX_LAYERS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        draft_dir = save_draft(Eagle3Draft(cfg), tmp_path / "draft", layout="sglang")
    report = tuned_report(32, str(draft_dir), str(target_dir))
    words = shlex.split(report.vllm_flags())
    config = json.loads(words[words.index("--speculative-config") + 1])
    max_num_seqs = int(words[words.index("--max-num-seqs") + 1])
    args = EngineArgs(
        model=str(target_dir),
        speculative_config=config,
        max_num_seqs=max_num_seqs,
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
    )
    vllm_config = args.create_engine_config()
    spec = vllm_config.speculative_config
    assert spec.uses_dynamic_speculative_decoding()
    assert [list(e) for e in spec.num_speculative_tokens_per_batch_size] == report.rows()
    assert config[VLLM_SCHEDULE_KEY] == report.rows() == [[1, 3, 3], [4, 15, 2], [16, 32, 0]]
    assert spec.num_speculative_tokens == report.max_k == 3
    assert vllm_config.scheduler_config.max_num_seqs == 32
