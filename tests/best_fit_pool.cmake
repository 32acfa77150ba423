# The CPU pool's simple reference (FLUX_CPU_POOL=size_classes, src/backends/caching_pool.hpp) beside the
# default best-fit pool: the limited-pool scenario of tests/test_out_of_memory.cpp, and suites that
# allocate many sizes from one and from several threads (tensors, gradients, training loops, callers).
add_test(NAME device_env.cpu_memory_limit_size_classes COMMAND $<TARGET_FILE:flux_tests> --gtest_filter=OutOfMemoryEnv.CpuLimitedPool)
set_tests_properties(device_env.cpu_memory_limit_size_classes PROPERTIES
  ENVIRONMENT "FLUX_OOM_TEST_ENV=cpu;FLUX_CPU_MEMORY_LIMIT=64M;FLUX_CPU_POOL=size_classes"
  FAIL_REGULAR_EXPRESSION "Running 0 tests|SKIPPED \\] OutOfMemoryEnv"
  TIMEOUT 300)
add_test(NAME cpu.size_class_pool COMMAND $<TARGET_FILE:flux_tests>
         "--gtest_filter=Tensor.*:Gradients.*:ModelGradients.*:Dense.*:CpuPool.*:DataLoader.*:Devices/Concurrency.*/CPU:Devices/TrainLoop.*/CPU:Devices/Ops.*/CPU:Devices/Optimisers.*/CPU:Devices/Determinism.*/CPU:Devices/WeightWrites.*/CPU")
set_tests_properties(cpu.size_class_pool PROPERTIES ENVIRONMENT "FLUX_CPU_POOL=size_classes" TIMEOUT 900
                     FAIL_REGULAR_EXPRESSION "Running 0 tests")
