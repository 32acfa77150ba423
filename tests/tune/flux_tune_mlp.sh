#!/bin/sh
# flux-tune end to end (tests/tune.cmake): the MLP tuned for two pool sizes, a child process each,
# into a fresh table; both report the table they saved, which starts with the format line.
#   flux_tune_mlp.sh <flux-tune> <table>
set -eu
tune=$1 table=$2
rm -f "$table"
out=$("$tune" mlp --batch 2 --threads 1,2 --train --reps 2 --output "$table")
printf '%s\n' "$out"
test "$(printf '%s\n' "$out" | grep -c "^Saved [0-9]* shape(s) to $table\$")" = 2
printf '%s\n' "$out" | grep -qx '== 2 thread(s)'
test "$(head -1 "$table")" = 'flux-kernel-table 1'
