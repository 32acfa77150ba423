# The PyTorch float64 differential suite (tests/reference/): generate.py writes every case's inputs,
# cotangents and references with Debian's python3-torch at test time (a ctest fixture), then
# flux_reference replays them on every test device in float64 and float32 (tests/reference/replay.cpp).
# The data is generated, not committed: it always matches the script, and torch is a test dependency
# already (scripts/deps.sh). Without torch the generator exits 77 (skipped) locally; with CI set,
# that is a failure. Measured here (2 cores shared, PoCL 3.1, warm cache): generation ~5-11 s (importing torch), replay ~3.5 s (258 cases x CPU, OpenCL:0 x float64, float32).
add_executable(flux_reference ${CMAKE_CURRENT_SOURCE_DIR}/reference/replay.cpp)
target_link_libraries(flux_reference PRIVATE flux GTest::gtest GTest::gtest_main nlohmann_json::nlohmann_json)
target_include_directories(flux_reference PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(flux_reference PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests flux_reference)

set(FLUX_REFERENCE_CASES ${CMAKE_CURRENT_BINARY_DIR}/reference/cases.json)
if(EXISTS /usr/bin/python3)
  set(FLUX_REFERENCE_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with torch for the reference suite")
else()
  find_program(FLUX_REFERENCE_PYTHON NAMES python3)
endif()
if(FLUX_REFERENCE_PYTHON)
  add_test(NAME reference.generate
    COMMAND ${FLUX_REFERENCE_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/reference/generate.py ${FLUX_REFERENCE_CASES})
else()
  add_test(NAME reference.generate
    COMMAND sh -c "echo 'SKIPPED: no python3 found (install python3-torch)'; [ -z \"$CI$FLUX_REQUIRE_INTEROP\" ] && exit 77; exit 1")
endif()
set_tests_properties(reference.generate PROPERTIES FIXTURES_SETUP flux_reference_cases SKIP_RETURN_CODE 77
  TIMEOUT 300 LABELS reference)
add_test(NAME reference.replay COMMAND $<TARGET_FILE:flux_reference>)
set_tests_properties(reference.replay PROPERTIES FIXTURES_REQUIRED flux_reference_cases
  ENVIRONMENT "FLUX_REFERENCE_CASES=${FLUX_REFERENCE_CASES}"
  TIMEOUT 600 LABELS reference)

# The float32 suites at every ISA level the build has: the run above uses the CPU's best (AVX-512 on
# CI's machine), these cap oneDNN and flux's own kernels to AVX2 (src/backends/cpu/isa.cpp), so a
# tolerance tuned on one CPU kind cannot fail on another (~5 s for the replay, CPU and float32 only).
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  add_test(NAME reference.replay.avx2 COMMAND $<TARGET_FILE:flux_reference> --gtest_filter=*/Reference.*/CPU_f32)
  set_tests_properties(reference.replay.avx2 PROPERTIES FIXTURES_REQUIRED flux_reference_cases
    ENVIRONMENT "FLUX_REFERENCE_CASES=${FLUX_REFERENCE_CASES};ONEDNN_MAX_CPU_ISA=AVX2;DNNL_MAX_CPU_ISA=AVX2"
    FAIL_REGULAR_EXPRESSION "Running 0 tests" TIMEOUT 600 LABELS reference)
  add_test(NAME cpu.gradient_parity_avx2 COMMAND flux_tests --gtest_filter=*/GradientParity.*/CPU)
  set_tests_properties(cpu.gradient_parity_avx2 PROPERTIES
    ENVIRONMENT "ONEDNN_MAX_CPU_ISA=AVX2;DNNL_MAX_CPU_ISA=AVX2" FAIL_REGULAR_EXPRESSION "Running 0 tests"
    TIMEOUT 600 LABELS reference)
endif()
