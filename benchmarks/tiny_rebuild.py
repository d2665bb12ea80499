"""Rebuild the shipped tiny policy and compare it byte for byte (``make bench``; 7-12 minutes on 2 cores, measured).

``dapo_cli/models/shipped/tiny`` is what ``dapo init-model --force -o dapo_cli/models/shipped/tiny`` wrote
on a 2-core AVX2 EPYC; ``make demo`` installs that copy instead of spending the warm-start. This script
runs the same warm-start (``dapo init-model --force -o DIR`` in a subprocess, the default settings and
thread count) into a temporary folder and prints, per shipped file, whether the rebuild is identical;
for the weights also the largest absolute difference and the base accuracies of both cards. A CPU of
another kind (AVX-512, AMX) may round differently: the line says so rather than failing.

    .venv/bin/python benchmarks/tiny_rebuild.py
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, machine  # noqa: E402

SHIPPED = REPO / "dapo_cli" / "models" / "shipped" / "tiny"
VOLATILE = {"wall_time_s"}
"""Card fields that differ between any two builds (not a property of the model)."""


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main() -> int:
    for line in machine():
        print(line)
    with tempfile.TemporaryDirectory(prefix="tiny-rebuild-") as tmp:
        out = Path(tmp) / "tiny"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dapo_cli", "init-model", "--force", "-o", str(out)], check=True)
        seconds = time.perf_counter() - start
        print(f"rebuild: {seconds:.0f} s")
        same = True
        for shipped in sorted(SHIPPED.iterdir()):
            rebuilt = out / shipped.name
            if shipped.name == "dapo_model.json":
                a, b = (json.loads(p.read_text()) for p in (shipped, rebuilt))
                differ = sorted(k for k in a.keys() | b.keys() if k not in VOLATILE and a.get(k) != b.get(k))
                print(f"{shipped.name}: {'identical' if not differ else 'differs in ' + ', '.join(differ)} "
                      f"(base accuracy T=1 shipped {a['base_accuracy_t1']:.3f}, rebuilt {b['base_accuracy_t1']:.3f})")
                same &= not differ
                continue
            equal = rebuilt.is_file() and rebuilt.read_bytes() == shipped.read_bytes()
            note = ""
            if shipped.suffix == ".safetensors" and rebuilt.is_file() and not equal:
                from safetensors.torch import load_file

                x, y = load_file(shipped), load_file(rebuilt)
                note = f", max |Δw| {max(float((x[k] - y[k]).abs().max()) for k in x):.3g}"
            print(f"{shipped.name}: {'byte-identical' if equal else 'DIFFERENT'} ({digest(shipped)} vs "
                  f"{digest(rebuilt) if rebuilt.is_file() else 'missing'}{note})")
            same &= equal
    print("tiny rebuild: byte-identical to the shipped policy" if same else
          "tiny rebuild: differs from the shipped policy (another CPU kind rounds differently; the shipped copy stays the default)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
