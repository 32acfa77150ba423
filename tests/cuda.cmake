# GPU plugin tests (included by tests/CMakeLists.txt): the CUDA/AMDGPU plugins load and report
# "loaded, not functional" where there is no GPU (CI), or functional where there is one; get_device()
# falls back with a warning when the preference names them; flux-info runs and shows both.
set(flux_gpu_plugins)
set(flux_test_cuda 0)
set(flux_test_amdgpu 0)
if(TARGET flux_cuda)  # defined by src/backends/cuda, configured before tests/
  list(APPEND flux_gpu_plugins CUDA)
  add_dependencies(flux_tests flux_cuda)
  set(flux_test_cuda 1)
endif()
if(TARGET flux_amdgpu)
  list(APPEND flux_gpu_plugins AMDGPU)
  add_dependencies(flux_tests flux_amdgpu)
  set(flux_test_amdgpu 1)
endif()
set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/test_cuda_plugin.cpp APPEND PROPERTY COMPILE_DEFINITIONS
  FLUX_TEST_CUDA_PLUGIN=${flux_test_cuda} FLUX_TEST_AMDGPU_PLUGIN=${flux_test_amdgpu})

# An entry that must really run (a skip would hide a broken setup).
function(flux_gpu_test name filter)
  add_test(NAME ${name} COMMAND flux_tests --gtest_filter=${filter})
  set_tests_properties(${name} PROPERTIES ${ARGN} FAIL_REGULAR_EXPRESSION "\\[  SKIPPED \\]|No tests ran" TIMEOUT 120)
endfunction()

foreach(backend ${flux_gpu_plugins})
  set(pref_dir ${CMAKE_CURRENT_BINARY_DIR}/gpu-preferences/${backend})
  file(WRITE ${pref_dir}/LocalPreferences.toml "[flux]\ngpu_backend = \"${backend}\"\n")
  flux_gpu_test(gpu.${backend}.loads_and_reports_state "Plugins/GpuPluginTest.LoadsAndReportsFunctionalState/${backend}")
  flux_gpu_test(gpu.${backend}.preferred_falls_back "Plugins/GpuPluginTest.PreferredBackendFallsBackWithWarning/${backend}"
    ENVIRONMENT "FLUX_PREFERENCES=${pref_dir}")
endforeach()

if(TARGET flux_cuda)
  # f16/bf16 on CUDA:0 (tests/test_low_precision_kernels.cpp): cuBLAS GemmEx and cuDNN against float64
  # where a GPU is present; without one the host rule runs and the device case skips (FLUX_EXPECT_GPU=CUDA
  # makes that a failure).
  add_test(NAME gpu.CUDA.low_precision COMMAND flux_tests --gtest_filter=CudaLowPrecision.*)
  set_tests_properties(gpu.CUDA.low_precision PROPERTIES FAIL_REGULAR_EXPRESSION "No tests ran" TIMEOUT 120)
  flux_gpu_test(gpu.CUDA.hidden_by_visible_devices "Plugins/GpuPluginTest.HiddenByVisibleDevices/CUDA"
    ENVIRONMENT "CUDA_VISIBLE_DEVICES=-1")
endif()

# flux-info runs and lists each built GPU plugin as loaded (functional or not, whichever is true).
if(flux_gpu_plugins)
  set(info_regex "")
  foreach(backend ${flux_gpu_plugins})
    string(APPEND info_regex ".*${backend}: (functional|loaded, not functional)")
  endforeach()
  add_test(NAME gpu.flux_info COMMAND flux-info)
  set_tests_properties(gpu.flux_info PROPERTIES PASS_REGULAR_EXPRESSION "${info_regex}" TIMEOUT 120)
endif()
