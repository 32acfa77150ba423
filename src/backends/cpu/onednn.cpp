// onednn.hpp.
#include "src/backends/cpu/onednn.hpp"

#if FLUX_HAVE_ONEDNN
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <memory>

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

void* thread_scratch(Scratch which, size_t bytes) {
  struct Block {
    std::unique_ptr<char, void (*)(void*)> data{nullptr, std::free};
    size_t size = 0;
  };
  thread_local Block blocks[kScratchBlocks];
  Block& b = blocks[int(which)];
  if (b.size < bytes || !b.data) {
    const size_t size = (std::max<size_t>(bytes, 64) + 63) / 64 * 64;
    b.data.reset(static_cast<char*>(std::aligned_alloc(64, size)));
    if (!b.data) throw std::bad_alloc();
    b.size = size;
  }
  return b.data.get();
}

}  // namespace flux::cpu_backend::onednn
#endif
