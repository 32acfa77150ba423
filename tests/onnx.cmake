# ONNX export checked by real clients (tests/onnx/): flux-cpp exports an MLP, LeNet, ResNet-18, the
# char LSTM and the tiny transformer with onnx::save (traced on the CPU, and on OpenCL:0 where built);
#   onnx_export.ort.<device>  ONNX Runtime (PyPI, in build/onnx-venv, made by tests/onnx/ensure_venv.sh)
#                             reproduces flux's outputs within 1e-5 at batch 2 and 3 (a dynamic batch axis)
#   onnx_export.checker       Debian's python3-onnx: onnx.checker.check_model(full_check=True) on each file
# Without ONNX in the build (FLUX_ONNX) there are no such tests. Skipped (77) without PyPI / python3-onnx,
# failed instead with CI set.
if(NOT flux_have_onnx)
  return()
endif()
add_executable(onnx_export_models ${CMAKE_CURRENT_SOURCE_DIR}/onnx/onnx_export_models.cpp)
target_link_libraries(onnx_export_models PRIVATE flux)
target_compile_options(onnx_export_models PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests onnx_export_models)

# The unit tests (tests/onnx/test_*.cpp, on every test device) read the written files back with ONNX's
# own protobuf classes, so they are a binary of their own, linked with libonnx_proto.
file(GLOB flux_onnx_test_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/onnx/test_*.cpp)
add_executable(onnx_tests ${flux_onnx_test_sources})
target_link_libraries(onnx_tests PRIVATE flux GTest::gtest GTest::gtest_main onnx_proto protobuf::libprotobuf)
target_include_directories(onnx_tests PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(onnx_tests PRIVATE ${FLUX_WARNINGS})
target_compile_definitions(onnx_tests PRIVATE FLUX_SOURCE_DIR="${CMAKE_SOURCE_DIR}" FLUX_BINARY_DIR="${CMAKE_BINARY_DIR}")
add_dependencies(flux_tests onnx_tests)
gtest_discover_tests(onnx_tests DISCOVERY_TIMEOUT 120 PROPERTIES TIMEOUT 600 LABELS onnx
  ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")

set(FLUX_ONNX_VENV ${CMAKE_BINARY_DIR}/onnx-venv)
set(flux_onnx_devices CPU)
if(TARGET flux-opencl)
  list(APPEND flux_onnx_devices OpenCL:0)
endif()
foreach(device ${flux_onnx_devices})
  string(REPLACE ":" "" tag ${device})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/onnx-export-${tag})
  add_test(NAME onnx_export.ort.${tag}
    COMMAND sh -c "rm -rf '${out}' && mkdir -p '${out}' && '$<TARGET_FILE:onnx_export_models>' '${out}' '${device}' || exit $?; \
py=$('${CMAKE_CURRENT_SOURCE_DIR}/onnx/ensure_venv.sh' '${FLUX_ONNX_VENV}') || exit $?; \
\"$py\" '${CMAKE_CURRENT_SOURCE_DIR}/onnx/ort_check.py' '${out}'")
  set_tests_properties(onnx_export.ort.${tag} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS onnx
    ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")
endforeach()
# onnx_export.examples.<device>: every model of examples/ (and examples/zoo/) exported from that device and
# run by ONNX Runtime at batch 2 and 5, and at two sequence lengths where the model reads sequences.
foreach(device ${flux_onnx_devices})
  string(REPLACE ":" "" tag ${device})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/onnx-export-examples-${tag})
  add_test(NAME onnx_export.examples.${tag}
    COMMAND sh -c "rm -rf '${out}' && mkdir -p '${out}' && '$<TARGET_FILE:onnx_export_models>' '${out}' '${device}' examples || exit $?; \
py=$('${CMAKE_CURRENT_SOURCE_DIR}/onnx/ensure_venv.sh' '${FLUX_ONNX_VENV}') || exit $?; \
\"$py\" '${CMAKE_CURRENT_SOURCE_DIR}/onnx/ort_check.py' '${out}'")
  set_tests_properties(onnx_export.examples.${tag} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "onnx;examples"
    ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")
endforeach()
# The checker reads the CPU export's files.
add_test(NAME onnx_export.checker
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/onnx/onnx_check.py ${CMAKE_CURRENT_BINARY_DIR}/onnx-export-CPU)
set_tests_properties(onnx_export.checker PROPERTIES SKIP_RETURN_CODE 77 DEPENDS onnx_export.ort.CPU LABELS onnx)

# ONNX import checked against PyTorch (Debian python3-torch 1.13, system Python): tests/onnx/torch_models.py
# exports torchvision resnet18 and mobilenet_v2, an LSTM, a GRU and a TransformerEncoder at opset 17;
# onnx_import_check runs them on every test device (<= 1e-5 of PyTorch's outputs), one SGD step of the
# imported resnet18 against PyTorch's, and exports each imported model again for ONNX Runtime (round trip).
add_executable(onnx_import_check ${CMAKE_CURRENT_SOURCE_DIR}/onnx/onnx_import_check.cpp)
target_link_libraries(onnx_import_check PRIVATE flux GTest::gtest)
target_include_directories(onnx_import_check PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(onnx_import_check PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests onnx_import_check)
set(torch_dir ${CMAKE_CURRENT_BINARY_DIR}/onnx-import-torch)
set(rt_dir ${CMAKE_CURRENT_BINARY_DIR}/onnx-import-roundtrip)
add_test(NAME onnx_import.torch
  COMMAND sh -c "rm -rf '${torch_dir}' '${rt_dir}' && mkdir -p '${torch_dir}' '${rt_dir}' && \
/usr/bin/python3 '${CMAKE_CURRENT_SOURCE_DIR}/onnx/torch_models.py' '${torch_dir}' || exit $?; \
'$<TARGET_FILE:onnx_import_check>' '${torch_dir}' '${rt_dir}' || exit $?; \
py=$('${CMAKE_CURRENT_SOURCE_DIR}/onnx/ensure_venv.sh' '${FLUX_ONNX_VENV}') || exit $?; \
\"$py\" '${CMAKE_CURRENT_SOURCE_DIR}/onnx/ort_check.py' '${rt_dir}'")
set_tests_properties(onnx_import.torch PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "onnx;interop"
  ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")

# onnx_compare DIR: every DIR/NAME.onnx against the outputs in DIR/NAME.safetensors, on every device.
add_executable(onnx_compare ${CMAKE_CURRENT_SOURCE_DIR}/onnx/onnx_compare.cpp)
target_link_libraries(onnx_compare PRIVATE flux GTest::gtest)
target_include_directories(onnx_compare PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(onnx_compare PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests onnx_compare)
# onnx_import.ops: one small model per operator form (opsets 11 to 21), ONNX Runtime as the oracle
# (tests/onnx/op_cases.py in the venv).
set(ops_dir ${CMAKE_CURRENT_BINARY_DIR}/onnx-import-ops)
add_test(NAME onnx_import.ops
  COMMAND sh -c "rm -rf '${ops_dir}' && mkdir -p '${ops_dir}' && \
py=$('${CMAKE_CURRENT_SOURCE_DIR}/onnx/ensure_venv.sh' '${FLUX_ONNX_VENV}') || exit $?; \
\"$py\" '${CMAKE_CURRENT_SOURCE_DIR}/onnx/op_cases.py' '${ops_dir}' || exit $?; \
'$<TARGET_FILE:onnx_compare>' '${ops_dir}'")
set_tests_properties(onnx_import.ops PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS onnx
  ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")

# onnx_import.torch113: held-out models exported by Debian's torch 1.13 at opset 17
# (tests/onnx/torch113_heldout.py, system Python): PyTorch's outputs within 1e-5 of their scale.
set(t113_dir ${CMAKE_CURRENT_BINARY_DIR}/onnx-import-torch113)
add_test(NAME onnx_import.torch113
  COMMAND sh -c "rm -rf '${t113_dir}' && mkdir -p '${t113_dir}' && \
/usr/bin/python3 '${CMAKE_CURRENT_SOURCE_DIR}/onnx/torch113_heldout.py' '${t113_dir}' || exit $?; \
'$<TARGET_FILE:onnx_compare>' '${t113_dir}'")
set_tests_properties(onnx_import.torch113 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "onnx;interop"
  FIXTURES_SETUP onnx_torch113_files ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")
# onnx_import.opset20: the same files rewritten as today's exporters write them (ONNX's version
# converter to opset 20, IR 10, weights in NAME.onnx.data: tests/onnx/upgrade_models.py in the venv),
# ONNX Runtime's outputs as the oracle. PyPI's torch 2.x wheels need the CUDA libraries (gigabytes)
# even to import on a CPU, which CI cannot afford; this covers their file format instead.
set(o20_dir ${CMAKE_CURRENT_BINARY_DIR}/onnx-import-opset20)
add_test(NAME onnx_import.opset20
  COMMAND sh -c "rm -rf '${o20_dir}' && mkdir -p '${o20_dir}' && \
py=$('${CMAKE_CURRENT_SOURCE_DIR}/onnx/ensure_venv.sh' '${FLUX_ONNX_VENV}') || exit $?; \
\"$py\" '${CMAKE_CURRENT_SOURCE_DIR}/onnx/upgrade_models.py' '${t113_dir}' '${o20_dir}' 20 || exit $?; \
'$<TARGET_FILE:onnx_compare>' '${o20_dir}'")
set_tests_properties(onnx_import.opset20 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "onnx;interop"
  FIXTURES_REQUIRED onnx_torch113_files ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")

# onnx_import.torch2: today's PyTorch (2.x from PyPI, in build/torch2-venv: tests/onnx/ensure_torch2_venv.sh;
# TORCH2_VENV=/path reuses a venv holding torch 2.x) exports the coverage models by both of its exporters
# (dynamo=True with onnxscript, and dynamo=False): tests/onnx/torch2_models.py, files kept across runs
# while the scripts and torch's version stay the same. onnx_compare checks PyTorch's outputs on every
# device, and one SGD step against PyTorch's.
set(t2_dir ${CMAKE_CURRENT_BINARY_DIR}/onnx-import-torch2)
add_test(NAME onnx_import.torch2
  COMMAND sh -c "py=$('${CMAKE_CURRENT_SOURCE_DIR}/onnx/ensure_torch2_venv.sh' '${CMAKE_BINARY_DIR}/torch2-venv') || exit $?; \
\"$py\" '${CMAKE_CURRENT_SOURCE_DIR}/onnx/torch2_models.py' '${t2_dir}' || exit $?; failed=0; \
for e in dynamo torchscript; do '$<TARGET_FILE:onnx_compare>' '${t2_dir}/'$e || failed=1; done; exit $failed")
set_tests_properties(onnx_import.torch2 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1800 LABELS "onnx;interop"
  ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")

# onnx_import.large (label onnx_large): torchvision's large architectures (LARGE in tests/onnx/torch113_heldout.py:
# alexnet, vgg, resnet50-class, efficientnet_v2, vit_b_16, swin v1/v2, maxvit, fcn/deeplabv3 resnet50) by
# torch 1.13 and both torch 2.x exporters, outputs on every device (no fine-tuning step: FLUX_ONNX_NO_STEP).
# Most of an hour on two cores and gigabytes of files, so skipped (77) unless FLUX_ONNX_LARGE=1:
# `FLUX_ONNX_LARGE=1 ctest -L onnx_large` (the README's table says which rows it measured).
set(large_dir ${CMAKE_CURRENT_BINARY_DIR}/onnx-import-large)
add_test(NAME onnx_import.large
  COMMAND sh -c "[ -n \"\$FLUX_ONNX_LARGE\" ] || { echo 'SKIPPED: set FLUX_ONNX_LARGE=1 to run'; exit 77; }; \
mkdir -p '${large_dir}/torch113' && /usr/bin/python3 '${CMAKE_CURRENT_SOURCE_DIR}/onnx/torch113_heldout.py' '${large_dir}/torch113' LARGE || exit $?; \
py=$('${CMAKE_CURRENT_SOURCE_DIR}/onnx/ensure_torch2_venv.sh' '${CMAKE_BINARY_DIR}/torch2-venv') || exit $?; \
\"$py\" '${CMAKE_CURRENT_SOURCE_DIR}/onnx/torch2_models.py' '${large_dir}' LARGE || exit $?; failed=0; \
for e in torch113 dynamo torchscript; do '$<TARGET_FILE:onnx_compare>' '${large_dir}/'$e || failed=1; done; exit $failed")
set_tests_properties(onnx_import.large PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 7200 LABELS "onnx_large"
  ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache;FLUX_ONNX_NO_STEP=1")

# examples/onnx_roundtrip.cpp: trains, exports, imports, compares; ONNX Runtime through the test venv.
if(TARGET onnx_roundtrip)
  set(ex_dir ${CMAKE_CURRENT_BINARY_DIR}/onnx-roundtrip-example)
  add_test(NAME examples.onnx_roundtrip
    COMMAND sh -c "mkdir -p '${ex_dir}' && py=$('${CMAKE_CURRENT_SOURCE_DIR}/onnx/ensure_venv.sh' '${FLUX_ONNX_VENV}'); \
'$<TARGET_FILE:onnx_roundtrip>' --out '${ex_dir}' \${py:+--ort \"$py\"}")
  set_tests_properties(examples.onnx_roundtrip PROPERTIES TIMEOUT 300 LABELS "examples;onnx")
endif()
