# Common library tests.
add_library(kv_testutil STATIC testutil.c)
target_link_libraries(kv_testutil PUBLIC kv_flags)
kv_add_test(test_rpc SOURCES test_rpc.c LIBS kv_testutil TIMEOUT 60 LABELS concurrency)
kv_add_test(test_auth SOURCES test_auth.c LIBS kv_testutil TIMEOUT 30)
# TLS files, rules and request/reply over tls+tcp:// (certificates made by
# tls_certs.sh with openssl; those tests skip without it).
kv_add_test(test_tls SOURCES test_tls.c LIBS kv_testutil TIMEOUT 60)
target_compile_definitions(test_tls PRIVATE
  KV_TLS_CERTS_SH="${CMAKE_CURRENT_SOURCE_DIR}/tls_certs.sh")
# The on-disk framing shared by the log, snapshots and the config log.
kv_add_test(test_frame SOURCES test_frame.c TIMEOUT 30)
