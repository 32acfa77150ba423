# flux-tune end to end (included by tests/CMakeLists.txt): the MLP tuned at two pool sizes, one child
# process each, into a fresh table that both add to; its bf16 training step's sites timed; bad
# arguments and an unwritable table fail.
add_dependencies(flux_tests flux-tune)
set(FLUX_TUNE_TEST_DIR ${CMAKE_CURRENT_BINARY_DIR}/flux-tune)
file(MAKE_DIRECTORY ${FLUX_TUNE_TEST_DIR})
add_test(NAME flux_tune.mlp COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tune/flux_tune_mlp.sh
  $<TARGET_FILE:flux-tune> ${FLUX_TUNE_TEST_DIR}/flux-kernels.tsv)
add_test(NAME flux_tune.mlp_bf16 COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tune/flux_tune_bf16.sh $<TARGET_FILE:flux-tune>)
add_test(NAME flux_tune.bad_argument COMMAND $<TARGET_FILE:flux-tune> mlp --batch 0)
add_test(NAME flux_tune.bad_autocast COMMAND $<TARGET_FILE:flux-tune> mlp --autocast f8)
add_test(NAME flux_tune.unknown_model COMMAND $<TARGET_FILE:flux-tune> vgg)
add_test(NAME flux_tune.unwritable COMMAND $<TARGET_FILE:flux-tune> mlp --batch 1
  --output ${FLUX_TUNE_TEST_DIR}/missing/flux-kernels.tsv)
set_tests_properties(flux_tune.bad_argument flux_tune.bad_autocast flux_tune.unknown_model flux_tune.unwritable
  PROPERTIES WILL_FAIL TRUE)
