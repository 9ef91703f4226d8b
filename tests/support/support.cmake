# Helpers the tests link; README.md beside this file says which serves what.
# Process handling itself (spawn, readiness, stop, reap, kill-all on every
# exit path, free ports) is common/proc.h (library kv_proc), which
# shardkv-checker links too.

# Free ports, clocks, scratch directories (every layer).
add_library(kv_testutil STATIC support/testutil.c support/http_client.c)
target_link_libraries(kv_testutil PUBLIC kv_proc kv_flags)

# The one fake controller (fake_ctl.h): configurations published by the
# test, watch, registration, heartbeats, migration reports (with the fence
# hold), and the admin commands of clients and the CLI; and a tiny client
# that sends raw Requests to a server (srv_client.h).
add_library(kv_fake_ctl STATIC support/fake_ctl.c support/srv_client.c)
target_include_directories(kv_fake_ctl PUBLIC ${CMOCKA_INCLUDE_DIRS})
target_link_libraries(kv_fake_ctl PUBLIC kv_proto kv_common kv_testutil kv_flags)
# The shardkv CLI run inside the test process with its output captured
# (cli_run.h).
add_library(kv_cli_run STATIC support/cli_run.c)
target_link_libraries(kv_cli_run PUBLIC kv_cli kv_flags)

# Raw AdminRequests to a real controller (ctl_client.h), for the
# controller tests.
add_library(kv_ctl_client STATIC support/ctl_client.c)
target_link_libraries(kv_ctl_client PUBLIC kv_proto kv_common kv_flags)
# Shard servers inside the test process against that fake (inproc_srv.h).
add_library(kv_inproc_srv STATIC support/inproc_srv.c)
target_link_libraries(kv_inproc_srv PUBLIC kv_server kv_fake_ctl kv_testutil kv_flags)
# A real controller with short leases and real servers inside the test
# process, and what the liveness and failover tests ask of them: the
# configuration, /metrics, node states, the CLI (inproc_cluster.h).
add_library(kv_inproc_cluster STATIC support/inproc_cluster.c)
target_link_libraries(kv_inproc_cluster PUBLIC kv_controller kv_inproc_srv kv_cli_run kv_proto
  kv_testutil kv_flags)

# Store fixtures: every semantic store test runs in striped and percore mode,
# with one partition and with several (run_store_groups in store_util.c).
add_library(kv_store_testutil STATIC support/store_util.c)
target_include_directories(kv_store_testutil PUBLIC ${CMOCKA_INCLUDE_DIRS})
target_link_libraries(kv_store_testutil PUBLIC kv_store kv_common kv_flags Threads::Threads
  ${CMOCKA_LIBRARIES})

if(TARGET shardkv-controller AND TARGET shardkv-server AND TARGET shardkv_bin)
  # A real cluster (cluster_util.h): shardkv-controller and shardkv-server
  # processes on free loopback ports, driven through libshardkv and the
  # `shardkv` binary. It knows the binaries from the definitions below.
  add_library(kv_cluster_util STATIC support/cluster_util.c)
  target_link_libraries(kv_cluster_util PUBLIC shardkv kv_ctl_client kv_testutil kv_flags)
  # kv_tc_raw_op() packs Requests itself: it needs the generated header (the
  # generated code and the rpc client are in libshardkv and kv_common).
  add_dependencies(kv_cluster_util kv_proto_generate)
  target_compile_definitions(kv_cluster_util PUBLIC
    KV_CONTROLLER_BIN="$<TARGET_FILE:shardkv-controller>"
    KV_SERVER_BIN="$<TARGET_FILE:shardkv-server>"
    KV_CLI_BIN="$<TARGET_FILE:shardkv_bin>")

  # kv_cluster_test(NAME TIMEOUT) for tests/<layer>/NAME.c on kv_cluster_util.
  # Every such test depends on the daemons, so that `ctest` after a build
  # always runs the current ones.
  function(kv_cluster_test name timeout)
    kv_add_test(${name} SOURCES ${KV_TEST_LAYER}/${name}.c LIBS kv_cluster_util
      TIMEOUT ${timeout} LABELS integration)
    add_dependencies(${name} shardkv-controller shardkv-server shardkv_bin)
  endfunction()
endif()

if(TARGET shardkv-controller AND TARGET shardkv-server)
  # A controller and two joined servers as real processes, for the client
  # library's own cluster tests (two_node_cluster.h).
  add_library(kv_two_node_cluster STATIC support/two_node_cluster.c)
  target_link_libraries(kv_two_node_cluster PUBLIC shardkv kv_testutil kv_flags)
endif()

if(TARGET shardkv-controller AND TARGET shardkv-server AND TARGET shardkv-checker)
  # Network namespaces, veth pairs and faults (netns_util.h).
  add_library(kv_netns_util STATIC support/netns_util.c)
  target_link_libraries(kv_netns_util PUBLIC kv_testutil kv_flags)
endif()

# Fake shard servers in the test process, with the fake controller above
# (fake_cluster.h), for libshardkv and the CLI.
add_library(kv_fake_cluster STATIC support/fake_cluster.c)
target_link_libraries(kv_fake_cluster PUBLIC kv_fake_ctl kv_proto kv_common kv_testutil kv_flags
  Threads::Threads ${CMOCKA_LIBRARIES})
