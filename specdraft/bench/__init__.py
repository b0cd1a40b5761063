"""Measuring speculative decoding: a served engine against its baseline, and specdraft's own
engine over candidate settings. Import the modules themselves:

- `sweep`: `run_bench`, a concurrency sweep against an OpenAI-compatible server (and its
  baseline), interrupted sweeps (`Sweep`, `partial_report`); `config`: `BenchConfig` and the
  errors; `prompts`: the prompts sent; `levels`: one server's levels; `comparison`: `BenchReport`,
  speedups and the warnings.
- `stats`: summaries, run-to-run noise, speedup points, verdicts and the crossover.
- `report`: bench.md (`markdown`), the plots, `write_report`.
- `tune`: the cost model that predicts and measures settings on specdraft's engine, and the
  recommendation (`tune`, `tune_paths`, `render`).
- `speedup`: the rule `tune` and `specdraft demo` recommend by (timed passes in turns with
  plain decoding, median and quartile speedups, ties).
The server client (URLs, detection, requests, /metrics) is `specdraft.client`.
"""
