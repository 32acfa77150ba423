# PyTorch (Debian python3-torch) as the oracle for BatchNorm in training and inference
# (tests/interop/batchnorm_interop.{py,cpp}): two training steps, running statistics,
# num_batches_tracked, inference, and training-mode gradients, for BatchNorm2d and BatchNorm1d.
# Exits 77 (skipped) without torch locally; with CI set, that is a failure.
add_executable(batchnorm_interop ${CMAKE_CURRENT_SOURCE_DIR}/interop/batchnorm_interop.cpp)
target_link_libraries(batchnorm_interop PRIVATE flux)
target_compile_options(batchnorm_interop PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests batchnorm_interop)

if(EXISTS /usr/bin/python3)
  set(FLUX_INTEROP_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with torch for the safetensors interop test")
else()
  find_program(FLUX_INTEROP_PYTHON NAMES python3)
endif()
if(FLUX_INTEROP_PYTHON)
  add_test(NAME batchnorm_torch_interop
    COMMAND ${FLUX_INTEROP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/interop/batchnorm_interop.py
            $<TARGET_FILE:batchnorm_interop> ${CMAKE_CURRENT_BINARY_DIR}/batchnorm-interop)
else()
  add_test(NAME batchnorm_torch_interop
    COMMAND sh -c "echo 'SKIPPED: no python3 found (install python3-torch)'; [ -z \"$CI$FLUX_REQUIRE_INTEROP\" ] && exit 77; exit 1")
endif()
set_tests_properties(batchnorm_torch_interop PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS interop)
