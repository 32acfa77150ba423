# CPU kernels whose work split depends on the pool's size run again with a pool of 4 threads (more
# than CI's 2 cores): Winograd's small-batch splits (rows of tiles that cross images, one row of tiles
# on more threads than it has).
add_test(NAME cpu.winograd_pool_of_4 COMMAND flux_tests "--gtest_filter=CpuConv.Winograd*:CpuConv.ForwardChoice*")
set_tests_properties(cpu.winograd_pool_of_4 PROPERTIES TIMEOUT 600 ENVIRONMENT "FLUX_NUM_THREADS=4")
