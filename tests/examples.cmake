# The examples run as tests (included by tests/CMakeLists.txt). Each is short: the seeds' loop exits
# non-zero unless its loss decreases; digits_mlp exits non-zero unless the test accuracy reaches 0.96.
if(TARGET seed_training_loop)
  add_test(NAME examples.seed_training_loop COMMAND seed_training_loop 5)
  set_tests_properties(examples.seed_training_loop PROPERTIES TIMEOUT 120 LABELS examples)
endif()

if(TARGET digits_mlp)
  set(FLUX_DIGITS_DATA ${PROJECT_SOURCE_DIR}/data/digits.csv.gz)

  # The best available device (get_device()), as ./scripts/demo runs it.
  add_test(NAME examples.digits_mlp COMMAND digits_mlp --min-accuracy 0.96 ${FLUX_DIGITS_DATA})
  set_tests_properties(examples.digits_mlp PROPERTIES TIMEOUT 300 LABELS examples)

  # Each device explicitly; exit status 5 (the device is not available here) counts as skipped.
  foreach(dev CPU OpenCL:0 CUDA:0)
    string(REPLACE ":" "_" name ${dev})
    add_test(NAME examples.digits_mlp.${name}
             COMMAND digits_mlp --device ${dev} --min-accuracy 0.96 ${FLUX_DIGITS_DATA})
    set_tests_properties(examples.digits_mlp.${name} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()

  # Bad input: a clear message, no crash.
  add_test(NAME examples.digits_mlp.missing_data COMMAND digits_mlp ${CMAKE_CURRENT_BINARY_DIR}/no-such-file.csv.gz)
  set_tests_properties(examples.digits_mlp.missing_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: cannot open .*no-such-file\\.csv\\.gz.: no such file")
  add_test(NAME examples.digits_mlp.corrupt_data COMMAND digits_mlp ${PROJECT_SOURCE_DIR}/data/LICENSE-digits)
  set_tests_properties(examples.digits_mlp.corrupt_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: .*LICENSE-digits. line 1: field 1 is")
endif()
