#!/usr/bin/env bash
# The GPU check on a lent machine, without nox, network or a build: install the carried wheels for this machine's
# Python (.whl/gpu/cpXY, made here by scripts/gpu_wheels.py), put rlloom's src folders on PYTHONPATH, and run
# bench/gpu_check.py with a deadline that ends inside the device call's own limit.
#
#   bash bench/gpu_check.sh [--timeout-s S] [gpu_check.py options...]     (docs/gpu_check.md has the device call)
#
# --timeout-s must be the device call's timeout_s (default 540): the check's deadline is that minus the install
# time minus MARGIN_S (a check may overrun its budget, and the last one runs to its end), and the script itself is
# stopped 10 s before the call would be, so the JSON report (rewritten after every check) and the log come back.
# Writes $OUT/gpu_check.json and $OUT/gpu_check.log ($OUT: the device tool's folder; else the current one).
set -uo pipefail

timeout_s=540
if [[ "${1:-}" == "--timeout-s" ]]; then
    timeout_s="$2"
    shift 2
fi
MARGIN_S=${MARGIN_S:-60}
started=$SECONDS
cd "$(dirname "$0")/.." || exit 2
python=${PYTHON:-python3}
tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")') || exit 2
out=${OUT:-.}
mkdir -p "$out"

# the carried wheels are installed whenever there are any for this Python (the retrieval check's
# sentence-transformers stack comes only from them, even where pydantic and rich are already importable)
wheels=${GPU_CHECK_WHEELS:-.whl/gpu/$tag}
if ls "$wheels"/*.whl >/dev/null 2>&1; then
    site=${GPU_CHECK_SITE:-/tmp/rlloom_gpu_site}
    "$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --upgrade --target "$site" "$wheels"/*.whl || exit 3
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check.sh: installed $(ls "$wheels"/*.whl | wc -l) wheels for $tag into $site"
elif "$python" -c 'import pydantic, rich' 2>/dev/null; then
    echo "gpu_check.sh: no carried wheels for $tag; pydantic and rich already importable by $python"
else
    echo "gpu_check.sh: no wheels for $tag in $wheels; run 'python scripts/gpu_wheels.py' before the device" \
        "call and carry .whl (docs/gpu_check.md)"
    exit 2
fi
# rlloom itself: the working tree's sources (`rlloom` is a namespace package; nothing to build)
export PYTHONPATH="$PWD/packages/core-rl/src:$PWD/packages/rollout/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

left=$((timeout_s - (SECONDS - started)))
deadline=$((left - MARGIN_S))
if ((deadline < 30)); then
    echo "gpu_check.sh: only ${left}s left of --timeout-s ${timeout_s}; give the device call more time"
    exit 2
fi
echo "gpu_check.sh: $("$python" --version), deadline ${deadline}s, stopped after $((left - 10))s"
timeout --signal=TERM --kill-after=5 $((left - 10)) \
    "$python" bench/gpu_check.py --deadline-s "$deadline" --out "$out/gpu_check.json" "$@" 2>&1 |
    tee "$out/gpu_check.log"
