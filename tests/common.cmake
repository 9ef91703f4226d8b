# Common library tests.
add_library(kv_testutil STATIC testutil.c)
target_link_libraries(kv_testutil PUBLIC kv_flags)
kv_add_test(test_rpc SOURCES test_rpc.c LIBS kv_testutil TIMEOUT 60 LABELS concurrency)
kv_add_test(test_auth SOURCES test_auth.c LIBS kv_testutil TIMEOUT 30)
