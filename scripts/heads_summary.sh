#!/bin/sh
# The README's picture of what the shipped model's attention heads do over a whole scan
# (docs/heads_summary.png, with its figures in docs/heads_summary.json): a simulated 128^3 scan of
# tubular macropores (seed 2), every head's look-back and entropy, pore and solid voxels apart.
# Run from the repository root; the scan goes to runs/heads_sample/.
set -eu
export CTPORE_NO_PROGRESS=1
[ -f runs/heads_sample/scan_0000.nii.gz ] || ctpore simulate -o runs/heads_sample --n 1 --size 128 --seed 2
ctpore attention runs/heads_sample/scan_0000.nii.gz --summary -o docs/heads_summary.png
