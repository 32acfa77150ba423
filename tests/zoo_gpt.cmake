# The Flux model zoo's GPT (examples/zoo/gpt.cpp, issue 32), run briefly on every device: 2 of its 6
# layers (otherwise the zoo's widths), batch 16, windows of 32; the program checks its parameter count
# against Flux's formula, and the validation loss (64 windows) must fall by at least 0.8 nats from the
# untrained model's 4.73. Measured on 2 cores: CPU 60 steps 4.73 -> 2.57 in ~3 s; OpenCL:0 (PoCL, ~0.5 s
# a step) 12 steps 4.73 -> 3.24 in ~9 s.
if(NOT TARGET zoo_gpt)
  return()
endif()
foreach(dev_steps CPU=60 OpenCL:0=12 CUDA:0=60)
  string(REGEX REPLACE "=.*" "" dev ${dev_steps})
  string(REGEX REPLACE ".*=" "" steps ${dev_steps})
  string(REPLACE ":" "_" label ${dev})
  add_test(NAME examples.zoo_gpt.${label}
           COMMAND zoo_gpt --device ${dev} --layers 2 --steps ${steps} --batchsize 16 --seq-len 32 --valid-windows 64
                   --sample 40 --min-drop 0.8)
  set_tests_properties(examples.zoo_gpt.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5
                       ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")
endforeach()
add_test(NAME examples.zoo_gpt.missing_data COMMAND zoo_gpt ${CMAKE_CURRENT_BINARY_DIR}/no-such-file.txt)
set_tests_properties(examples.zoo_gpt.missing_data PROPERTIES LABELS examples
                     PASS_REGULAR_EXPRESSION "data error: .*no-such-file\\.txt")
