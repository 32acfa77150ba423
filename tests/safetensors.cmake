# safetensors beyond the GoogleTest cases in test_safetensors.cpp:
#   safetensors_torch_interop  PyTorch (Debian python3-torch) writes a state dict, flux loads it and
#                              matches its outputs; flux's file goes back to PyTorch the same way.
# (The reader's libFuzzer targets build in their own clang tree: tests/fuzz, scripts/test --fuzz.)
# It exits 77 (ctest: skipped, with the reason printed) when its tools are missing locally; CI
# installs them (scripts/deps.sh) and, with CI set, a missing PyTorch is a failure.
add_executable(safetensors_interop ${CMAKE_CURRENT_SOURCE_DIR}/interop/safetensors_interop.cpp)
target_link_libraries(safetensors_interop PRIVATE flux GTest::gtest)
target_include_directories(safetensors_interop PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(safetensors_interop PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests safetensors_interop)

# Debian's python3-torch lives under the system interpreter, which may not be the first python3 on PATH.
if(EXISTS /usr/bin/python3)
  set(FLUX_INTEROP_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with torch for the safetensors interop test")
else()
  find_program(FLUX_INTEROP_PYTHON NAMES python3)
endif()
if(FLUX_INTEROP_PYTHON)
  add_test(NAME safetensors_torch_interop
    COMMAND ${FLUX_INTEROP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/interop/torch_interop.py
            $<TARGET_FILE:safetensors_interop> ${CMAKE_CURRENT_BINARY_DIR}/safetensors-interop)
else()
  add_test(NAME safetensors_torch_interop
    COMMAND sh -c "echo 'SKIPPED: no python3 found (install python3-torch)'; [ -z \"$CI$FLUX_REQUIRE_INTEROP\" ] && exit 77; exit 1")
endif()
set_tests_properties(safetensors_torch_interop PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)

