# Compile-failure tests: a struct holding tensors or layers that is not walkable (no FLUX_LAYER, or
# FLUX_LAYER outside the struct's namespace) must fail to compile where it is used as a layer, with
# the static_assert message of flux/functor.hpp; tensor-free callables must still compile. Each case
# is one syntax-only compile of tests/compile_fail/*.cpp (a few seconds), checked by check.cmake.
set(flux_compile_fail_flags "-std=c++20 -fsyntax-only -I${CMAKE_SOURCE_DIR}/include")
set(flux_compile_fail_cases chain gradient_of_aggregate namespace_rule device_move_of_field fmap
  optimisers_setup vector_of_layers template_in_chain template_unwalkable_field template_namespace_rule)
  # FLUX_CASE 1, 2, ... in unwalkable_layer.cpp
set(case_number 0)
foreach(case_name ${flux_compile_fail_cases})
  math(EXPR case_number "${case_number} + 1")
  add_test(NAME compile_fail.unwalkable_layer.${case_name}
    COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} "-DFLAGS=${flux_compile_fail_flags}"
            -DSOURCE=${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/unwalkable_layer.cpp -DCASE=${case_number}
            -DEXPECT=fail -P ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/check.cmake)
  set_tests_properties(compile_fail.unwalkable_layer.${case_name} PROPERTIES TIMEOUT 120)
endforeach()
add_test(NAME compile_fail.allowed_callables
  COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} "-DFLAGS=${flux_compile_fail_flags}"
          -DSOURCE=${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/allowed_callables.cpp -DEXPECT=pass
          -P ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/check.cmake)
set_tests_properties(compile_fail.allowed_callables PROPERTIES TIMEOUT 120)
# README snippets that are not whole programs elsewhere are compiled from the README itself.
add_test(NAME readme_snippet.your_own_layers
  COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} "-DFLAGS=${flux_compile_fail_flags} -Wall -Wextra -Werror"
          -DREADME=${CMAKE_SOURCE_DIR}/README.md "-DHEADING=## Your own layers"
          -DOUT=${CMAKE_CURRENT_BINARY_DIR}/readme_your_own_layers.cpp
          -P ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/readme_snippet.cmake)
set_tests_properties(readme_snippet.your_own_layers PROPERTIES TIMEOUT 120)
# Whole programs in the README (issue 18): compiled, linked against libflux and run (each in its own
# folder under the build tree; a non-zero exit fails). Measured: ~10 s each on 2 busy cores, mostly
# compiling flux.hpp at -O1.
set(flux_readme_run_flags "-std=c++20 -O1 -I${CMAKE_SOURCE_DIR}/include -Wall -Wextra -Werror")
foreach(entry "data_helpers|## Data helpers|${CMAKE_SOURCE_DIR}/data/digits.csv.gz"
              "saving_and_loading|## Saving and loading|"
              "versioninfo|## What is installed: versioninfo, memory_status, flux-info|")
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 name)
  list(GET parts 1 heading)
  list(GET parts 2 args)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/readme_${name})
  add_test(NAME readme_snippet.${name}
    COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} "-DFLAGS=${flux_readme_run_flags}"
            -DREADME=${CMAKE_SOURCE_DIR}/README.md "-DHEADING=${heading}"
            -DOUT=${CMAKE_CURRENT_BINARY_DIR}/readme_${name}/main.cpp -DRUN=ON
            "-DLIBS=$<TARGET_FILE:flux> -Wl,-rpath,$<TARGET_FILE_DIR:flux>" "-DARGS=${args}"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/readme_snippet.cmake)
  set_tests_properties(readme_snippet.${name} PROPERTIES TIMEOUT 300
    ENVIRONMENT "FLUX_PREFERENCES=${CMAKE_CURRENT_BINARY_DIR}/readme_${name}")
endforeach()
