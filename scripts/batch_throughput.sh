#!/bin/sh
# ctpore batch throughput: 8 simulated 96^3 scans with 1 and 2 local workers, beside one plain
# `ctpore reconstruct` of the same scans. Run from the repository root; writes into runs/batchtp/.
set -eu
mkdir -p runs/batchtp
cd runs/batchtp
export CTPORE_NO_PROGRESS=1
[ -d scans ] || ctpore simulate -o scans --n 8 --size 96 --seed 7 > /dev/null
ls scans/scan_*.nii.gz > manifest.txt
for w in ${WORKERS:-1 2}; do
  rm -rf "out$w"
  s=$(date +%s.%N)
  ctpore batch manifest.txt -o "out$w" --workers "$w" > "batch$w.log" 2>&1 || true
  e=$(date +%s.%N)
  python -c "t=$e-$s; print(f'batch --workers $w: {t:.1f} s, {8*60/t:.2f} scans/min')"
done
rm -rf seq
s=$(date +%s.%N)
ctpore reconstruct scans/scan_*.nii.gz -o seq > seq.log 2>&1
e=$(date +%s.%N)
python -c "t=$e-$s; print(f'one ctpore reconstruct of the 8 scans: {t:.1f} s, {8*60/t:.2f} scans/min')"
