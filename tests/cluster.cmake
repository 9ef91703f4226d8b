# End-to-end tests of a whole cluster: real shardkv-controller and
# shardkv-server processes on free loopback ports, driven through libshardkv
# and the `shardkv` binary. kv_cluster_util (cluster_util.h) starts, waits
# for and stops the processes; it knows the binaries from the definitions
# below, and every test depends on them so that `ctest` after a build always
# runs the current daemons.
if(TARGET shardkv-controller AND TARGET shardkv-server AND TARGET shardkv_bin)
  add_library(kv_cluster_util STATIC cluster_util.c)
  target_link_libraries(kv_cluster_util PUBLIC shardkv kv_testutil kv_flags)
  # kv_tc_raw_op() packs Requests itself: it needs the generated header (the
  # generated code and the rpc client are in libshardkv and kv_common).
  add_dependencies(kv_cluster_util kv_proto_generate)
  target_compile_definitions(kv_cluster_util PUBLIC
    KV_CONTROLLER_BIN="$<TARGET_FILE:shardkv-controller>"
    KV_SERVER_BIN="$<TARGET_FILE:shardkv-server>"
    KV_CLI_BIN="$<TARGET_FILE:shardkv_bin>")

  # kv_cluster_test(NAME TIMEOUT) for tests/NAME.c.
  function(kv_cluster_test name timeout)
    kv_add_test(${name} SOURCES ${name}.c LIBS kv_cluster_util TIMEOUT ${timeout}
      LABELS integration)
    add_dependencies(${name} shardkv-controller shardkv-server shardkv_bin)
  endfunction()

  kv_cluster_test(test_cluster_admin 90)
  kv_cluster_test(test_cluster_data 120)
  kv_cluster_test(test_client_async 120)
  set_property(TEST test_client_async APPEND PROPERTY LABELS concurrency)
  kv_cluster_test(test_cluster_moves 120)
  kv_cluster_test(test_cluster_controller 90)
  kv_cluster_test(test_cluster_batch 120)
  # Counts the threads it makes (pthread_create wrapped).
  target_link_options(test_cluster_batch PRIVATE -Wl,--wrap=pthread_create)
  kv_cluster_test(test_cluster_cli 90)
  kv_cluster_test(test_cluster_cancel 120)
  kv_cluster_test(test_cluster_dedup 120)
  # Three Raft controller replicas; the leader is killed during changes.
  kv_cluster_test(test_cluster_raft 240)
  # Migrations of values up to 64 MiB in slices; it also sends hand-made
  # transfer messages (kv_sc_xfer_encode), hence kv_server.
  kv_cluster_test(test_cluster_bigvalue 300)
  target_link_libraries(test_cluster_bigvalue PRIVATE kv_server)
  # The shared secret (--auth-token-file) on every binary; it also sends
  # hand-made transfer messages (kv_sc_xfer_encode_auth), hence kv_server.
  kv_cluster_test(test_cluster_auth 180)
  # TLS (--tls-*) on every binary, with a PKI made at run time by
  # tls_certs.sh (openssl); it also opens rpc clients itself, hence kv_common.
  kv_cluster_test(test_cluster_tls 180)
  target_compile_definitions(test_cluster_tls PRIVATE
    KV_TLS_CERTS_SH="${CMAKE_CURRENT_SOURCE_DIR}/tls_certs.sh")
  # --max-memory, --max-batch, --max-message and --max-connections.
  kv_cluster_test(test_server_limits 120)
  target_link_libraries(test_cluster_auth PRIVATE kv_server)
endif()
