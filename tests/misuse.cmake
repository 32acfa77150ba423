# The misuse suite (tests/misuse/, issue 35): a careless user's inputs (overflowing shapes, NaN, nested
# gradients, hostile files, bad configuration, casts out of range, threads). Every TEST is its own
# ctest entry, so every case runs in its own process: a crash fails that case, not the run. Device
# cases run on every device (CPU and OpenCL on PoCL here); the MisuseEnv cases need an environment
# (FLUX_NUM_THREADS, a preference file) and run only through the entries below, which set it.
# test_misuse_new_apis.cpp (issue 49): the APIs added since, and every FLUX_* variable (misuse.env.new_*).
add_executable(flux_misuse_tests ${CMAKE_CURRENT_SOURCE_DIR}/misuse/test_misuse.cpp
               ${CMAKE_CURRENT_SOURCE_DIR}/misuse/test_misuse_new_apis.cpp)
target_link_libraries(flux_misuse_tests PRIVATE flux GTest::gtest GTest::gtest_main)
target_include_directories(flux_misuse_tests PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(flux_misuse_tests PRIVATE ${FLUX_WARNINGS})
target_compile_definitions(flux_misuse_tests PRIVATE FLUX_TEST_HAVE_ONEDNN=$<BOOL:${flux_have_onednn}>)
set(FLUX_MISUSE_POCL_CACHE ${CMAKE_BINARY_DIR}/pocl-cache)
gtest_discover_tests(flux_misuse_tests TEST_PREFIX "misuse." DISCOVERY_TIMEOUT 120
  PROPERTIES TIMEOUT 300 LABELS misuse ENVIRONMENT "POCL_CACHE_DIR=${FLUX_MISUSE_POCL_CACHE}"
  TEST_FILTER "-MisuseEnv.*:MisuseEnvNew.*")

# misuse_env(<name> <case> VAR=value ...): MisuseEnv.<case> in a process with that environment.
function(misuse_env name case)
  add_test(NAME misuse.env.${name} COMMAND $<TARGET_FILE:flux_misuse_tests> --gtest_filter=MisuseEnv.${case})
  set_tests_properties(misuse.env.${name} PROPERTIES
    ENVIRONMENT "FLUX_MISUSE_ENV=${name};POCL_CACHE_DIR=${FLUX_MISUSE_POCL_CACHE};${ARGN}"
    FAIL_REGULAR_EXPRESSION "Running 0 tests|SKIPPED \\] MisuseEnv"
    LABELS misuse TIMEOUT 300)
endfunction()

# FLUX_NUM_THREADS: valid, zero, negative, junk, absurd (one warning each and a sane pool, no abort).
misuse_env(threads_valid ThreadCount FLUX_NUM_THREADS=3)
misuse_env(threads_zero ThreadCount FLUX_NUM_THREADS=0)
misuse_env(threads_negative ThreadCount FLUX_NUM_THREADS=-3x)
misuse_env(threads_junk ThreadCount FLUX_NUM_THREADS=many)
misuse_env(threads_absurd ThreadCount FLUX_NUM_THREADS=100000)
# Preference files: a number for gpu_backend, a directory, a device file (each warned, never thrown).
set(FLUX_MISUSE_PREFS ${CMAKE_CURRENT_BINARY_DIR}/misuse-preferences)
file(MAKE_DIRECTORY ${FLUX_MISUSE_PREFS})
foreach(kind number directory device)
  misuse_env(prefs_${kind} Preferences FLUX_PREFERENCES=${FLUX_MISUSE_PREFS}/${kind}.toml)
endforeach()

# Every FLUX_* variable with a value outside its table (src/environment.cpp): a flux::Error naming it
# at its first read, or (FLUX_OPENCL_DEVICES) the documented fallback; and spellings that must work.
function(misuse_env_new name)
  add_test(NAME misuse.env.new_${name} COMMAND $<TARGET_FILE:flux_misuse_tests> --gtest_filter=MisuseEnvNew.Variables)
  set_tests_properties(misuse.env.new_${name} PROPERTIES
    ENVIRONMENT "FLUX_MISUSE_ENV=new_${name};POCL_CACHE_DIR=${FLUX_MISUSE_POCL_CACHE};${ARGN}"
    FAIL_REGULAR_EXPRESSION "Running 0 tests|SKIPPED \\] MisuseEnvNew"
    LABELS misuse TIMEOUT 300)
endfunction()
misuse_env_new(cpu_limit_negative FLUX_CPU_MEMORY_LIMIT=-1)
misuse_env_new(emulate_false FLUX_AUTOCAST_EMULATE=false)
misuse_env_new(emulate_on FLUX_AUTOCAST_EMULATE=ON)
misuse_env_new(emulate_junk FLUX_AUTOCAST_EMULATE=maybe)
misuse_env_new(library_kernels_junk FLUX_LIBRARY_KERNELS=banana)
misuse_env_new(library_kernels_off FLUX_LIBRARY_KERNELS=off)
misuse_env_new(onednn_layout_junk FLUX_ONEDNN_LAYOUT=banana)
misuse_env_new(onednn_threading_junk FLUX_ONEDNN_THREADING=banana)
misuse_env_new(denormals_junk FLUX_FLUSH_DENORMALS=2)
misuse_env_new(timeout_junk FLUX_DISTRIBUTED_TIMEOUT=soon)
misuse_env_new(debug_backends_junk FLUX_DEBUG_BACKENDS=banana)
misuse_env_new(opencl_devices_junk FLUX_OPENCL_DEVICES=banana)
