#!/usr/bin/env bash
# benchmarks/side_by_side.py --device cuda on the H200 (issue #38 item 3), run from the repository
# root by the device tool with carry [".carry/pycode-25m", ".whl"] (.whl: the wheels of
# benchmarks/speculators_wheels.txt). Run this same command again until it prints DONE: the first
# call installs the wheels into /tmp/site and starts the whole run (data, specdraft's 2000 steps,
# speculators' 2000 steps, scores) in a process session of its own, which outlives the call while
# the machine stays held; each call waits for it up to 560 s and prints its last lines.
# What comes back: $OUT/sbs.log, and $OUT/results.json once done; each call prints the end of each
# trainer's stderr (<work>/NAME.log: progress as it trains).
[ -d /tmp/site/speculators ] || { python3 -m pip list 2>/dev/null | grep -iE '^(pyarrow|fsspec|numpy|typer|huggingface.hub|transformers|triton) '; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit; }; export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1; W=/root/sbs; L=$W.log; T0=$(date +%s)
if [ ! -f $W.started ]; then python3 benchmarks/side_by_side.py --speculators-probe && echo speculators imports || echo SPECULATORS DOES NOT IMPORT; touch $W.started; setsid nohup bash -c "python3 benchmarks/side_by_side.py --device cuda --target .carry/pycode-25m --work $W > $L 2>&1; echo \$? > $W.done" < /dev/null > /dev/null 2>&1 & echo "started $(date)"; fi
while [ ! -f $W.done ] && [ $(( $(date +%s) - T0 )) -lt 560 ]; do sleep 10; done
grep -v -e '^\$ ' -e 'it/s' $L | tail -8 | cut -c1-1500; for n in specdraft speculators; do [ -f $W/$n.log ] && echo "$n.log: $(tail -c 300 $W/$n.log | tr '\r' '\n' | tail -2)"; done; cp $L $OUT/sbs.log; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
if [ -f $W.done ]; then echo "DONE rc $(cat $W.done)"; cp $W/results.json $OUT/ 2>/dev/null; else echo "RUNNING after $(( $(date +%s) - T0 )) s of this call: run the same command again"; fi
