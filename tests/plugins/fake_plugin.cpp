// A fake backend plugin for the loader's refusal tests; it never provides a working backend.
// Built three ways (see tests/device.cmake), each installed as libflux-metal.so in its own folder:
//   FLUX_FAKE_WRONG_ABI    exports the entry with kBackendAbiVersion + 1   -> refused, both versions named
//   FLUX_FAKE_NO_ENTRY     exports no flux_backend_plugin symbol           -> refused, symbol named
//   FLUX_FAKE_CREATE_THROWS the right ABI, but create() throws              -> not loaded, reason kept
#include <stdexcept>

#include "flux/backend.hpp"

namespace {
flux::backend::Backend* create_backend() {
#if defined(FLUX_FAKE_CREATE_THROWS)
  throw std::runtime_error("fake plugin: no device context");
#else
  return nullptr;
#endif
}
}  // namespace

#if defined(FLUX_FAKE_WRONG_ABI)
extern "C" __attribute__((visibility("default"))) flux::backend::PluginInfo flux_backend_plugin() {
  return {flux::backend::kBackendAbiVersion + 1, &create_backend};
}
#elif defined(FLUX_FAKE_CREATE_THROWS)
extern "C" __attribute__((visibility("default"))) flux::backend::PluginInfo flux_backend_plugin() {
  return {flux::backend::kBackendAbiVersion, &create_backend};
}
#elif defined(FLUX_FAKE_NO_ENTRY)
// A differently named entry, as an old or foreign plugin might have.
extern "C" __attribute__((visibility("default"))) flux::backend::PluginInfo flux_backend_plugin_v0() {
  return {flux::backend::kBackendAbiVersion, &create_backend};
}
#else
#error "define one of FLUX_FAKE_WRONG_ABI, FLUX_FAKE_NO_ENTRY, FLUX_FAKE_CREATE_THROWS"
#endif
