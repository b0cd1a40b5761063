"""`specdraft doctor`: prove a deployment feeds the drafter what it was trained on.

- `evidence.py`: the files, target, tokenizer and samples, gathered lazily (`samples.py` reads
  capture stores and JSONL); `offline.py`: the drafter alone on samples (the seed's method);
- `checks.py`: one function per verification rule, `CASES` (field case id -> checks);
- `run.py`: `run_doctor` runs every check the inputs allow; `report_table` / `report_json`.
"""

from specdraft.doctor.checks import CASES, CHECKS, EXPORT_CASES
from specdraft.doctor.run import Finding, Report, report_json, report_table, run_doctor

__all__ = ["CASES", "CHECKS", "EXPORT_CASES", "Finding", "Report", "report_json", "report_table",
           "run_doctor"]
