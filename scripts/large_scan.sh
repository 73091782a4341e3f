#!/bin/sh
# Time and peak memory of `ctpore reconstruct` with default settings on a generated 1024^3 uint16
# scan (2 GB, uncompressed NIfTI). Run from the repository root; writes into runs/big/ (ignored).
# Needs GNU time (/usr/bin/time).
set -eu
mkdir -p runs/big
cd runs/big
[ -f scan1024.nii ] || python -c "
from pathlib import Path
from ctpore.pipelines.bench.gpu import make_test_scan
make_test_scan(Path('scan1024.nii'), (1024, 1024, 1024))
"
rm -rf out
CTPORE_NO_PROGRESS=1 /usr/bin/time -v ctpore reconstruct scan1024.nii -o out > run.log 2> time.log
grep -E "Elapsed|Maximum resident" time.log
