# Device-system tests that need their own process and environment (included by tests/CMakeLists.txt).
# Preferences are read once per process and plugins are loaded once, so each case below runs
# flux_tests filtered to one test, with FLUX_TEST_ENV naming the case (the test skips elsewhere).

# ---- fake plugins: each installed as libflux-metal.so in its own folder ----
set(FLUX_FAKE_PLUGIN_DIR ${CMAKE_CURRENT_BINARY_DIR}/plugins)
foreach(fake wrong_abi no_entry create_throws)
  set(target flux_fake_plugin_${fake})
  add_library(${target} MODULE ${CMAKE_CURRENT_SOURCE_DIR}/plugins/fake_plugin.cpp)
  string(TOUPPER ${fake} fake_upper)
  target_compile_definitions(${target} PRIVATE FLUX_FAKE_${fake_upper})
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/include)
  target_compile_options(${target} PRIVATE ${FLUX_WARNINGS})
  set_target_properties(${target} PROPERTIES PREFIX "lib" OUTPUT_NAME "flux-metal" SUFFIX ".so"
    LIBRARY_OUTPUT_DIRECTORY ${FLUX_FAKE_PLUGIN_DIR}/${fake})
  add_dependencies(flux_tests ${target})
endforeach()
# Random bytes with a plugin's name.
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/plugins/corrupt.so ${FLUX_FAKE_PLUGIN_DIR}/corrupt/libflux-metal.so COPYONLY)
add_dependencies(flux_tests flux-info)

# ---- prepared preference files ----
set(FLUX_PREF_DIR ${CMAKE_CURRENT_BINARY_DIR}/preferences)
file(WRITE ${FLUX_PREF_DIR}/opencl/LocalPreferences.toml "[flux]\ngpu_backend = \"OpenCL\"\n")
file(WRITE ${FLUX_PREF_DIR}/cuda/LocalPreferences.toml "# written by tests/device.cmake\n[flux]\ngpu_backend = \"CUDA\"\n")
file(WRITE ${FLUX_PREF_DIR}/cpu/LocalPreferences.toml "[flux]\ngpu_backend = \"CPU\"\n")
file(WRITE ${FLUX_PREF_DIR}/malformed/LocalPreferences.toml "[flux\ngpu_backend = = \"OpenCL\n")
file(WRITE ${FLUX_PREF_DIR}/unknown/custom.toml "[flux]\ngpu_backend = \"Vulkan\"\n")

# flux_device_env(<name> <test> <case> [VAR=value ...]): one ctest entry `device_env.<name>`.
function(flux_device_env name test case)
  add_test(NAME device_env.${name} COMMAND $<TARGET_FILE:flux_tests> --gtest_filter=${test})
  set_tests_properties(device_env.${name} PROPERTIES
    ENVIRONMENT "FLUX_TEST_ENV=${case};${ARGN}"
    FAIL_REGULAR_EXPRESSION "Running 0 tests"  # a filter that matches nothing is a failure
    TIMEOUT 300)
endfunction()

flux_device_env(pref_opencl DeviceEnv.PreferenceOpenCL pref_opencl FLUX_PREFERENCES=${FLUX_PREF_DIR}/opencl)
flux_device_env(pref_cuda DeviceEnv.PreferenceCUDAMissing pref_cuda FLUX_PREFERENCES=${FLUX_PREF_DIR}/cuda)
flux_device_env(pref_malformed DeviceEnv.PreferenceMalformed pref_malformed FLUX_PREFERENCES=${FLUX_PREF_DIR}/malformed)
flux_device_env(pref_cpu DeviceEnv.PreferenceCPU pref_cpu FLUX_PREFERENCES=${FLUX_PREF_DIR}/cpu)
flux_device_env(pref_unknown DeviceEnv.PreferenceUnknownNameInTomlPath pref_unknown
  FLUX_PREFERENCES=${FLUX_PREF_DIR}/unknown/custom.toml)
# gpu_backend writes the file in one process; the next process starts with it.
flux_device_env(pref_write DeviceEnv.GpuBackendWritesPreference pref_write FLUX_PREFERENCES=${FLUX_PREF_DIR}/written)
flux_device_env(pref_written DeviceEnv.PreferenceWrittenEarlier pref_written FLUX_PREFERENCES=${FLUX_PREF_DIR}/written)
set_tests_properties(device_env.pref_write PROPERTIES FIXTURES_SETUP flux_written_preference)
set_tests_properties(device_env.pref_written PROPERTIES FIXTURES_REQUIRED flux_written_preference)

flux_device_env(opencl_hidden DeviceEnv.OpenCLHidden opencl_hidden FLUX_OPENCL_DEVICES=-1
  FLUX_PREFERENCES=${FLUX_PREF_DIR}/none)
flux_device_env(opencl_hidden_preferred DeviceEnv.OpenCLHiddenButPreferred opencl_hidden_preferred
  FLUX_OPENCL_DEVICES=-1 FLUX_PREFERENCES=${FLUX_PREF_DIR}/opencl)

foreach(fake_test wrong_abi:PluginForAnotherAbiIsRefused no_entry:PluginWithoutEntrySymbolIsRefused
                  corrupt:CorruptPluginFileIsRefused create_throws:PluginWhoseCreateThrowsIsNotLoaded)
  string(REPLACE ":" ";" fake_test ${fake_test})
  list(GET fake_test 0 fake)
  list(GET fake_test 1 test)
  flux_device_env(plugin_${fake} DeviceEnv.${test} plugin_${fake} FLUX_BACKEND_PATH=${FLUX_FAKE_PLUGIN_DIR}/${fake}
    FLUX_PREFERENCES=${FLUX_PREF_DIR}/none)
endforeach()
flux_device_env(debug_backends DeviceEnv.DebugBackendsLogsDecisions debug_backends FLUX_DEBUG_BACKENDS=1
  FLUX_PREFERENCES=${FLUX_PREF_DIR}/none)

# Two PoCL devices: transfers, get_device("OpenCL", 1), mixed-device errors, and the move and
# loader suites on both devices. Without the OpenCL plugin these skip.
add_test(NAME device_env.two_pocl_devices
  COMMAND $<TARGET_FILE:flux_tests> "--gtest_filter=TwoDevices.*:Devices/Move.*:Devices/DeviceLoaderOn.*:DeviceApi.GetDeviceOpenCLEveryIndex")
set_tests_properties(device_env.two_pocl_devices PROPERTIES
  ENVIRONMENT "POCL_DEVICES=pthread pthread;FLUX_PREFERENCES=${FLUX_PREF_DIR}/none"
  FAIL_REGULAR_EXPRESSION "Running 0 tests"
  TIMEOUT 900)

# Out of memory on the CPU pool limited by FLUX_CPU_MEMORY_LIMIT (tests/test_out_of_memory.cpp): the
# cache is emptied and the allocation retried, then flux::OutOfMemory (for kernels' scratch too); a malformed
# limit is an error.
foreach(oom cpu:CpuLimitedPool:64M cpu_scratch:Cpu*ScratchOverLimit:64M cpu_malformed:CpuLimitMalformed:lots)
  string(REPLACE ":" ";" oom ${oom})
  list(GET oom 0 case)
  list(GET oom 1 test)
  list(GET oom 2 limit)
  add_test(NAME device_env.${case}_memory_limit COMMAND $<TARGET_FILE:flux_tests> --gtest_filter=OutOfMemoryEnv.${test})
  set_tests_properties(device_env.${case}_memory_limit PROPERTIES
    ENVIRONMENT "FLUX_OOM_TEST_ENV=${case};FLUX_CPU_MEMORY_LIMIT=${limit};FLUX_PREFERENCES=${FLUX_PREF_DIR}/none"
    FAIL_REGULAR_EXPRESSION "Running 0 tests|SKIPPED \\] OutOfMemoryEnv"
    TIMEOUT 300)
endforeach()

# flux-info prints everything and exits 0: as is, with OpenCL hidden, and next to a refused plugin.
add_test(NAME flux_info COMMAND $<TARGET_FILE:flux-info>)
add_test(NAME flux_info.opencl_hidden COMMAND $<TARGET_FILE:flux-info>)
set_tests_properties(flux_info.opencl_hidden PROPERTIES ENVIRONMENT "FLUX_OPENCL_DEVICES=-1")
add_test(NAME flux_info.refused_plugin COMMAND $<TARGET_FILE:flux-info>)
set_tests_properties(flux_info.refused_plugin PROPERTIES
  ENVIRONMENT "FLUX_BACKEND_PATH=${FLUX_FAKE_PLUGIN_DIR}/wrong_abi;FLUX_DEBUG_BACKENDS=1")

# `ninja flux_tests` also builds the plugins the device tests load.
foreach(plugin flux-opencl flux-cuda flux-amdgpu)
  if(TARGET ${plugin})
    add_dependencies(flux_tests ${plugin})
  endif()
endforeach()

add_test(NAME flux_info.verbose COMMAND $<TARGET_FILE:flux-info> --verbose)
set_tests_properties(flux_info.verbose PROPERTIES PASS_REGULAR_EXPRESSION "automatic device selection")
add_test(NAME flux_info.bad_argument COMMAND $<TARGET_FILE:flux-info> --bogus)
set_tests_properties(flux_info.bad_argument PROPERTIES WILL_FAIL TRUE)
