# OpenCL backend runs that need their own environment (included by tests/CMakeLists.txt). Each runs
# flux_tests (or an example) in a fresh process; the OpenCLEnv tests skip unless FLUX_OPENCL_TEST_ENV
# names their case. POCL_CACHE_DIR is fixed in the build tree so PoCL's compiled kernels (and
# CLBlast's, ~13 s cold per GEMM program) are built once per tree.
# Measured here (2 cores, PoCL 3.1): every OpenCL ctest entry together (98: the device suites on
# OpenCL:0 plus these) takes ~17 s with a warm cache at -j2; a cold cache adds ~2.5 min of kernel
# compilation, most of it CLBlast's f32/f64 GEMM programs.
if(NOT TARGET flux-opencl)
  return()
endif()

set(FLUX_POCL_CACHE_DIR ${CMAKE_BINARY_DIR}/pocl-cache)
file(MAKE_DIRECTORY ${FLUX_POCL_CACHE_DIR})
set(FLUX_OPENCL_PREFS ${CMAKE_CURRENT_BINARY_DIR}/opencl-preferences)
file(WRITE ${FLUX_OPENCL_PREFS}/opencl/LocalPreferences.toml "# written by tests/opencl.cmake\n[flux]\ngpu_backend = \"OpenCL\"\n")

# flux_opencl_env(<name> <gtest filter> <case> [VAR=value ...]): one ctest entry `opencl.<name>`.
function(flux_opencl_env name filter case)
  add_test(NAME opencl.${name} COMMAND $<TARGET_FILE:flux_tests> --gtest_filter=${filter})
  set_tests_properties(opencl.${name} PROPERTIES
    ENVIRONMENT "FLUX_OPENCL_TEST_ENV=${case};POCL_CACHE_DIR=${FLUX_POCL_CACHE_DIR};${ARGN}"
    FAIL_REGULAR_EXPRESSION "Running 0 tests|SKIPPED \\] OpenCLEnv"  # the env test must run, not skip
    LABELS opencl
    TIMEOUT 600)
endfunction()

# Two PoCL devices: 2 devices asserted, OpenCL:0 -> OpenCL:1 -> CPU, get_device("OpenCL", 1), and every
# primitive on both devices (including a real device-to-device copy_peer).
flux_opencl_env(two_devices "OpenCLEnv.TwoPoclDevicesMoveTensors:Devices/OpenCLBackend.*" two_devices
  "POCL_DEVICES=pthread pthread" FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/none)
# The convolutional-network suites (conv and pooling ops and kernels, normalisation, random/dropout,
# conv layers) on both PoCL devices, OpenCL:0 and OpenCL:1; the env test asserts there are 2.
# Measured: ~93 tests in ~16 s with a warm cache (2 cores, PoCL 3.1).
flux_opencl_env(layers_two_devices
  "OpenCLEnv.TwoPoclDevicesMoveTensors:Devices/Conv*/OpenCL_*:Devices/Pool*/OpenCL_*:Devices/*Norm.*/OpenCL_*:Devices/*Dropout.*/OpenCL_*:Devices/Random*/OpenCL_*"
  two_devices "POCL_DEVICES=pthread pthread" FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/none)
# The gradient-parity sweep (tests/test_gradient_parity.cpp, issue 33) on both PoCL devices: every
# op, loss and layer's gradient with respect to every floating input against the float64 CPU one.
flux_opencl_env(gradient_parity_two_devices "OpenCLEnv.TwoPoclDevicesMoveTensors:Devices/GradientParity.*/OpenCL_*"
  two_devices "POCL_DEVICES=pthread pthread" FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/none)
# Out of memory on a limited PoCL device (1 GiB global memory, 256 MiB largest buffer): the pool empties
# its cache and retries, then throws flux::OutOfMemory with the figures (tests/test_out_of_memory.cpp).
add_test(NAME opencl.out_of_memory COMMAND $<TARGET_FILE:flux_tests> --gtest_filter=OutOfMemoryEnv.OpenCLLimitedDevice)
set_tests_properties(opencl.out_of_memory PROPERTIES
  ENVIRONMENT "FLUX_OOM_TEST_ENV=opencl;POCL_MEMORY_LIMIT=1;POCL_CACHE_DIR=${FLUX_POCL_CACHE_DIR};FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/none"
  FAIL_REGULAR_EXPRESSION "Running 0 tests|SKIPPED \\] OutOfMemoryEnv"
  LABELS opencl TIMEOUT 300)
# Hidden devices: the plugin loads, is not functional, get_device() falls back to CPU.
flux_opencl_env(hidden OpenCLEnv.HiddenDevicesFallBackToCpu hidden FLUX_OPENCL_DEVICES=-1
  FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/none)
# Selection by index: one of two devices, and an index that matches none.
flux_opencl_env(select_one OpenCLEnv.SelectDevicesByIndex select_one "POCL_DEVICES=pthread pthread"
  FLUX_OPENCL_DEVICES=1 FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/none)
flux_opencl_env(select_none OpenCLEnv.SelectDevicesByIndex select_none FLUX_OPENCL_DEVICES=7
  FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/none)
# A preference naming OpenCL makes get_device() pick the PoCL device.
flux_opencl_env(preferred OpenCLEnv.PreferenceSelectsOpenCL preferred FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/opencl)

# The first-run note (issue 18): with an empty PoCL cache one info line says the first run compiles
# the kernels; the rerun on the cache it filled says nothing. Measured: ~3 s (two small programs cold).
set(FLUX_POCL_FIRST_RUN_DIR ${CMAKE_BINARY_DIR}/pocl-cache-first-run)
add_test(NAME opencl.first_compile_note COMMAND sh -c
  "rm -rf '${FLUX_POCL_FIRST_RUN_DIR}' && mkdir -p '${FLUX_POCL_FIRST_RUN_DIR}' && \
   FLUX_OPENCL_TEST_ENV=cold_cache '$<TARGET_FILE:flux_tests>' --gtest_filter=OpenCLEnv.FirstCompileSaysSoOnce && \
   FLUX_OPENCL_TEST_ENV=warm_cache '$<TARGET_FILE:flux_tests>' --gtest_filter=OpenCLEnv.FirstCompileSaysSoOnce")
set_tests_properties(opencl.first_compile_note PROPERTIES
  ENVIRONMENT "POCL_CACHE_DIR=${FLUX_POCL_FIRST_RUN_DIR};FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/none"
  FAIL_REGULAR_EXPRESSION "Running 0 tests|SKIPPED \\] OpenCLEnv"
  LABELS opencl
  TIMEOUT 300)

# The seeds' training loop on the preferred OpenCL device: exits non-zero unless the loss decreases.
if(TARGET seed_training_loop)
  add_test(NAME opencl.seed_training_loop COMMAND seed_training_loop 5)
  set_tests_properties(opencl.seed_training_loop PROPERTIES
    ENVIRONMENT "POCL_CACHE_DIR=${FLUX_POCL_CACHE_DIR};FLUX_PREFERENCES=${FLUX_OPENCL_PREFS}/opencl"
    FAIL_REGULAR_EXPRESSION "Falling back|Defaulting to CPU|loss did not decrease"
    LABELS "opencl;examples"
    TIMEOUT 300)
endif()
