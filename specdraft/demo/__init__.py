"""`specdraft demo`: the whole pipeline on one target, each stage cached under --out.

Stages, in the order they run and print: convert target -> split prompts (train / held-out) ->
regenerate continuations with the target -> capture -> train the drafter -> speculative
generation on held-out prompts against plain decoding on the same engine (each setting timed
over a few rounds in turns with plain decoding; a setting is recommended only when it beats
plain decoding beyond the noise) -> export (vLLM, SGLang, speculators layouts, with the setting
generation picked) -> doctor -> report.md and plots.

The default target is the bundled stories260K (5 layers, so aux layers [2, 3, 4]: the standard
[2, L//2, L-3] collapses below 7 layers, DESIGN.md §2). A re-run resumes where the last one
stopped, but only from the stages made with the settings asked for now; export, doctor and the
report are redone every run.

Modules:
  config      DemoConfig, the settings of one run
  inputs      the input checks run before any stage, the data's documents and their split
  cache       demo_settings.json: which cached stages a run may reuse (`reconcile_cache`)
  stages      target, data, regenerate, capture, train, export, doctor
  generation  the timed generation stage and its cache, generation.json
  report      DemoReport, the verdict, report.md / report.json / plots, the printed lines
  run         run_demo, the entry the CLI calls
"""
