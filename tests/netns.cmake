# A cluster spread over network namespaces (one per host, veth pairs on a
# bridge, addresses 10.77.0.x inside the namespaces only) under link loss,
# netem delay and loss, and a partition during a migration, checked by
# shardkv-checker (tests/test_netns_faults.c). Needs root; it skips with the
# reason otherwise. Label "netns"; KV_NETNS_DURATION=S runs it longer by hand.
if(TARGET shardkv-controller AND TARGET shardkv-server AND TARGET shardkv-checker)
  add_library(kv_netns_util STATIC netns_util.c)
  target_link_libraries(kv_netns_util PUBLIC kv_testutil kv_flags)
  kv_add_test(test_netns_faults SOURCES test_netns_faults.c
    LIBS shardkv kv_netns_util TIMEOUT 300 LABELS integration netns)
  # Without root or namespaces it exits 77: ctest reports it as skipped.
  set_tests_properties(test_netns_faults PROPERTIES SKIP_RETURN_CODE 77)
  target_compile_definitions(test_netns_faults PRIVATE
    KV_CONTROLLER_BIN="$<TARGET_FILE:shardkv-controller>"
    KV_SERVER_BIN="$<TARGET_FILE:shardkv-server>"
    KV_CHECKER_BIN="$<TARGET_FILE:shardkv-checker>")
  add_dependencies(test_netns_faults shardkv-controller shardkv-server shardkv-checker)
endif()
