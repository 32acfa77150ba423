# tests/test_idx.cpp writes gzip files with zlib (the IDX reader in src/data/idx.cpp reads them).
find_package(ZLIB REQUIRED)
target_link_libraries(flux_tests PRIVATE ZLIB::ZLIB)
