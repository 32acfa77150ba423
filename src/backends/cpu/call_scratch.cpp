// call_scratch.hpp: scratch blocks from the CPU backend's pool (backend.cpp's HostPool).
#include "src/backends/cpu/call_scratch.hpp"

#include "src/backends/cpu/cpu_backend.hpp"

namespace flux::cpu_backend {

void* scratch_allocate(size_t bytes) { return instance().allocate(0, bytes).handle; }
void scratch_deallocate(void* p, size_t bytes) { instance().deallocate(0, {p, 0}, bytes); }

}  // namespace flux::cpu_backend
