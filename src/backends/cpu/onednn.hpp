// oneDNN in the CPU backend (matmul_onednn.cpp, matmul_bf16.cpp, conv_onednn.cpp): the one engine, the calling
// thread's stream, and how the calls run. Debian's oneDNN runs on libgomp's OpenMP, whose idle team
// threads spin and fought our pool and OpenBLAS for the cores: every oneDNN call runs on one pool
// thread with a one-thread OpenMP team (set_team(1)), which starts no OpenMP threads, and large calls
// are cut over our pool by their callers. Primitives are created with user scratchpads, so that one
// primitive is executed by many threads at once, each with its own scratch memory.
#pragma once
#if FLUX_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>

#include "src/backends/cpu/call_scratch.hpp"

namespace flux::cpu_backend::onednn {

/// The CPU engine (created once, never destroyed, as the backend).
const dnnl::engine& engine();
/// The calling thread's stream on engine().
dnnl::stream& stream();
/// Sets the calling thread's OpenMP team size for the primitives it creates and runs.
void set_team(int threads);
/// An attribute with a user scratchpad (scratchpad_mode::user).
dnnl::primitive_attr user_scratchpad();
/// Which of a call's scratch blocks (call_scratch.hpp): one per operand a call may need at once.
enum class Scratch : int { scratchpad = 0, src = 1, weights = 2, dst = 3, bias = 4, output = 5 };
using CallScratch = cpu_backend::CallScratch<Scratch, 6>;

}  // namespace flux::cpu_backend::onednn
#endif
