// onednn.hpp.
#include "src/backends/cpu/onednn.hpp"

#if FLUX_HAVE_ONEDNN
#include <dlfcn.h>

#include <algorithm>

namespace flux::cpu_backend::onednn {

const dnnl::engine& engine() {
  static const dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

void set_team(int threads) {
  static void (*const set)(int) = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (set) set(threads);
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

}  // namespace flux::cpu_backend::onednn
#endif
