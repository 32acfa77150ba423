# The best-fit CPU pool (FLUX_CPU_POOL=best_fit, src/backends/best_fit_pool.hpp) under the library:
# the limited-pool scenario of tests/test_out_of_memory.cpp, and suites that allocate many sizes from
# one and from several threads (tensors, gradients, training loops, concurrent callers).
add_test(NAME device_env.cpu_memory_limit_best_fit COMMAND $<TARGET_FILE:flux_tests> --gtest_filter=OutOfMemoryEnv.CpuLimitedPool)
set_tests_properties(device_env.cpu_memory_limit_best_fit PROPERTIES
  ENVIRONMENT "FLUX_OOM_TEST_ENV=cpu;FLUX_CPU_MEMORY_LIMIT=64M;FLUX_CPU_POOL=best_fit"
  FAIL_REGULAR_EXPRESSION "Running 0 tests|SKIPPED \\] OutOfMemoryEnv"
  TIMEOUT 300)
add_test(NAME cpu.best_fit_pool COMMAND $<TARGET_FILE:flux_tests>
         "--gtest_filter=BestFitPool.*:Tensor.*:Gradients.*:ModelGradients.*:Dense.*:CpuPool.*:DataLoader.*:Devices/Concurrency.*/CPU:Devices/TrainLoop.*/CPU:Devices/Ops.*/CPU:Devices/Optimisers.*/CPU:Devices/Determinism.*/CPU:Devices/WeightWrites.*/CPU")
set_tests_properties(cpu.best_fit_pool PROPERTIES ENVIRONMENT "FLUX_CPU_POOL=best_fit" TIMEOUT 900
                     FAIL_REGULAR_EXPRESSION "Running 0 tests")
