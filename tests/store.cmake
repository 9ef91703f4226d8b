# Tests of the local store (shardserver/store/store.h). Every semantic test runs in
# striped and percore mode, with one partition and with several
# (run_store_groups in test_store_util.c loops over the configurations). The
# concurrency programs also run under ThreadSanitizer in CI (label
# "concurrency"); each is sized to stay under a minute there on two cores.
add_library(kv_store_testutil STATIC test_store_util.c)
target_include_directories(kv_store_testutil PUBLIC ${CMOCKA_INCLUDE_DIRS})
target_link_libraries(kv_store_testutil PUBLIC kv_store kv_common kv_flags Threads::Threads
  ${CMOCKA_LIBRARIES})

kv_add_test(test_store SOURCES test_store.c LIBS kv_store_testutil TIMEOUT 60)
kv_add_test(test_store_scan SOURCES test_store_scan.c LIBS kv_store_testutil TIMEOUT 60)
kv_add_test(test_store_concurrency SOURCES test_store_concurrency.c LIBS kv_store_testutil
  TIMEOUT 120 LABELS concurrency)
kv_add_test(test_store_append SOURCES test_store_append.c LIBS kv_store_testutil
  TIMEOUT 120 LABELS concurrency)
kv_add_test(test_store_model SOURCES test_store_model.c LIBS kv_store TIMEOUT 120)
