"""`specdraft doctor`: prove a deployment feeds the drafter what it was trained on.

- `inputs.py`: what the user gave (`DoctorInputs`), refused up front when doctor cannot judge it;
- `file_evidence.py`: the files, target and tokenizer, gathered lazily; `evidence.py`: on top of
  them the engines' reading and the samples (`samples.py` reads capture stores and JSONL;
  `keys.py`: how each engine reads the weight names); `offline.py`: the drafter alone on samples
  (the seed's method); `online.py`: a live server;
- `verdict.py`: a check's `Result`; `audit.py`, `lint.py`, `launch.py`, `rope.py`, `parity.py`,
  `acceptance.py`: one function per verification rule; `checks.py`: `CHECKS` in run order,
  `CASES` (field case id -> checks);
- `run.py`: `run_doctor` runs every check the inputs allow; `report_table` / `report_json`.
"""

from specdraft.doctor.checks import CASES, CHECKS, EXPORT_CASES
from specdraft.doctor.run import Finding, Report, report_json, report_table, run_doctor

__all__ = [
    "CASES",
    "CHECKS",
    "EXPORT_CASES",
    "Finding",
    "Report",
    "report_json",
    "report_table",
    "run_doctor",
]
