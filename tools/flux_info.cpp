// flux-info: versions, backends, devices, memory and the device get_device() picks.
//   flux-info            everything
//   flux-info --verbose  also how get_device() decided (Flux's get_device(; verbose = true))
#include <cstring>
#include <iostream>

#include "flux/flux.hpp"

int main(int argc, char** argv) {
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--verbose") || !std::strcmp(argv[i], "-v")) {
      verbose = true;
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::cout << "usage: flux-info [--verbose]\n"
                   "Prints flux-cpp's version, every backend (loaded, functional, devices), memory per device\n"
                   "and the device get_device() selects. Environment: FLUX_BACKEND_PATH, FLUX_PREFERENCES,\n"
                   "FLUX_DEBUG_BACKENDS=1, FLUX_OPENCL_DEVICES, CUDA_VISIBLE_DEVICES.\n";
      return 0;
    } else {
      std::cerr << "flux-info: unknown argument \"" << argv[i] << "\"; try --help\n";
      return 2;
    }
  }
  try {
    flux::versioninfo(std::cout);
    std::cout << "\nMemory:\n";
    flux::memory_status(std::cout);
    std::cout << "\nGPU_BACKEND() = " << flux::GPU_BACKEND() << "\n";
    std::cout.flush();
    flux::Device d = flux::get_device({.verbose = verbose});
    std::cout << "get_device() = " << flux::to_string(d) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "flux-info: " << e.what() << "\n";
    return 1;
  }
}
