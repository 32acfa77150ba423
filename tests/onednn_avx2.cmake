# oneDNN's kernels below AVX-512 (gemm:jit instead of brgemm: Dense inference and the LSTM's
# recurrence then time w read as it is against a transposed copy, matmul_onednn.cpp's linear_piece) run on
# AVX2-only machines, which CI may not have: these tests run again with oneDNN capped to AVX2 (the
# cap works on any x86-64 CPU; oneDNN reads it at its first kernel).
if(flux_have_onednn AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  add_test(NAME cpu.onednn_avx2_paths
           COMMAND flux_tests "--gtest_filter=CpuLinear.*:Recurrent.FusedKernelsMatchPortablePath:RecurrentGradients.*:*/RecurrentDevices.*:*/WeightCacheDevices.MaxPoolOnConvOutputs/*:*/ConvFusionDevices.*")
  set_tests_properties(cpu.onednn_avx2_paths PROPERTIES TIMEOUT 600
                       ENVIRONMENT "ONEDNN_MAX_CPU_ISA=AVX2;DNNL_MAX_CPU_ISA=AVX2")
endif()
