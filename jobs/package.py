"""The project's Python packages as one zip for `spark-submit --py-files` (`make package`).

A zip, not a wheel: spark-submit puts a .zip on the executors' Python path, a .whl it does not. The
archive holds only the packages' .py files, in name order with a fixed timestamp, so the same sources
always give the same bytes.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jobs", "schemas", "transforms", "broker", "dashboard")
DEFAULT = ROOT / "dist" / "txn_recon.zip"


def build(out: Path = DEFAULT) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    sources = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sources:
            info = zipfile.ZipInfo(path.relative_to(ROOT).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    tmp.replace(out)
    return out


if __name__ == "__main__":
    target = build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
    print(target)
