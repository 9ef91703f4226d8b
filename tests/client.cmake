# Tests of libshardkv and the shardkv CLI (client/).
kv_add_test(test_client_json SOURCES test_client_json.c LIBS kv_cli kv_testutil TIMEOUT 30)
kv_add_test(test_client_cli SOURCES test_client_cli.c LIBS kv_cli kv_testutil TIMEOUT 30)
kv_add_test(test_client_batch SOURCES test_client_batch.c LIBS shardkv TIMEOUT 30)
# libshardkv and the CLI against an in-process fake controller and servers.
kv_add_test(test_client_fake SOURCES test_client_fake.c
  LIBS kv_cli kv_proto kv_testutil TIMEOUT 90 LABELS concurrency)
# The CLI and library against real daemons (built in this tree) on loopback.
if(TARGET shardkv-controller AND TARGET shardkv-server)
  # A controller and two servers as real processes, shared by the tests below.
  add_library(kv_two_node_cluster STATIC two_node_cluster.c)
  target_link_libraries(kv_two_node_cluster PUBLIC shardkv kv_testutil kv_flags)
  kv_add_test(test_client_cluster SOURCES test_client_cluster.c
    LIBS kv_cli kv_two_node_cluster TIMEOUT 180 LABELS integration)
  target_compile_definitions(test_client_cluster PRIVATE KV_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
  add_dependencies(test_client_cluster shardkv-controller shardkv-server shardkv_bin)
endif()
# shardkv bench: histogram, parsing, report shapes (no cluster); short runs
# against real daemons (the same source built with KV_BENCH_CLUSTER).
kv_add_test(test_client_bench SOURCES test_client_bench.c LIBS kv_cli kv_testutil TIMEOUT 60)
if(TARGET shardkv-controller AND TARGET shardkv-server)
  kv_add_test(test_client_bench_cluster SOURCES test_client_bench.c
    LIBS kv_cli kv_two_node_cluster TIMEOUT 120 LABELS integration)
  target_compile_definitions(test_client_bench_cluster PRIVATE KV_BENCH_CLUSTER
    KV_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
  add_dependencies(test_client_bench_cluster shardkv-controller shardkv-server)
endif()
