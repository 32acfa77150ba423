// An AVX2 machine for programs that offer no way to cap their ISA (ONNX Runtime): preloaded
// (LD_PRELOAD=libflux_cpuid_avx2.so), it makes the CPUID instruction fault (Linux's CPUID faulting,
// arch_prctl(ARCH_SET_CPUID, 0); /proc/cpuinfo flag cpuid_fault) and answers each CPUID from a SIGSEGV
// handler with the CPU's own answer less every AVX-512 and AMX feature bit, so code that dispatches on
// CPUID (ONNX Runtime's MLAS, cpuinfo, numpy, oneDNN, OpenBLAS's DYNAMIC_ARCH) takes its AVX2 paths.
// bench/run_bench.py --max-isa avx2 runs ONNX Runtime under it; the other programs are capped by their
// own settings (run_bench.py's MAX_ISA_ENV).
//
// What it cannot hide: features read before its constructor runs (glibc's string functions, chosen by
// the dynamic linker at start-up; libraries that a program links, rather than opens, may run their
// constructors first), and XGETBV (the OS still enables the AVX-512 register state; every library we
// know of checks the CPUID bit as well). bench/cpuid_avx2_check.c shows what a program sees under it.
// Benchmark tool only: not part of the library.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef ARCH_SET_CPUID
#define ARCH_SET_CPUID 0x1012
#endif

static struct sigaction previous;

static long set_cpuid(int enabled) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, (unsigned long)enabled); }

// The CPU's answer for (leaf, subleaf) with the AVX-512 and AMX bits cleared.
static void masked_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
  if (leaf == 7 && sub == 0) {
    // EBX: AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31.
    r[1] &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
    // ECX: VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14.
    r[2] &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
    // EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, AMX-BF16 22, AVX512-FP16 23, AMX-TILE 24, AMX-INT8 25.
    r[3] &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
  } else if (leaf == 7 && sub == 1) {
    r[0] &= ~((1u << 5) | (1u << 21));  // AVX512-BF16, AMX-FP16
  } else if (leaf == 0xd && sub == 0) {
    r[0] &= ~((1u << 5) | (1u << 6) | (1u << 7) | (1u << 17) | (1u << 18));  // opmask, ZMM state, AMX tiles
  }
}

static void on_segv(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = (ucontext_t*)context;
  greg_t* g = uc->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)g[REG_RIP];
  if (ip && ip[0] == 0x0f && ip[1] == 0xa2 && set_cpuid(1) == 0) {
    uint32_t r[4];
    masked_cpuid((uint32_t)g[REG_RAX], (uint32_t)g[REG_RCX], r);
    set_cpuid(0);
    g[REG_RAX] = r[0];
    g[REG_RBX] = r[1];
    g[REG_RCX] = r[2];
    g[REG_RDX] = r[3];
    g[REG_RIP] += 2;
    return;
  }
  // A real fault: hand it to whoever had SIGSEGV before, or die of it as the program would have.
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction) {
      previous.sa_sigaction(sig, info, context);
      return;
    }
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
    return;
  }
  signal(SIGSEGV, SIG_DFL);  // returning re-runs the faulting instruction, now fatal
}

__attribute__((constructor)) static void cap_cpuid_to_avx2(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, &previous) != 0 || set_cpuid(0) != 0) {
    // No CPUID faulting (an old kernel, a CPU or hypervisor without it): nothing is capped, and the
    // caller must know, so say it and stop rather than let a run pass for an AVX2 one.
    fprintf(stderr, "libflux_cpuid_avx2: CPUID faulting unavailable (arch_prctl(ARCH_SET_CPUID) failed): "
                    "cannot cap this program to AVX2\n");
    _exit(97);
  }
}
