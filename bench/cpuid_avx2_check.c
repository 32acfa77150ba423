// Checks bench/cpuid_avx2.c (ctest bench.cpuid_avx2): `bits` prints what CPUID leaf 7 reports for
// AVX2 and AVX-512 (run with and without the preloaded library and compared); `segv` dereferences a
// null pointer, which must still kill the program under the library (a real fault is not a CPUID).
#include <cpuid.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "segv") == 0) {
    volatile int* p = NULL;
    return *p;
  }
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  (void)a, (void)d;
  printf("avx2=%u avx512f=%u avx512bw=%u avx512vl=%u avx512vnni=%u\n", (b >> 5) & 1u, (b >> 16) & 1u, (b >> 30) & 1u,
         (b >> 31) & 1u, (c >> 11) & 1u);
  return 0;
}
