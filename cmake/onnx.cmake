# ONNX export and import (src/onnx/, include/flux/onnx.hpp), built into libflux itself: the public
# header needs no protobuf or ONNX header (both are linked PRIVATE), so consumers link flux::flux
# alone and a build without ONNX keeps the same API (onnx::save/load then throw a flux::Error that
# says how to get it). The format is read and written with ONNX's own generated protobuf classes
# (Debian libonnx-dev: onnx/onnx_pb.h, libonnx_proto; libprotobuf-dev 3.21): scripts/deps.sh onnx.
set(flux_have_onnx 0)
file(GLOB FLUX_ONNX_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/onnx/*.cpp)
if(NOT FLUX_ONNX STREQUAL "OFF")
  find_package(Protobuf QUIET)
  if(Protobuf_FOUND)
    find_package(ONNX QUIET CONFIG)
  endif()
  if(Protobuf_FOUND AND TARGET onnx_proto)
    set(flux_have_onnx 1)
    target_link_libraries(flux PRIVATE onnx_proto protobuf::libprotobuf)
    message(STATUS "flux: ONNX ${ONNX_VERSION} (protobuf ${Protobuf_VERSION}): onnx::save / onnx::load")
  elseif(FLUX_ONNX STREQUAL "ON")
    message(FATAL_ERROR "flux: FLUX_ONNX=ON but ONNX/protobuf were not found (scripts/deps.sh onnx: libonnx-dev libprotobuf-dev)")
  else()
    message(STATUS "flux: ONNX not built: libonnx-dev / libprotobuf-dev not found (scripts/deps.sh onnx); onnx::save/load throw")
  endif()
else()
  message(STATUS "flux: ONNX not built (FLUX_ONNX=OFF); onnx::save/load throw")
endif()
target_sources(flux PRIVATE ${FLUX_ONNX_SOURCES})
set_source_files_properties(${FLUX_ONNX_SOURCES} PROPERTIES COMPILE_DEFINITIONS FLUX_HAVE_ONNX=${flux_have_onnx})
