# OpenBLAS running kernels below the CPU (an OpenBLAS older than the CPU model): OPENBLAS_CORETYPE=Prescott
# forces its SSE3 kernels, which OpenBLAS reads when it loads, so this is a process of its own. The
# dependency check must see them and the kernel rules send every float32 GEMM to oneDNN (the GEMM tests
# but the one that asserts the as-detected rule run again there).
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  add_test(NAME cpu.blas_below_cpu COMMAND flux_tests "--gtest_filter=BlasFallbackEnv.*:BlasDependencyCheck.*:CpuGemm.*:-CpuGemm.ChoiceIsTheRule*")
  set_tests_properties(cpu.blas_below_cpu PROPERTIES TIMEOUT 600 ENVIRONMENT "OPENBLAS_CORETYPE=Prescott")
endif()
