"""The generation stage: speculative generation on held-out prompts against plain decoding on
the same engine, each setting timed in rounds in turns with plain decoding, and its cache
(out/generation.json, keyed by the drafter's files, the prompts and the timing settings), so a
re-run keeps the recommendation and the exports it measured instead of a new noisy pick."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdraft.bench.speedup import timed_passes, timing_summary
from specdraft.checkpoint import file_sha256
from specdraft.demo.cache import path_label
from specdraft.demo.config import DemoConfig
from specdraft.files import atomic_write_json, atomic_write_text, differing_fields
from specdraft.machine_load import busy_note
from specdraft.train.progress import counted_progress


def heldout_prompts(
    target_dir: Path, heldout_file: Path, prompt_tokens: int, chat_template: Path | None = None
) -> list[list[int]]:
    """Token ids of the first `prompt_tokens` tokens of each held-out document, or with
    `chat_template` (--chat-template), of each held-out chat's prompt as a server renders it with the file (its
    messages before the last assistant turn, generation prompt added: `data.render.prompt_ids`)."""
    from specdraft.data.records import read_records, served_messages
    from specdraft.data.render import prompt_ids
    from specdraft.data.template import use_chat_template
    from specdraft.targets.tokenizer import load_target_tokenizer

    tokenizer = load_target_tokenizer(target_dir)
    if chat_template is not None:
        use_chat_template(tokenizer, chat_template)
        chats = read_records(heldout_file, chat=True, require_assistant=False).records
        return [prompt_ids(tokenizer, served_messages(list(c.messages))) for c in chats]
    docs = [d for d in heldout_file.read_text().split("\n\n") if d.strip()]
    return [tokenizer(d)["input_ids"][:prompt_tokens] for d in docs]


TUNE_PROMPTS_FILE = "heldout-prompts.jsonl"  # under out/data: the timed prompts, for `tune`


def write_tune_prompts(target_dir: Path, prompts: list[list[int]], data_dir: Path) -> Path:
    """data_dir/TUNE_PROMPTS_FILE: the timed prompts as {"prompt": text} rows (the target's
    tokenizer decodes them), so `specdraft tune --prompts` times the demo's own prompt set."""
    from specdraft.targets.tokenizer import load_target_tokenizer

    tokenizer = load_target_tokenizer(target_dir)
    rows = [
        json.dumps({"prompt": tokenizer.decode(ids, skip_special_tokens=True)}) for ids in prompts
    ]
    path = data_dir / TUNE_PROMPTS_FILE
    atomic_write_text(path, "\n".join(rows) + "\n")
    return path


def load_demo_engine(
    target_dir: Path,
    draft_dir: Path | None,
    spec,
    prompts: list[list[int]],
    max_new_tokens: int,
    device: str,
):
    """specdraft's engine for one setting (spec None: plain decoding), warmed up."""
    from specdraft.engine.load import load_engine

    engine = load_engine(
        target_dir,
        draft_dir,
        spec,
        device=device,
        max_seq_len=max(len(p) for p in prompts) + max_new_tokens + 64,
    )
    engine.generate(prompts[0], 8)  # warm-up, not counted
    return engine


def generation_pass(engine, prompts: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
    """Greedy generation over `prompts`: merged metrics, outputs, and output tokens / wall time."""
    import time

    merged, outputs, start = None, [], time.perf_counter()
    for prompt in prompts:
        result = engine.generate(prompt, max_new_tokens)
        outputs.append(result.token_ids)
        merged = result.metrics if merged is None else merged.merge(result.metrics)
    seconds = time.perf_counter() - start
    return {
        "metrics": merged.to_dict(),
        "tokens_per_s": merged.num_output_tokens / seconds,
        "outputs": outputs,
        "accept_length": merged.accept_length,
        "acceptance": merged.acceptance_per_position,
    }


def stage_generate(
    cfg: DemoConfig, target_dir: Path, draft_dir: Path, prompts: list[list[int]]
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Plain decoding, a chain sweep over num_steps and one tree, all greedy on the same engine,
    each timed in cfg.timing_repeats rounds that take turns with plain decoding (timing_summary).

    Every speculative output must equal plain decoding's (lossless at T = 0): ValueError if not.
    """
    from specdraft.engine.spec_config import SpecConfig

    steps, topk, tokens = cfg.tree
    settings = {
        "plain": (None, None),
        **{f"chain-{n}": (draft_dir, SpecConfig.chain(n)) for n in cfg.sweep_steps},
        "tree": (draft_dir, SpecConfig(steps, topk, tokens)),
    }
    runs, plain_tps = timed_settings(cfg, target_dir, settings, prompts)

    def row(name: str, shape: dict[str, int]) -> dict[str, Any]:
        first = runs[name][0]
        return {
            **shape,
            "engine_metrics_first_round": first["metrics"],  # the engine's own counts and times
            **{k: first[k] for k in ("accept_length", "acceptance", "outputs")},
            **timing_summary([run["tokens_per_s"] for run in runs[name]], plain_tps),
        }

    baseline = row("plain", {})
    sweep = [
        row(f"chain-{n}", {"num_steps": n, "topk": 1, "num_draft_tokens": n + 1})
        for n in cfg.sweep_steps
    ]
    tree = row("tree", {"num_steps": steps, "topk": topk, "num_draft_tokens": tokens})
    return baseline, sweep, tree


def timed_settings(
    cfg: DemoConfig, target_dir: Path, settings: dict[str, Any], prompts: list[list[int]]
) -> tuple[dict[str, list[dict[str, Any]]], list[float]]:
    """The `generation_pass` runs of every setting (name -> (drafter dir or None, SpecConfig or
    None), "plain" among them) on its own engine (`load_demo_engine`), timed in rounds
    (`timed_generation`) and checked lossless (`refuse_lossy`); and plain decoding's tokens/s of
    every round."""
    engines = {
        name: load_demo_engine(target_dir, draft, spec, prompts, cfg.max_new_tokens, cfg.device)
        for name, (draft, spec) in settings.items()
    }
    runs = timed_generation(engines, prompts, cfg)
    refuse_lossy(runs, settings)
    return runs, [run["tokens_per_s"] for run in runs["plain"]]


def timed_generation(
    engines: dict[str, Any], prompts: list[list[int]], cfg: DemoConfig
) -> dict[str, list[dict[str, Any]]]:
    """`generation_pass` of every engine in cfg.timing_repeats rounds (`speedup.timed_passes`),
    with a count and the time left of the passes (`train.progress.counted_progress`)."""
    total = len(engines) * cfg.timing_repeats
    with counted_progress("demo timing passes", total) as advance:

        def timed(name: str) -> dict[str, Any]:
            run = generation_pass(engines[name], prompts, cfg.max_new_tokens)
            advance()
            return run

        return timed_passes(engines, cfg.timing_repeats, timed)


def refuse_lossy(runs: dict[str, list[dict[str, Any]]], settings: dict[str, Any]) -> None:
    """ValueError naming the setting whose output differs from plain greedy decoding's."""
    plain_outputs = runs["plain"][0]["outputs"]
    for name, setting_runs in runs.items():
        if any(run["outputs"] != plain_outputs for run in setting_runs):
            raise ValueError(
                f"speculative output differs from plain greedy decoding at {name} "
                f"({settings[name][1]}): the engine is not lossless"
            )


GENERATION_FILE = "generation.json"


def dir_sha256(path: Path) -> str:
    """sha256 over the names and contents of the files in a directory (a drafter's weights and config)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode())
        digest.update(file_sha256(file).encode())
    return digest.hexdigest()


def stage_generation(
    cfg: DemoConfig,
    target_dir: Path,
    draft_dir: Path,
    prompts: list[list[int]],
    say: Callable[[str], None],
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any], str | None]:
    """`stage_generate`, cached in out/generation.json: reused (one line says so) when the drafter's
    files, the prompts and the timing settings are the ones it was measured with, so a re-run
    recommends and exports what the first run measured; otherwise timed and written (a temp
    file, then renamed). A file that does not parse is timed again. Returns baseline, sweep,
    tree and the busy-machine note of the load when the timing ran (`machine_load.busy_note`,
    None on an idle machine or a GPU), kept with the timing it describes."""
    key = generation_key(cfg, target_dir, draft_dir, prompts)
    path = cfg.out / GENERATION_FILE
    saved = saved_generation(path, key)
    if saved is not None:
        say(
            f"generation: reused the timing in {path} (same drafter, prompts and settings; delete it to time "
            "the settings again)"
        )
        return saved["baseline"], saved["sweep"], saved["tree"], saved.get("busy")
    busy = busy_note("the tokens/s and speedups above") if cfg.device == "cpu" else None
    baseline, sweep, tree = stage_generate(cfg, target_dir, draft_dir, prompts)
    atomic_write_json(
        path,
        {"settings": key, "baseline": baseline, "sweep": sweep, "tree": tree, "busy": busy},
        indent=None,
        sort_keys=False,
    )
    return baseline, sweep, tree, busy


def generation_key(
    cfg: DemoConfig, target_dir: Path, draft_dir: Path, prompts: list[list[int]]
) -> dict[str, Any]:
    """What the timing depends on: the drafter's files, the target, the prompts, the timing settings."""
    return {
        "draft_sha256": dir_sha256(draft_dir),
        "target": path_label(target_dir, cfg.out),
        "prompts_sha256": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
        "max_new_tokens": cfg.max_new_tokens,
        "sweep_steps": list(cfg.sweep_steps),
        "tree": list(cfg.tree),
        "timing_repeats": cfg.timing_repeats,
        "device": cfg.device,
        "threads": cfg.threads,
    }


def saved_generation(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The record in generation.json when it was measured with the settings `key`; None when the
    file is missing, does not parse, or differs in any setting."""
    try:
        saved = json.loads(path.read_text()) if path.exists() else None
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        return None
    return None if differing_fields(saved["settings"], key) else saved
