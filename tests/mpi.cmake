# Data-parallel tests under mpirun (included by tests/CMakeLists.txt; issue 13). flux_mpi_tests runs
# with 2 ranks, with 3 on the 2 cores (--oversubscribe), and without mpirun (one rank); the fault
# entries kill or stall one rank and expect the others to end with a clear error within the
# timeout. One BLAS / PoCL thread per rank: the ranks share the 2 cores. Together ~40 s here.
find_program(FLUX_MPIRUN mpirun)
if(NOT FLUX_HAVE_MPI OR NOT FLUX_MPIRUN)
  return()
endif()

add_executable(flux_mpi_tests ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_mpi.cpp)
target_link_libraries(flux_mpi_tests PRIVATE flux GTest::gtest GTest::gmock)
target_include_directories(flux_mpi_tests PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(flux_mpi_tests PRIVATE ${FLUX_WARNINGS})
if(TARGET flux-opencl)
  add_dependencies(flux_mpi_tests flux-opencl)
endif()
add_executable(flux_mpi_fault ${CMAKE_CURRENT_SOURCE_DIR}/mpi/fault.cpp)
target_link_libraries(flux_mpi_fault PRIVATE flux)
target_compile_options(flux_mpi_fault PRIVATE ${FLUX_WARNINGS})

set(FLUX_MPI_ENV "OPENBLAS_NUM_THREADS=1;FLUX_NUM_THREADS=1;POCL_MAX_PTHREAD_COUNT=1;POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache;FLUX_DISTRIBUTED_TIMEOUT=30")
set(FLUX_MPIRUN_ARGS --allow-run-as-root -x OPENBLAS_NUM_THREADS -x FLUX_NUM_THREADS -x POCL_MAX_PTHREAD_COUNT -x POCL_CACHE_DIR)

add_test(NAME mpi.np2 COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 2 $<TARGET_FILE:flux_mpi_tests>)
add_test(NAME mpi.np3 COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 3 --oversubscribe $<TARGET_FILE:flux_mpi_tests>)
add_test(NAME mpi.without_mpirun COMMAND $<TARGET_FILE:flux_mpi_tests>)
set_tests_properties(mpi.np2 mpi.np3 mpi.without_mpirun PROPERTIES ENVIRONMENT "${FLUX_MPI_ENV}" TIMEOUT 300 LABELS mpi RUN_SERIAL TRUE
                     FAIL_REGULAR_EXPRESSION "FAILED|Running 0 tests")

# Sharded training (issue 47): parity with one process at np 2, 3 and 4 (oversubscribed) at stages 1 to
# 3, then a checkpoint written at np 4 loaded at np 2 and in one process (at stage 2, and at stage 3).
add_executable(flux_shard_tests ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_shard.cpp)
target_link_libraries(flux_shard_tests PRIVATE flux GTest::gtest GTest::gmock)
target_include_directories(flux_shard_tests PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(flux_shard_tests PRIVATE ${FLUX_WARNINGS})
if(TARGET flux-opencl)
  add_dependencies(flux_shard_tests flux-opencl)
endif()
add_test(NAME mpi.shard.np2 COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 2 $<TARGET_FILE:flux_shard_tests> --gtest_filter=-ShardCheckpoint.*)
add_test(NAME mpi.shard.np3 COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 3 --oversubscribe $<TARGET_FILE:flux_shard_tests> --gtest_filter=-ShardCheckpoint.*)
add_test(NAME mpi.shard.np4 COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 4 --oversubscribe $<TARGET_FILE:flux_shard_tests> --gtest_filter=-ShardCheckpoint.*)
add_test(NAME mpi.shard.without_mpirun COMMAND $<TARGET_FILE:flux_shard_tests> --gtest_filter=-ShardCheckpoint.*)
set(FLUX_SHARD_CKPT ${CMAKE_CURRENT_BINARY_DIR}/shard_checkpoint_np4)
add_test(NAME mpi.shard_checkpoint.save_np4 COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -x FLUX_SHARD_CHECKPOINT -x FLUX_SHARD_CHECKPOINT_MODE -np 4 --oversubscribe $<TARGET_FILE:flux_shard_tests> --gtest_filter=ShardCheckpoint.*)
add_test(NAME mpi.shard_checkpoint.resume_np2 COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -x FLUX_SHARD_CHECKPOINT -x FLUX_SHARD_CHECKPOINT_MODE -np 2 $<TARGET_FILE:flux_shard_tests> --gtest_filter=ShardCheckpoint.*)
add_test(NAME mpi.shard_checkpoint.resume_np1 COMMAND $<TARGET_FILE:flux_shard_tests> --gtest_filter=ShardCheckpoint.*)
set_tests_properties(mpi.shard.np2 mpi.shard.np3 mpi.shard.np4 mpi.shard.without_mpirun PROPERTIES ENVIRONMENT "${FLUX_MPI_ENV}"
                     TIMEOUT 300 LABELS mpi RUN_SERIAL TRUE FAIL_REGULAR_EXPRESSION "FAILED|Running 0 tests")
set_tests_properties(mpi.shard_checkpoint.save_np4 PROPERTIES FIXTURES_SETUP flux_shard_checkpoint
                     ENVIRONMENT "${FLUX_MPI_ENV};FLUX_SHARD_CHECKPOINT=${FLUX_SHARD_CKPT};FLUX_SHARD_CHECKPOINT_MODE=save")
set_tests_properties(mpi.shard_checkpoint.resume_np2 mpi.shard_checkpoint.resume_np1 PROPERTIES FIXTURES_REQUIRED flux_shard_checkpoint
                     ENVIRONMENT "${FLUX_MPI_ENV};FLUX_SHARD_CHECKPOINT=${FLUX_SHARD_CKPT};FLUX_SHARD_CHECKPOINT_MODE=resume")
set_tests_properties(mpi.shard_checkpoint.save_np4 mpi.shard_checkpoint.resume_np2 mpi.shard_checkpoint.resume_np1 PROPERTIES
                     TIMEOUT 120 LABELS mpi RUN_SERIAL TRUE FAIL_REGULAR_EXPRESSION "FAILED|Running 0 tests|SKIPPED")

# The same at stage 3: saved at np 4 (parameters sharded), loaded at np 2 (stage 3) and in one process.
set(FLUX_SHARD_CKPT3 ${CMAKE_CURRENT_BINARY_DIR}/shard_checkpoint_np4_stage3)
add_test(NAME mpi.shard_checkpoint.stage3_save_np4 COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -x FLUX_SHARD_CHECKPOINT -x FLUX_SHARD_CHECKPOINT_MODE -x FLUX_SHARD_CHECKPOINT_STAGE -np 4 --oversubscribe $<TARGET_FILE:flux_shard_tests> --gtest_filter=ShardCheckpoint.*)
add_test(NAME mpi.shard_checkpoint.stage3_resume_np2 COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -x FLUX_SHARD_CHECKPOINT -x FLUX_SHARD_CHECKPOINT_MODE -x FLUX_SHARD_CHECKPOINT_STAGE -np 2 $<TARGET_FILE:flux_shard_tests> --gtest_filter=ShardCheckpoint.*)
add_test(NAME mpi.shard_checkpoint.stage3_resume_np1 COMMAND $<TARGET_FILE:flux_shard_tests> --gtest_filter=ShardCheckpoint.*)
set_tests_properties(mpi.shard_checkpoint.stage3_save_np4 PROPERTIES FIXTURES_SETUP flux_shard_checkpoint3
                     ENVIRONMENT "${FLUX_MPI_ENV};FLUX_SHARD_CHECKPOINT=${FLUX_SHARD_CKPT3};FLUX_SHARD_CHECKPOINT_MODE=save;FLUX_SHARD_CHECKPOINT_STAGE=3")
set_tests_properties(mpi.shard_checkpoint.stage3_resume_np2 mpi.shard_checkpoint.stage3_resume_np1 PROPERTIES FIXTURES_REQUIRED flux_shard_checkpoint3
                     ENVIRONMENT "${FLUX_MPI_ENV};FLUX_SHARD_CHECKPOINT=${FLUX_SHARD_CKPT3};FLUX_SHARD_CHECKPOINT_MODE=resume;FLUX_SHARD_CHECKPOINT_STAGE=3")
set_tests_properties(mpi.shard_checkpoint.stage3_save_np4 mpi.shard_checkpoint.stage3_resume_np2 mpi.shard_checkpoint.stage3_resume_np1 PROPERTIES
                     TIMEOUT 120 LABELS mpi RUN_SERIAL TRUE FAIL_REGULAR_EXPRESSION "FAILED|Running 0 tests|SKIPPED")

# A model that does not fit one process under FLUX_CPU_MEMORY_LIMIT=20M (float32 Adam training of 8.4 MB
# of arrays) trains at np 4, stage 3, under the same per-process limit (15.3 MB peak per rank measured).
add_test(NAME mpi.shard_memory_limit.np1_plain_fails COMMAND $<TARGET_FILE:flux_shard_tests> --gtest_filter=ShardMemoryLimit.*)
set_tests_properties(mpi.shard_memory_limit.np1_plain_fails PROPERTIES
                     ENVIRONMENT "${FLUX_MPI_ENV};FLUX_CPU_MEMORY_LIMIT=20M;FLUX_SHARD_MEMORY_MODE=plain")
add_test(NAME mpi.shard_memory_limit.np4_stage3_trains COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -x FLUX_CPU_MEMORY_LIMIT -x FLUX_SHARD_MEMORY_MODE -np 4 --oversubscribe $<TARGET_FILE:flux_shard_tests> --gtest_filter=ShardMemoryLimit.*)
set_tests_properties(mpi.shard_memory_limit.np4_stage3_trains PROPERTIES
                     ENVIRONMENT "${FLUX_MPI_ENV};FLUX_CPU_MEMORY_LIMIT=20M;FLUX_SHARD_MEMORY_MODE=stage3")
set_tests_properties(mpi.shard_memory_limit.np1_plain_fails mpi.shard_memory_limit.np4_stage3_trains PROPERTIES
                     TIMEOUT 120 LABELS mpi RUN_SERIAL TRUE FAIL_REGULAR_EXPRESSION "FAILED|Running 0 tests|SKIPPED")

# Faults, with a 3 s timeout: each entry must end well inside its ctest TIMEOUT (no hang).
set(FLUX_MPI_FAULT_ENV "OPENBLAS_NUM_THREADS=1;FLUX_NUM_THREADS=1;FLUX_DISTRIBUTED_TIMEOUT=3")
# A rank that stops answering mid-run: rank 0 reports the timeout, then the job is aborted.
add_test(NAME mpi.fault.rank_hangs COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 2 $<TARGET_FILE:flux_mpi_fault> hang)
set_tests_properties(mpi.fault.rank_hangs PROPERTIES PASS_REGULAR_EXPRESSION
  "rank 0: error: \\[distributed::withgradient\\] no answer from the other ranks within 3 s: a rank died, hangs or never joined")
# A rank that never joins: rank 0's start-up gives up after the timeout.
add_test(NAME mpi.fault.rank_never_joins COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 2 $<TARGET_FILE:flux_mpi_fault> late)
set_tests_properties(mpi.fault.rank_never_joins PROPERTIES PASS_REGULAR_EXPRESSION
  "\\[distributed::initialize\\] MPI start-up did not complete within 3 s: a rank died or never joined")
# A rank killed mid-run (SIGKILL): the job ends, mpirun naming the dead rank (or rank 0 its timeout).
add_test(NAME mpi.fault.rank_killed COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 2 $<TARGET_FILE:flux_mpi_fault> kill)
set_tests_properties(mpi.fault.rank_killed PROPERTIES PASS_REGULAR_EXPRESSION
  "rank 1 with PID [0-9]+ on node [^ ]+ exited on signal 9|no answer from the other ranks within 3 s")
# The same in sharded training (stage 2): the gradient reduce-scatter reports the missing rank.
add_test(NAME mpi.fault.shard_rank_hangs COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 2 $<TARGET_FILE:flux_mpi_fault> shard-hang)
set_tests_properties(mpi.fault.shard_rank_hangs PROPERTIES PASS_REGULAR_EXPRESSION
  "rank 0: error: \\[distributed::withgradient\\] no answer from the other ranks within 3 s: a rank died, hangs or never joined")
# At stage 3 the first collective of a step is the first layer's all-gather in the forward.
add_test(NAME mpi.fault.shard3_rank_hangs COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -x FLUX_DISTRIBUTED_TIMEOUT -np 2 $<TARGET_FILE:flux_mpi_fault> shard3-hang)
set_tests_properties(mpi.fault.shard3_rank_hangs PROPERTIES PASS_REGULAR_EXPRESSION
  "rank 0: error: \\[distributed::withgradient\\] no answer from the other ranks within 3 s: a rank died, hangs or never joined")
set_tests_properties(mpi.fault.rank_hangs mpi.fault.rank_never_joins mpi.fault.rank_killed mpi.fault.shard_rank_hangs
                     mpi.fault.shard3_rank_hangs PROPERTIES
  ENVIRONMENT "${FLUX_MPI_FAULT_ENV}" TIMEOUT 45 LABELS mpi)

# The example under mpirun: 2 ranks, 4,000 images, one epoch (~3 s of training here; 0.755 measured).
if(TARGET distributed_mnist)
  add_test(NAME examples.distributed_mnist.np2
           COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -np 2 $<TARGET_FILE:distributed_mnist> --epochs 1
                   --train-limit 4000 --test-limit 1000 --min-accuracy 0.65
                   --save ${CMAKE_CURRENT_BINARY_DIR}/distributed_mnist.safetensors)
  set_tests_properties(examples.distributed_mnist.np2 PROPERTIES ENVIRONMENT "${FLUX_MPI_ENV}" TIMEOUT 300
                       LABELS "mpi;examples" RUN_SERIAL TRUE PASS_REGULAR_EXPRESSION "test accuracy: 0\\.[6-9]"
                       FAIL_REGULAR_EXPRESSION "below --min-accuracy|error")
endif()

# The sharded GPT (issue 47): 4 ranks at stage 3 train and save a checkpoint, 2 ranks resume it and
# train on; each exits 1 unless the validation loss falls by --min-drop.
if(TARGET sharded_gpt)
  set(FLUX_SHARDED_GPT_CKPT ${CMAKE_CURRENT_BINARY_DIR}/sharded_gpt_ckpt)
  add_test(NAME examples.sharded_gpt.np4_stage3
           COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -np 4 --oversubscribe $<TARGET_FILE:sharded_gpt> --stage 3 --steps 60
                   --batchsize 8 --min-drop 0.3 --save ${FLUX_SHARDED_GPT_CKPT})
  add_test(NAME examples.sharded_gpt.resume_np2
           COMMAND ${FLUX_MPIRUN} ${FLUX_MPIRUN_ARGS} -np 2 $<TARGET_FILE:sharded_gpt> --stage 3 --steps 30 --batchsize 16
                   --min-drop 0.02 --resume ${FLUX_SHARDED_GPT_CKPT})
  set_tests_properties(examples.sharded_gpt.np4_stage3 PROPERTIES FIXTURES_SETUP flux_sharded_gpt)
  set_tests_properties(examples.sharded_gpt.resume_np2 PROPERTIES FIXTURES_REQUIRED flux_sharded_gpt
                       PASS_REGULAR_EXPRESSION "resumed from .* at step 60")
  set_tests_properties(examples.sharded_gpt.np4_stage3 examples.sharded_gpt.resume_np2 PROPERTIES ENVIRONMENT "${FLUX_MPI_ENV}"
                       TIMEOUT 300 LABELS "mpi;examples" RUN_SERIAL TRUE FAIL_REGULAR_EXPRESSION "error|less than --min-drop")
endif()
