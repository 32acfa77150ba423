# PyTorch interop on convolutional networks (tests/interop/resnet_interop.{py,cpp}), run with Debian's
# python3-torch + python3-torchvision:
#   resnet18_torch_to_flux  torchvision's resnet18 state_dict (random weights and BatchNorm statistics,
#                           eval mode) loads unchanged into flux::models::ResNet18; same logits
#                           (<= 1e-4) on every test device (CPU, OpenCL:0).
#   cnn_flux_to_torch       a flux-trained CNN (Conv, BatchNorm, pools, Dropout, Dense) loads into the
#                           matching nn.Sequential with strict=True; same outputs (<= 1e-5).
# Both exit 77 (skipped) without torch/torchvision locally; with CI set, that is a failure.
add_executable(resnet_interop ${CMAKE_CURRENT_SOURCE_DIR}/interop/resnet_interop.cpp)
target_link_libraries(resnet_interop PRIVATE flux GTest::gtest)
target_include_directories(resnet_interop PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(resnet_interop PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests resnet_interop)

if(EXISTS /usr/bin/python3)
  set(FLUX_INTEROP_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with torch for the safetensors interop test")
else()
  find_program(FLUX_INTEROP_PYTHON NAMES python3)
endif()
foreach(direction torch-to-flux flux-to-torch)
  if(direction STREQUAL "torch-to-flux")
    set(name resnet18_torch_to_flux)
  else()
    set(name cnn_flux_to_torch)
  endif()
  if(FLUX_INTEROP_PYTHON)
    add_test(NAME ${name}
      COMMAND ${FLUX_INTEROP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/interop/resnet_interop.py ${direction}
              $<TARGET_FILE:resnet_interop> ${CMAKE_CURRENT_BINARY_DIR}/resnet-interop-${direction})
  else()
    add_test(NAME ${name}
      COMMAND sh -c "echo 'SKIPPED: no python3 found (install python3-torch python3-torchvision)'; [ -z \"$CI$FLUX_REQUIRE_INTEROP\" ] && exit 77; exit 1")
  endif()
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS interop)
endforeach()
