#!/usr/bin/env bash
# Run the GPU parts of every technique benchmark (benchmarks/gpu.py) and write OUT_DIR/gpu.json.
#
#   bash benchmarks/gpu.sh [OUT_DIR] [extra gpu.py flags, e.g. --quick or --parts data,pruning]
#
# OUT_DIR defaults to benchmarks/results/<hardware-id>/ (the GPU's id when one is present). Without CUDA it
# finishes in seconds and writes a gpu.json whose figures all say "skipped: no CUDA device ..." (exit 0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PY="$ROOT/.venv/bin/python"
else
    PY="python3"
fi
export PYTHONUNBUFFERED=1

if [[ $# -ge 1 && "$1" != -* ]]; then
    OUT_DIR="$1"
    shift
else
    OUT_DIR="$(cd "$ROOT" && "$PY" -c 'from lab.measure import environment_stamp as e; print(e("auto")["hardware_id"])')"
    OUT_DIR="$ROOT/benchmarks/results/$OUT_DIR"
fi
mkdir -p "$OUT_DIR"
JSON="$(cd "$OUT_DIR" && pwd)/gpu.json"

echo "gpu.sh: $PY benchmarks/gpu.py --json $JSON $*"
"$PY" "$ROOT/benchmarks/gpu.py" --json "$JSON" "$@"
echo "gpu.sh: results in $JSON"
