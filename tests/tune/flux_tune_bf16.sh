#!/bin/sh
# flux-tune --autocast bf16 end to end (tests/tune.cmake): a bf16 training step of the MLP records the
# mixed-precision sites (a training Dense's weights, the weight gradient's transposed cut) and times
# both candidates of each, on a CPU with bf16 units; elsewhere it runs and times nothing of theirs.
#   flux_tune_bf16.sh <flux-tune>
set -eu
tune=$1
out=$(FLUX_NUM_THREADS=2 "$tune" mlp --batch 128 --train --autocast bf16 --reps 2 --dry-run)
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -qx 'Nothing saved.'
if grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo; then
  printf '%s\n' "$out" | grep -E '^  linear_weights .*in_place [0-9.]+, packed [0-9.]+$' >/dev/null
  printf '%s\n' "$out" | grep -E '^  bf16_transposed_a .*copied [0-9.]+, strided [0-9.]+$' >/dev/null
else
  ! printf '%s\n' "$out" | grep -q -e '^  linear_weights' -e '^  bf16_transposed_a'
fi
