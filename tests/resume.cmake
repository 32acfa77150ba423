# Resuming a killed run bit for bit (tests/resume/resume_run.cpp): on the CPU and OpenCL (and CUDA
# where a GPU is present), each a ctest entry; 77 = the device is missing (skipped).
add_executable(resume_run ${CMAKE_CURRENT_SOURCE_DIR}/resume/resume_run.cpp)
target_link_libraries(resume_run PRIVATE flux)
target_include_directories(resume_run PRIVATE ${CMAKE_SOURCE_DIR})
target_compile_options(resume_run PRIVATE ${FLUX_WARNINGS})
add_dependencies(flux_tests resume_run)
foreach(dev CPU OpenCL CUDA)
  add_test(NAME resume.${dev} COMMAND resume_run ${dev} WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(resume.${dev} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS resume
    ENVIRONMENT "POCL_CACHE_DIR=${CMAKE_BINARY_DIR}/pocl-cache")
endforeach()
