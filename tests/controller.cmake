# Controller tests: placement and config log units, controllers in the test
# process on loopback ports, and the real shardkv-controller binary for its
# command line, exit codes and signals.
kv_add_test(test_controller_placement SOURCES test_controller_placement.c
  LIBS kv_controller TIMEOUT 30)
kv_add_test(test_controller_clog SOURCES test_controller_clog.c
  LIBS kv_controller kv_testutil TIMEOUT 30)
kv_add_test(test_controller_integration SOURCES test_controller_integration.c
  LIBS kv_controller kv_testutil TIMEOUT 240 LABELS integration concurrency)
target_compile_definitions(test_controller_integration PRIVATE
  KV_CONTROLLER_BIN="$<TARGET_FILE:shardkv-controller>")
add_dependencies(test_controller_integration shardkv-controller)
# The replicated controller's start-up (raft addresses, flags, a one-replica
# group), in process and through the binary.
kv_add_test(test_controller_replica SOURCES test_controller_replica.c
  LIBS kv_controller kv_testutil TIMEOUT 60)
target_compile_definitions(test_controller_replica PRIVATE
  KV_CONTROLLER_BIN="$<TARGET_FILE:shardkv-controller>")
add_dependencies(test_controller_replica shardkv-controller)
# Controllers inside the test process through their life cycle: restart on
# a data dir, stop with a held watch, refused starts, and a three-replica
# Raft group over loopback TCP.
kv_add_test(test_controller_inproc SOURCES test_controller_inproc.c
  LIBS kv_controller kv_testutil TIMEOUT 60 LABELS component concurrency)
