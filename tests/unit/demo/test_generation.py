"""specdraft.demo.generation: the timing stage's passes, rotated in rounds with plain decoding,
show their count and the time left as they run (the stage took 8 minutes with no output)."""

from __future__ import annotations

import specdraft.demo.generation
from specdraft.demo.config import DemoConfig
from specdraft.demo.generation import timed_generation


def test_the_timing_passes_show_their_count_and_time_left(monkeypatch, capsys):
    passes = []

    def fake_pass(engine, prompts, max_new_tokens):
        passes.append(engine)
        return {"engine": engine, "tokens_per_s": 1.0}

    monkeypatch.setattr(specdraft.demo.generation, "generation_pass", fake_pass)
    engines = {"plain": "P", "chain-1": "C1", "tree": "T"}
    runs = timed_generation(engines, [[1, 2]], DemoConfig(timing_repeats=2))
    assert passes == ["P", "C1", "T", "C1", "T", "P"]  # rotated each round
    assert {name: [r["engine"] for r in rs] for name, rs in runs.items()} == {
        "plain": ["P", "P"],
        "chain-1": ["C1", "C1"],
        "tree": ["T", "T"],
    }
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ETA ")[0] for line in lines] == [
        f"demo timing passes {i}/6"
        for i in (2, 4, 6)  # a few lines a stage (`STAGE_LINES`)
    ]


def test_the_tune_prompts_file_holds_the_timed_prompts(tmp_path):
    """demo's check: line runs tune on data/heldout-prompts.jsonl: read as tune reads it, each row
    gives back the token ids the demo timed."""
    from transformers import AutoTokenizer

    from specdraft.bench.prompts import load_prompts
    from specdraft.data.render import prompt_ids
    from specdraft.demo.generation import heldout_prompts, write_tune_prompts
    from specdraft.stories260k import convert_stories260k

    target = tmp_path / "target"
    convert_stories260k(target)
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("Once upon a time, there was a girl.\n\nTom and his dog went to the park.\n")
    prompts = heldout_prompts(target, heldout, 8)
    path = write_tune_prompts(target, prompts, tmp_path)
    assert path == tmp_path / "heldout-prompts.jsonl"
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    assert [prompt_ids(tokenizer, p) for p in load_prompts(str(path))] == prompts
