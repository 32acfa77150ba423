# PyTorch (Debian python3-torch) as the oracle for MultiHeadAttention and LayerNorm
# (tests/interop/attention_interop.{py,cpp}): nn.MultiheadAttention(batch_first=True) and nn.LayerNorm
# state_dicts load unchanged (also with kdim/vdim and with bias=False); self, causal and cross-attention
# outputs, the per-head attention weights, the causal input gradient and LayerNorm's output match
# (<= 1e-5 relative) on every test device (CPU, OpenCL:0).
# Exits 77 (skipped) without torch locally; with CI set, that is a failure.
add_executable(attention_interop ${CMAKE_CURRENT_SOURCE_DIR}/interop/attention_interop.cpp)
target_link_libraries(attention_interop PRIVATE flux GTest::gtest)
target_include_directories(attention_interop PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(attention_interop PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests attention_interop)

if(EXISTS /usr/bin/python3)
  set(FLUX_INTEROP_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with torch for the safetensors interop test")
else()
  find_program(FLUX_INTEROP_PYTHON NAMES python3)
endif()
if(FLUX_INTEROP_PYTHON)
  add_test(NAME attention_torch_interop
    COMMAND ${FLUX_INTEROP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/interop/attention_interop.py
            $<TARGET_FILE:attention_interop> ${CMAKE_CURRENT_BINARY_DIR}/attention-interop)
else()
  add_test(NAME attention_torch_interop
    COMMAND sh -c "echo 'SKIPPED: no python3 found (install python3-torch)'; [ -z \"$CI$FLUX_REQUIRE_INTEROP\" ] && exit 77; exit 1")
endif()
set_tests_properties(attention_torch_interop PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS interop)
