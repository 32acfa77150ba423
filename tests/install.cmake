# Installs flux into a scratch prefix and builds an out-of-tree consumer against it.
add_test(NAME install_consumer
  COMMAND bash ${CMAKE_SOURCE_DIR}/tests/consumer/run.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
set_tests_properties(install_consumer PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
