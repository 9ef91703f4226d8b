# Tests of the shard server (shardserver/server.h and its modules).
# test_server_units: the pure modules (owner table, dedup table, codec).
# test_server_integration: starts the real shardkv-server binary against a
# fake controller that lives in the test process (tests/fake_ctl.c).
# test_server_inproc: servers run inside the test process through their
# life cycle (server.h) against the same fake controller.
kv_add_test(test_server_units SOURCES test_server_units.c LIBS kv_server TIMEOUT 60)
kv_add_test(test_server_integration SOURCES test_server_integration.c fake_ctl.c srv_client.c
  LIBS kv_server kv_testutil TIMEOUT 400 LABELS integration concurrency)
target_compile_definitions(test_server_integration PRIVATE
  KV_SERVER_BIN="$<TARGET_FILE:shardkv-server>")
add_dependencies(test_server_integration shardkv-server)
kv_add_test(test_server_inproc SOURCES test_server_inproc.c fake_ctl.c srv_client.c
  LIBS kv_server kv_testutil TIMEOUT 60 LABELS component concurrency)

# test_server_metrics: a real controller and server with --metrics, scraped
# over a plain socket (counters, text format, hostile requests, bad address).
kv_add_test(test_server_metrics SOURCES test_server_metrics.c
  LIBS shardkv kv_testutil TIMEOUT 120 LABELS integration)
target_compile_definitions(test_server_metrics PRIVATE
  KV_SERVER_BIN="$<TARGET_FILE:shardkv-server>"
  KV_CONTROLLER_BIN="$<TARGET_FILE:shardkv-controller>")
add_dependencies(test_server_metrics shardkv-server shardkv-controller)
