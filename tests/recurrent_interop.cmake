# PyTorch (Debian python3-torch) as the oracle for the recurrent layers (tests/interop/recurrent_interop.{py,cpp}):
# torch.nn.LSTM / GRU / RNN (batch_first) and the three cells: their state_dicts load unchanged, outputs,
# final states and gradients match to 1e-5 on every device. Exits 77 (skipped) without torch locally; with CI set, a failure.
add_executable(recurrent_interop ${CMAKE_CURRENT_SOURCE_DIR}/interop/recurrent_interop.cpp)
target_link_libraries(recurrent_interop PRIVATE flux)
target_compile_options(recurrent_interop PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests recurrent_interop)

if(EXISTS /usr/bin/python3)
  set(FLUX_INTEROP_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with torch for the safetensors interop test")
else()
  find_program(FLUX_INTEROP_PYTHON NAMES python3)
endif()
if(FLUX_INTEROP_PYTHON)
  add_test(NAME recurrent_torch_interop
    COMMAND ${FLUX_INTEROP_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/interop/recurrent_interop.py
            $<TARGET_FILE:recurrent_interop> ${CMAKE_CURRENT_BINARY_DIR}/recurrent-interop)
else()
  add_test(NAME recurrent_torch_interop
    COMMAND sh -c "echo 'SKIPPED: no python3 found (install python3-torch)'; [ -z \"$CI$FLUX_REQUIRE_INTEROP\" ] && exit 77; exit 1")
endif()
set_tests_properties(recurrent_torch_interop PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS interop)
