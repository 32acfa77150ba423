#!/bin/sh
# ctest bench.cpuid_avx2: CHECKER (bench/cpuid_avx2_check.c) without and with LIBRARY preloaded
# (bench/cpuid_avx2.c). Under it, CPUID must report no AVX-512 and the same AVX2 bit as the CPU, and a
# null-pointer dereference must still kill the program with SIGSEGV. Exit 97 (skipped) where the
# kernel or CPU offers no CPUID faulting.
checker=$1 library=$2
real=$("$checker" bits) || exit 1
capped=$(LD_PRELOAD="$library" "$checker" bits)
rc=$?
[ "$rc" -eq 97 ] && { echo "no CPUID faulting here: skipped"; exit 97; }
[ "$rc" -eq 0 ] || { echo "checker failed under the library (exit $rc)"; exit 1; }
echo "CPU:        $real"
echo "preloaded:  $capped"
case "$capped" in
  "${real%% *} avx512f=0 avx512bw=0 avx512vl=0 avx512vnni=0") ;;
  *) echo "expected the CPU's AVX2 bit (${real%% *}) and no AVX-512 under the library"; exit 1 ;;
esac
LD_PRELOAD="$library" "$checker" segv 2>/dev/null
rc=$?
[ "$rc" -eq 139 ] || { echo "a null dereference under the library exited $rc, expected death by SIGSEGV (139)"; exit 1; }
echo "a real fault still kills the program (exit 139)"
