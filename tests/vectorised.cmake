# The CPU kernels' AVX2 copies are vector code (tests/vectorised/check.sh): an AVX2-only machine runs
# them, and a loop that silently compiles to scalar code passes every value test while running
# several times slower (GELU was 41% of the transformer step on AVX2). x86-64 with GCC, where the
# variants are compiled and the check's counts were set.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_test(NAME cpu.avx2_kernels_vectorised
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/vectorised/check.sh $<TARGET_FILE:flux>)
  set_tests_properties(cpu.avx2_kernels_vectorised PROPERTIES TIMEOUT 120)
endif()
