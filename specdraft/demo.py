"""`specdraft demo`: the whole pipeline on one target, each stage cached under --out.

convert target -> split prompts (train / held-out) -> regenerate continuations with the target
-> capture -> train the drafter -> export (specdraft, vLLM, SGLang layouts) -> doctor ->
speculative generation on held-out prompts against plain decoding on the same engine
-> report.md and plots.

The default target is the bundled stories260K (5 layers, so aux layers [2, 3, 4]: the standard
[2, L//2, L-3] collapses below 7 layers, DESIGN.md §2). A stage whose output exists is not
redone, so a re-run resumes where the last one stopped.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from specdraft.conventions import default_aux_layers


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run.

    target: a transformers model directory, or None for the bundled stories260K.
    data: documents separated by blank lines (default: the bundled TinyStories sample).
    prompt_tokens: prompt length cut from each document; max_new_tokens: continuation length
    (regeneration and the generation benchmark). num_train / num_heldout: documents used.
    train_steps, batch_size, lr: drafter training. sweep_steps: chain depths measured.
    """

    out: Path = Path("specdraft-demo")
    target: Path | None = None
    data: Path | None = None
    device: str = "cpu"
    prompt_tokens: int = 8
    max_new_tokens: int = 96
    num_train: int = 800
    num_heldout: int = 16
    train_steps: int = 1000
    batch_size: int = 8
    lr: float = 3e-3
    ttt_steps: int = 4
    seed: int = 0
    sweep_steps: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    tree: tuple[int, int, int] = (4, 2, 8)  # num_steps, topk, num_draft_tokens
    threads: int | None = 1  # CPU threads; one is fastest for a 260K-parameter model

    def __post_init__(self) -> None:
        if self.num_train < 2 or self.num_heldout < 1:
            raise ValueError("DemoConfig: need at least 2 training and 1 held-out documents")
        if not self.sweep_steps:
            raise ValueError("DemoConfig.sweep_steps is empty")


@dataclass
class DemoReport:
    """What the demo measured; written as report.json and report.md under out."""

    target: str
    aux_layers: list[int]
    training: dict[str, Any] = field(default_factory=dict)
    doctor: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    tree: dict[str, Any] = field(default_factory=dict)
    chosen: dict[str, Any] = field(default_factory=dict)
    launch_commands: dict[str, str] = field(default_factory=dict)
    lint: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)


def split_documents(text: str, num_train: int, num_heldout: int, seed: int) -> tuple[list[str], list[str]]:
    """Documents (blank-line separated), shuffled with `seed`, as (train, held-out) lists.

    Raises ValueError when the text holds fewer than num_train + num_heldout documents.
    """
    docs = [d.strip() for d in text.split("\n\n") if d.strip()]
    if len(docs) < num_train + num_heldout:
        raise ValueError(f"the data holds {len(docs)} documents; the demo needs "
                         f"{num_train + num_heldout} (lower --num-train)")
    random.Random(seed).shuffle(docs)
    return docs[num_heldout:num_heldout + num_train], docs[:num_heldout]


def stage_target(cfg: DemoConfig) -> Path:
    """The target directory: the given one, or stories260K converted under out/target."""
    if cfg.target is not None:
        return Path(cfg.target)
    from specdraft.stories260k import convert_stories260k

    return convert_stories260k(cfg.out / "target")


def stage_data(cfg: DemoConfig) -> tuple[Path, Path]:
    """Write train.txt and heldout.txt (blank-line separated documents) under out/data."""
    from specdraft.stories260k import bundled_dir

    data_dir = cfg.out / "data"
    train_file, heldout_file = data_dir / "train.txt", data_dir / "heldout.txt"
    if train_file.exists() and heldout_file.exists():
        return train_file, heldout_file
    source = Path(cfg.data) if cfg.data else bundled_dir() / "tinystories_sample.txt"
    train, heldout = split_documents(source.read_text(), cfg.num_train, cfg.num_heldout, cfg.seed)
    data_dir.mkdir(parents=True, exist_ok=True)
    for path, docs in ((heldout_file, heldout), (train_file, train)):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n\n".join(docs) + "\n")
        tmp.replace(path)
    return train_file, heldout_file


def stage_regenerate(cfg: DemoConfig, target_dir: Path, data_file: Path) -> Path:
    """Replace each document's continuation with the target's greedy output (resumable)."""
    from specdraft.regenerate import RegenConfig, Sampling, regenerate_file

    out = data_file.with_name(data_file.stem + ".regen.jsonl")
    regenerate_file(RegenConfig(data=str(data_file), out=str(out), target=str(target_dir), chat=False,
                                prompt_tokens=cfg.prompt_tokens, batch_size=32, device=cfg.device,
                                sampling=Sampling(temperature=0.0, max_new_tokens=cfg.max_new_tokens)),
                    console=Console(stderr=True))
    return out


def stage_capture(cfg: DemoConfig, target_dir: Path, regen_file: Path, name: str,
                  aux_layers: list[int]) -> Path:
    """Capture the target's aux states over the regenerated data into out/<name> (resumable)."""
    from specdraft.capture import CaptureConfig, capture_dataset

    store = cfg.out / name
    capture_dataset(CaptureConfig(target=str(target_dir), data=str(regen_file), out_dir=str(store),
                                  aux_layers=tuple(aux_layers), dtype="float32", chat=False,
                                  max_length=cfg.prompt_tokens + cfg.max_new_tokens + 16,
                                  device=cfg.device),
                    console=Console(stderr=True))
    return store


def stage_train(cfg: DemoConfig, store: Path) -> tuple[Path, dict[str, Any]]:
    """Train the drafter on the store (resumes from out/train's last checkpoint)."""
    from specdraft.train.loop import TrainConfig, train

    out = cfg.out / "train"
    draft_dir = out / "draft"
    if (draft_dir / "specdraft_manifest.json").exists():
        manifest = json.loads((draft_dir / "specdraft_manifest.json").read_text())
        return draft_dir, manifest["training"]
    config = TrainConfig(lr=cfg.lr, warmup_steps=50, total_steps=cfg.train_steps, batch_size=cfg.batch_size,
                         max_length=cfg.prompt_tokens + cfg.max_new_tokens + 16, ttt_steps=cfg.ttt_steps,
                         val_fraction=0.05, seed=cfg.seed, eval_every=cfg.train_steps // 4,
                         save_every=max(cfg.train_steps // 4, 1), device=cfg.device)
    result = train(config, store, out, resume=True, command="specdraft demo")
    manifest = json.loads((result.draft_dir / "specdraft_manifest.json").read_text())
    return result.draft_dir, manifest["training"]


def heldout_prompts(target_dir: Path, heldout_file: Path, prompt_tokens: int) -> list[list[int]]:
    """Token ids of the first `prompt_tokens` tokens of each held-out document."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    docs = [d for d in heldout_file.read_text().split("\n\n") if d.strip()]
    return [tokenizer(d)["input_ids"][:prompt_tokens] for d in docs]


def measure(target_dir: Path, draft_dir: Path | None, spec, prompts: list[list[int]],
            max_new_tokens: int, device: str) -> dict[str, Any]:
    """Greedy generation over `prompts` on specdraft's engine; merged metrics and outputs."""
    from specdraft.engine.speculate import load_engine

    engine = load_engine(target_dir, draft_dir, spec, device=device,
                         max_seq_len=max(len(p) for p in prompts) + max_new_tokens + 64)
    engine.generate(prompts[0], 8)  # warm-up, not counted
    merged, outputs = None, []
    for prompt in prompts:
        result = engine.generate(prompt, max_new_tokens)
        outputs.append(result.token_ids)
        merged = result.metrics if merged is None else merged.merge(result.metrics)
    return {"metrics": merged.to_dict(), "tokens_per_s": merged.tokens_per_s, "outputs": outputs,
            "accept_length": merged.accept_length, "acceptance": merged.acceptance_per_position}


def stage_export(cfg: DemoConfig, draft_dir: Path, target_dir: Path, chosen: dict[str, Any],
                 chain_steps: int) -> dict[str, Any]:
    """Export for vLLM, SGLang and speculators; returns engine -> ExportResult.

    SGLang gets the chosen setting; vLLM and speculators (chains only) the fastest chain.
    """
    from specdraft.export import export_draft

    results = {}
    for engine in ("vllm", "sglang", "speculators"):
        steps, topk, tokens = ((chosen["num_steps"], chosen["topk"], chosen["num_draft_tokens"])
                               if engine == "sglang" else (chain_steps, 1, chain_steps + 1))
        results[engine] = export_draft(draft_dir, cfg.out / "export" / engine, engine=engine,
                                       target=target_dir, num_steps=steps, topk=topk, num_draft_tokens=tokens)
    return results


def stage_doctor(draft_dir: Path, target_dir: Path, stores: dict[str, Path],
                 exports: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Doctor on the trained drafter (offline acceptance on each store) and lint per export."""
    from dataclasses import asdict as as_dict

    from specdraft.doctor.run import run_doctor

    findings = []
    for name, store in stores.items():
        report = run_doctor(draft_dir, target=target_dir, samples=store)
        findings += [{"samples": name, **as_dict(f)} for f in report.findings]
    lint = {}
    for engine in ("sglang", "vllm"):
        args = exports[engine].launch_command
        report = run_doctor(exports[engine].out_dir, target=target_dir, engine=engine, engine_args=args)
        lint[engine] = [as_dict(f) for f in report.findings]
    return findings, lint


def stage_generate(cfg: DemoConfig, target_dir: Path, draft_dir: Path,
                   prompts: list[list[int]]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Plain decoding, a chain sweep over num_steps and one tree, all greedy on the same engine.

    Every speculative output must equal plain decoding's (lossless at T = 0): ValueError if not.
    """
    from specdraft.engine.spec_config import SpecConfig

    baseline = measure(target_dir, None, None, prompts, cfg.max_new_tokens, cfg.device)
    sweep = []
    for steps in cfg.sweep_steps:
        run = measure(target_dir, draft_dir, SpecConfig.chain(steps), prompts, cfg.max_new_tokens, cfg.device)
        sweep.append({"num_steps": steps, "topk": 1, "num_draft_tokens": steps + 1, **run})
    steps, topk, tokens = cfg.tree
    tree = {"num_steps": steps, "topk": topk, "num_draft_tokens": tokens,
            **measure(target_dir, draft_dir, SpecConfig(steps, topk, tokens), prompts,
                      cfg.max_new_tokens, cfg.device)}
    for run in [*sweep, tree]:
        if run["outputs"] != baseline["outputs"]:
            raise ValueError(f"speculative output differs from plain greedy decoding at "
                             f"num_steps={run['num_steps']} topk={run['topk']}: the engine is not lossless")
    return baseline, sweep, tree


def write_plots(report: DemoReport, out: Path) -> list[str]:
    """Per-position acceptance, and tau and tokens/s against num_steps, as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["num_steps"] for r in report.sweep]
    deepest = max(report.sweep, key=lambda r: r["num_steps"])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    positions = range(1, len(deepest["acceptance"]) + 1)
    ax.bar(positions, deepest["acceptance"], color="tab:blue")
    ax.set(xlabel="draft position k", ylabel="acceptance p_k", ylim=(0, 1),
           title=f"per-position acceptance (chain, num_steps={deepest['num_steps']})")
    fig.tight_layout()
    fig.savefig(out / "acceptance.png", dpi=120)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(steps, [r["accept_length"] for r in report.sweep], "o-")
    left.set(xlabel="num_steps (chain)", ylabel="accept length tau", title="tau vs num_steps")
    right.plot(steps, [r["tokens_per_s"] for r in report.sweep], "o-", label="speculative")
    right.axhline(report.baseline["tokens_per_s"], color="gray", ls="--", label="no speculation")
    right.set(xlabel="num_steps (chain)", ylabel="tokens/s", title="throughput vs num_steps")
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)
    return ["acceptance.png", "throughput.png"]


def report_markdown(report: DemoReport, cfg: DemoConfig) -> str:
    """report.md: what ran, tau, per-position acceptance, tokens/s, doctor verdicts, commands."""
    chosen = report.chosen
    base = report.baseline["tokens_per_s"]
    lines = [
        "# specdraft demo", "",
        f"Target: `{report.target}`; aux layers (specdraft indices) {report.aux_layers}.", "",
        "## Training", "",
        f"Validation (simulated tau {report.training.get('tau', float('nan')):.2f}; a "
        f"{len(report.training.get('accuracy', []))}-step chain replayed over the validation text: tau "
        f"{report.training.get('replayed_tau') or float('nan'):.2f}): per-step accuracy "
        + ", ".join(f"{a:.2f}" for a in report.training.get("accuracy", [])), "",
        "## Speculative decoding on held-out prompts (greedy, batch 1)", "",
        f"No speculation: {base:.0f} tokens/s.", "",
        "| num_steps | topk | num_draft_tokens | tau | tokens/s | speedup | acceptance p_k |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in [*report.sweep, report.tree]:
        lines.append(f"| {r['num_steps']} | {r['topk']} | {r['num_draft_tokens']} | {r['accept_length']:.2f} "
                     f"| {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base:.2f}x | "
                     + ", ".join(f"{p:.2f}" for p in r["acceptance"]) + " |")
    lines += ["", f"Fastest setting: num_steps {chosen['num_steps']}, topk {chosen['topk']}, num_draft_tokens "
              f"{chosen['num_draft_tokens']}: tau {chosen['accept_length']:.2f}, "
              f"{chosen['tokens_per_s']:.0f} tokens/s ({chosen['tokens_per_s'] / base:.2f}x the same engine "
              "without speculation).", "",
              "Every speculative run produced exactly the plain greedy output (lossless at T = 0).", "",
              "## Doctor", "", "| samples | check | verdict | evidence |", "|---|---|---|---|"]
    for f in report.doctor:
        lines.append(f"| {f['samples']} | {f['check']} | {f['verdict']} | {f['evidence']} |")
    for engine, findings in report.lint.items():
        failed = [f["check"] for f in findings if f["verdict"] == "fail"]
        lines.append("")
        lines.append(f"Lint for {engine}: {'FAIL ' + ', '.join(failed) if failed else 'no failures'}.")
    lines += ["", "## Launch on a GPU machine", ""]
    lines += [f"- {engine}: `{command}`" for engine, command in report.launch_commands.items()]
    lines += ["", *[f"![{p}]({p})" for p in report.plots], ""]
    return "\n".join(lines)


def run_demo(cfg: DemoConfig, console: Console | None = None) -> DemoReport:
    """Run every stage (cached under cfg.out) and write report.json, report.md and the plots."""
    import torch

    console = console or Console()
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.device == "cpu" and cfg.threads:
        torch.set_num_threads(cfg.threads)
    say = lambda text: console.print(f"[bold]demo[/bold] {text}")  # noqa: E731
    target_dir = stage_target(cfg)
    from transformers import AutoConfig

    num_layers = AutoConfig.from_pretrained(str(target_dir)).get_text_config().num_hidden_layers
    aux_layers = list(default_aux_layers(num_layers))
    say(f"target {target_dir} ({num_layers} layers): aux layers {aux_layers} "
        + ("(the standard [2, L//2, L-3] collapses below 7 layers)" if num_layers < 7 else ""))
    train_file, heldout_file = stage_data(cfg)
    say("regenerating continuations with the target (greedy)")
    train_store = stage_capture(cfg, target_dir, stage_regenerate(cfg, target_dir, train_file), "store", aux_layers)
    heldout_store = stage_capture(cfg, target_dir, stage_regenerate(cfg, target_dir, heldout_file),
                                  "store-heldout", aux_layers)
    say("training the drafter")
    draft_dir, training = stage_train(cfg, train_store)
    report = DemoReport(target=str(target_dir), aux_layers=aux_layers, training=training.get("validation") or {})
    say("speculative generation vs plain decoding on held-out prompts")
    prompts = heldout_prompts(target_dir, heldout_file, cfg.prompt_tokens)
    report.baseline, report.sweep, report.tree = stage_generate(cfg, target_dir, draft_dir, prompts)
    fastest = lambda runs: max(runs, key=lambda r: r["tokens_per_s"])  # noqa: E731
    report.chosen = {k: v for k, v in fastest([*report.sweep, report.tree]).items() if k != "outputs"}
    exports = stage_export(cfg, draft_dir, target_dir, report.chosen, fastest(report.sweep)["num_steps"])
    report.launch_commands = {e: r.launch_command for e, r in exports.items()}
    say("doctor")
    report.doctor, report.lint = stage_doctor(draft_dir, target_dir,
                                              {"train": train_store, "held-out": heldout_store}, exports)
    report.plots = write_plots(report, cfg.out)
    (cfg.out / "report.json").write_text(json.dumps(asdict(report), indent=2, default=str))
    (cfg.out / "report.md").write_text(report_markdown(report, cfg))
    return report
