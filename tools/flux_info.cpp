// flux-info: versions, backends, devices, memory and the device get_device() picks.
#include <iostream>

#include "flux/flux.hpp"

int main() {
  try {
    flux::versioninfo(std::cout);
    std::cout << "\nMemory:\n";
    flux::memory_status(std::cout);
    std::cout << "\nget_device() = " << flux::to_string(flux::get_device()) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "flux-info: " << e.what() << "\n";
    return 1;
  }
}
