#!/bin/bash
# Whether the CPU kernels' AVX2 variants (src/backends/cpu/isa.hpp) are vector code: each listed float
# kernel's *_avx2 function in libflux must hold at least MIN ymm instructions. An AVX2-only CPU runs
# exactly these; with GCC's default -ftrapping-math the loops with selects (exp, sigmoid, GELU, the
# LSTM gates) compiled to scalar code for AVX2 while their AVX-512 copies vectorised, which no value
# test sees (CMakeLists.txt, -fno-trapping-math). Usage: check.sh LIBFLUX
set -u
lib="$1"
MIN=8
command -v objdump > /dev/null || { echo "objdump not found (binutils)"; exit 1; }
# demangled-name patterns (grep -E) of the kernels that must vectorise
patterns=(
  'unary_range_avx2<float const\*, float\*, long, long, double, std::integral_constant<flux::backend::UnaryOp, \(flux::backend::UnaryOp\)(1|5|6|10|12)>'
  'unary_backward_range_avx2<float const\*, float const\*, float\*, long, long, std::integral_constant<flux::backend::UnaryOp, \(flux::backend::UnaryOp\)(10|12)>'
  'lstm_forward_rows_avx2<float const\*'
  'lstm_backward_rows_avx2<float const\*'
  'gru_forward_rows_avx2<float const\*'
  'softmax_rows_avx2<float const\*'
  'adam_range_avx2<float\*'
  'few_pixel_avx2<'
  'online_softmax_avx2<'
  'probabilities_avx2<'
  'arith_range_avx2<float const\*, float const\*, float\*, long, long, int, std::integral_constant<flux::backend::BinaryOp, \(flux::backend::BinaryOp\)[0-3]>'
)
syms=$(nm "$lib" | awk '$2 ~ /^[tTwW]$/ && $3 ~ /_avx2/ {print $3}')
[ -n "$syms" ] || { echo "no *_avx2 symbols in $lib (built without FLUX_CPU_VARIANTS?)"; exit 1; }
fail=0
for p in "${patterns[@]}"; do
  found=0
  while read -r sym; do
    name=$(echo "$sym" | c++filt)
    echo "$name" | grep -qE "$p" || continue
    found=1
    n=$(objdump -d --no-show-raw-insn "$lib" --disassemble="$sym" | grep -c ymm)
    if [ "$n" -lt "$MIN" ]; then
      echo "SCALAR ($n ymm instructions): $name"
      fail=1
    fi
  done <<< "$syms"
  if [ "$found" = 0 ]; then
    echo "no function matches: $p"
    fail=1
  fi
done
[ "$fail" = 0 ] && echo "every listed AVX2 kernel is vector code"
exit $fail
