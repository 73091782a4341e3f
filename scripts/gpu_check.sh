#!/bin/sh
# The one prepared run for a lent CUDA GPU machine: no network, at most about 10 minutes by
# construction (each part has its own timeout), everything written under $OUT.
#
#   1. a versions probe: torch, CUDA, the GPUs, flash-attn importable?, the packages ctpore needs
#      (45 s at most; wheels from $CTPORE_WHEELS, if given, 60 s at most)        -> $OUT/probe.json
#   2. the real-kernel tests: the CUDA, flash and GPU tests of tests/ (120 s at most) -> $OUT/tests.log
#   3. ctpore bench gpu with its short defaults (225 s for its steps, each in its own process with
#      its own timeout; the JSON is rewritten after every step)      -> $OUT/gpu.json, $OUT/bench.log
#   4. the split run on the GPU: a scan split across two local Dask workers that share the GPU
#      equals the single run, voxel for voxel (120 s at most; needs dask and zarr) -> $OUT/split.log
#
# Run from a checkout (ctpore need not be installed: the checkout is put first on PYTHONPATH under
# the name ctpore):
#
#   OUT=/some/folder sh scripts/gpu_check.sh
#
# Python: $PYTHON, else the checkout's .venv/bin/python, else python3 (the one with the CUDA build
# of torch). Nothing is downloaded. Packages missing there (e.g. nibabel, which the scan and
# reconstruct steps and tests/test_gpu_path.py need) can be given as wheels in a folder named by
# $CTPORE_WHEELS: they are installed from it alone (pip --no-index) into a temporary folder.
# The device is $CTPORE_DEVICE (default cuda). Exit code: 0 when every part passed, else 1.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/runs/gpu_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DEVICE=${CTPORE_DEVICE:-cuda}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=python3
fi
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/ctpore-gpu-check.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
ln -s "$ROOT" "$SCRATCH/ctpore"
EXTRA=$SCRATCH
if [ -n "${CTPORE_WHEELS:-}" ]; then
    timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SCRATCH/site" "$CTPORE_WHEELS"/*.whl \
        && EXTRA=$SCRATCH:$SCRATCH/site
fi
export PYTHONPATH="$EXTRA${PYTHONPATH:+:$PYTHONPATH}" CTPORE_NO_PROGRESS=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$ROOT" || exit 1
status=0

echo "== 1. versions probe"
timeout 45 "$PY" - "$DEVICE" <<'EOF' > "$OUT/probe.json" || status=1
import importlib.util, json, platform, sys
out = {"python": platform.python_version(), "device": sys.argv[1]}
try:
    import torch
    out.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        out["gpus"] = [f"{torch.cuda.get_device_name(i)} (capability {'.'.join(map(str, torch.cuda.get_device_capability(i)))})"
                       for i in range(torch.cuda.device_count())]
except Exception as exc:
    out["torch_error"] = repr(exc)
try:
    import flash_attn
    out["flash_attn"] = flash_attn.__version__
except Exception as exc:
    out["flash_attn"] = f"not importable: {exc!r}"
try:
    import ctpore
    out["ctpore"] = f"{ctpore.__version__} from {ctpore.__path__[0]}"
except Exception as exc:
    out["ctpore"] = f"not importable: {exc!r}"
names = ("numpy", "scipy", "skimage", "nibabel", "tifffile", "safetensors", "yaml", "click", "tqdm", "pytest", "monai")
out["packages"] = {m: importlib.util.find_spec(m) is not None for m in names}
print(json.dumps(out, indent=1))
EOF
cat "$OUT/probe.json"

echo "== 2. real-kernel tests (CUDA, flash, GPU)"
timeout 120 "$PY" -m pytest tests/test_attention.py tests/test_poreformer.py tests/test_gpu_path.py \
    -k "(cuda or flash or gpu) and not split" -q -p no:cacheprovider -rs > "$OUT/tests.log" 2>&1 || status=1
tail -n 25 "$OUT/tests.log"

echo "== 3. ctpore bench gpu"
timeout 240 "$PY" -m ctpore.app.cli bench gpu --device "$DEVICE" --time-limit 225 --workdir "$SCRATCH/work" \
    -o "$OUT/gpu.json" > "$OUT/bench.log" 2>&1 || status=1
cat "$OUT/bench.log"

echo "== 4. the split run on the GPU"
timeout 120 "$PY" -m pytest tests/test_gpu_path.py -k "cuda and split" -q -p no:cacheprovider -rs \
    > "$OUT/split.log" 2>&1 || status=1
tail -n 25 "$OUT/split.log"
echo "== done (status $status): $OUT"
exit $status
