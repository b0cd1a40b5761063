"""Where the tests find the repository and the shared models (../shared beside the checkout,
as CI lays it out; SPECDRAFT_PYCODE_DIR overrides pycode-25m's directory)."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYCODE = Path(
    os.environ.get("SPECDRAFT_PYCODE_DIR", REPO.parent / "shared" / "models" / "pycode-25m")
)
