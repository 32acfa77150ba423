# Issue 32 (porting Flux programs): activations by their plain names in a Chain beside <cmath>.
# Case 1 must compile; case 2 (<cmath>'s tanh without `using namespace flux`) must fail with flux's
# static_assert naming flux::tanh. One syntax-only compile each (a few seconds).
set(flux_porting_flags "-std=c++20 -fsyntax-only -Wall -Wextra -Werror -I${CMAKE_SOURCE_DIR}/include")
add_test(NAME compile_fail.chain_activation_names.plain_tanh_beside_cmath
  COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} "-DFLAGS=${flux_porting_flags}"
          -DSOURCE=${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/chain_activation_names.cpp -DCASE=1 -DEXPECT=pass
          -P ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/check_message.cmake)
add_test(NAME compile_fail.chain_activation_names.cmath_tanh_says_flux_tanh
  COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER} "-DFLAGS=${flux_porting_flags}"
          -DSOURCE=${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/chain_activation_names.cpp -DCASE=2 -DEXPECT=fail
          "-DMESSAGE=static assertion failed: flux: a Chain element cannot be called on a flux::Tensor[^\n]*use flux's activation, flux::tanh"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/check_message.cmake)
set_tests_properties(compile_fail.chain_activation_names.plain_tanh_beside_cmath
                     compile_fail.chain_activation_names.cmath_tanh_says_flux_tanh PROPERTIES TIMEOUT 120)
