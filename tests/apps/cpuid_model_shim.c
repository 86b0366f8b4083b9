/* An LD_AUDIT library that shows a program the CPU model FAKE_CPU_MODEL (default 207, a Xeon
 * that OpenBLAS 0.3.21 does not know) with the real feature bits, so that the BLAS fix of the
 * distmuon CLI can be tested on any Intel machine with CPUID faulting (Linux ARCH_SET_CPUID):
 * every CPUID then traps, and the SIGSEGV handler runs the real one and rewrites leaf 1's model.
 * LD_AUDIT libraries load before every other library, so OpenBLAS's own CPU detection (run when
 * it loads) sees the fake model. Test support only: distmuon does not use it. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static unsigned leaf1_model_bits; /* family 6: extended model, model, family, stepping 1 */

static void on_sigsegv(int sig, siginfo_t* info, void* context) {
  (void)sig;
  (void)info;
  greg_t* regs = ((ucontext_t*)context)->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)regs[REG_RIP];
  if (ip[0] != 0x0f || ip[1] != 0xa2) { /* not CPUID: a real fault, die as usual */
    signal(SIGSEGV, SIG_DFL);
    return;
  }
  const unsigned leaf = (unsigned)regs[REG_RAX];
  unsigned a = leaf, b, c = (unsigned)regs[REG_RCX], d;
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
  __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
  if (leaf == 1) a = (a & 0xf000c000u) | leaf1_model_bits;
  regs[REG_RAX] = a;
  regs[REG_RBX] = b;
  regs[REG_RCX] = c;
  regs[REG_RDX] = d;
  regs[REG_RIP] += 2;
}

unsigned la_version(unsigned version) {
  const char* text = getenv("FAKE_CPU_MODEL");
  const unsigned model = text ? (unsigned)strtoul(text, NULL, 0) : 207u;
  leaf1_model_bits = ((model >> 4) << 16) | (6u << 8) | ((model & 0xfu) << 4) | 1u;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigsegv;
  sa.sa_flags = SA_SIGINFO;
  if (sigaction(SIGSEGV, &sa, NULL) == 0) syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
  return version;
}
