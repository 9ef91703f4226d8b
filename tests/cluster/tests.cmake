# Cluster tests: the real shardkv-controller, shardkv-server and shardkv
# binaries built in this tree, spawned on free loopback ports (each test
# depends on them, so `ctest` after a build always runs the current ones).
# Processes are started, waited for and stopped through support/ (which
# uses common/proc.h); every one is stopped on every path.

if(TARGET shardkv-controller AND TARGET shardkv-server AND TARGET shardkv_bin)
  # Whole clusters through support/cluster_util.h (kv_cluster_test).
  kv_cluster_test(test_cluster_admin 90)
  kv_cluster_test(test_cluster_data 120)
  kv_cluster_test(test_client_async 120)
  set_property(TEST test_client_async APPEND PROPERTY LABELS concurrency)
  # Async append/mget/mput/scan and the scan cursor.
  kv_cluster_test(test_client_multi 120)
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
  # transfer messages (kv_xfer_encode, proto/xfer_codec.h).
  kv_cluster_test(test_cluster_bigvalue 300)
  target_link_libraries(test_cluster_bigvalue PRIVATE kv_server)
  # The shared secret (--auth-token-file) on every binary; it also sends
  # hand-made transfer messages (kv_xfer_encode, proto/xfer_codec.h).
  kv_cluster_test(test_cluster_auth 180)
  target_link_libraries(test_cluster_auth PRIVATE kv_server)
  # TLS (--tls-*) on every binary, with a PKI made at run time by
  # support/tls_certs.sh (openssl); it also opens rpc clients itself.
  kv_cluster_test(test_cluster_tls 180)
  target_compile_definitions(test_cluster_tls PRIVATE
    KV_TLS_CERTS_SH="${CMAKE_CURRENT_SOURCE_DIR}/support/tls_certs.sh")
  # --max-memory, --max-batch, --max-message and --max-connections.
  kv_cluster_test(test_server_limits 120)
  # What operators rely on: /healthz (a server's follows its lease), build
  # and process figures, read hits and misses on every daemon's /metrics; a
  # server restarted after its node left exits 4 with the reason.
  kv_cluster_test(test_cluster_ops 120)
  target_compile_definitions(test_cluster_ops PRIVATE KV_PROJECT_VERSION="${PROJECT_VERSION}")
endif()

if(TARGET shardkv-controller AND TARGET shardkv-server)
  # The CLI and library against a controller and two servers
  # (support/two_node_cluster.h).
  kv_add_test(test_client_cluster SOURCES cluster/test_client_cluster.c
    LIBS kv_cli_run kv_two_node_cluster TIMEOUT 180 LABELS integration)
  target_compile_definitions(test_client_cluster PRIVATE KV_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
  add_dependencies(test_client_cluster shardkv-controller shardkv-server shardkv_bin)
  # Short `shardkv bench` runs against real daemons: unit/test_client_bench.c
  # built with KV_BENCH_CLUSTER.
  kv_add_test(test_client_bench_cluster SOURCES unit/test_client_bench.c
    LIBS kv_cli_run kv_two_node_cluster TIMEOUT 120 LABELS integration)
  target_compile_definitions(test_client_bench_cluster PRIVATE KV_BENCH_CLUSTER
    KV_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
  add_dependencies(test_client_bench_cluster shardkv-controller shardkv-server)

  # The real shardkv-controller binary on a loopback port, driven over nng
  # with AdminRequest messages.
  kv_add_test(test_controller_integration SOURCES cluster/test_controller_integration.c
    LIBS kv_controller kv_ctl_client kv_testutil TIMEOUT 240 LABELS integration concurrency)
  target_compile_definitions(test_controller_integration PRIVATE
    KV_CONTROLLER_BIN="$<TARGET_FILE:shardkv-controller>")
  add_dependencies(test_controller_integration shardkv-controller)
  # The replicated controller's start-up (raft addresses, flags, a
  # one-replica group), in process and through the binary.
  kv_add_test(test_controller_replica SOURCES cluster/test_controller_replica.c
    LIBS kv_controller kv_testutil TIMEOUT 60)
  target_compile_definitions(test_controller_replica PRIVATE
    KV_CONTROLLER_BIN="$<TARGET_FILE:shardkv-controller>")
  add_dependencies(test_controller_replica shardkv-controller)

  # Servers against a fake controller that lives in the test process
  # (support/fake_ctl.h): in the test process, and as the real
  # shardkv-server binary where its flags, exit codes and signals are tested.
  kv_add_test(test_server_integration SOURCES cluster/test_server_integration.c
    LIBS kv_server kv_fake_ctl kv_testutil TIMEOUT 400 LABELS integration concurrency)
  target_compile_definitions(test_server_integration PRIVATE
    KV_SERVER_BIN="$<TARGET_FILE:shardkv-server>")
  add_dependencies(test_server_integration shardkv-server)
  # A source (the binary) SIGKILLed between the fence acknowledgement and
  # the controller's answer, held by the fake controller: restarted on its
  # data dir, it hands over every key (scripts/mutants.sh relies on it).
  kv_add_test(test_server_crash_handover SOURCES cluster/test_server_crash_handover.c
    LIBS kv_server kv_fake_ctl kv_testutil TIMEOUT 60 LABELS integration)
  target_compile_definitions(test_server_crash_handover PRIVATE
    KV_SERVER_BIN="$<TARGET_FILE:shardkv-server>")
  add_dependencies(test_server_crash_handover shardkv-server)
  # A real controller and server with --metrics, scraped over a plain socket
  # (counters, text format, hostile requests, bad address).
  kv_add_test(test_server_metrics SOURCES cluster/test_server_metrics.c
    LIBS shardkv kv_testutil TIMEOUT 120 LABELS integration)
  target_compile_definitions(test_server_metrics PRIVATE
    KV_SERVER_BIN="$<TARGET_FILE:shardkv-server>"
    KV_CONTROLLER_BIN="$<TARGET_FILE:shardkv-controller>")
  add_dependencies(test_server_metrics shardkv-server shardkv-controller)
endif()

# An outside program against the installed library: `cmake --install` into a
# temporary prefix, client/example.c compiled and linked with the flags of
# the installed shardkv.pc only (plus, in a sanitizer build, the sanitizer's
# flag, which any program linking that library needs).
set(kv_pc_extra "")
if(KV_SANITIZE)
  set(kv_pc_extra "-fsanitize=${KV_SANITIZE}")
endif()
kv_add_test(test_install_pkgconfig COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cluster/test_install_pkgconfig.sh
  ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR} ${CMAKE_C_COMPILER} "${kv_pc_extra}" TIMEOUT 120 LABELS install)

# deploy/cluster.sh: --help, up --metrics (a metrics port per daemon, printed
# and listed for Prometheus, /healthz on each), and restart of a node that
# left failing with exit 4 and the reason.
if(TARGET shardkv-controller AND TARGET shardkv-server AND TARGET shardkv_bin)
  kv_add_test(test_cluster_sh COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/test_cluster_sh.sh
    ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/bin TIMEOUT 120 LABELS integration)
endif()

# The Python binding (python/shardkv, ctypes over libshardkv.so) against a
# cluster that python/tests/test_shardkv.py starts with deploy/cluster.sh
# (--dir and --base-port on free ports; destroyed on every path). Not in
# sanitizer builds: a sanitized libshardkv.so cannot be loaded into an
# uninstrumented python3 (the sanitizer runtime must come first).
find_program(KV_PYTHON3 python3)
if(KV_PYTHON3 AND NOT KV_SANITIZE AND TARGET shardkv-controller AND TARGET shardkv-server
   AND TARGET shardkv_bin)
  kv_add_test(test_python_binding COMMAND ${KV_PYTHON3}
    ${CMAKE_SOURCE_DIR}/python/tests/test_shardkv.py TIMEOUT 180 LABELS integration)
  set_property(TEST test_python_binding APPEND PROPERTY ENVIRONMENT
    "SHARDKV_LIB=$<TARGET_FILE:shardkv_shared>"
    "SHARDKV_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
    "SHARDKV_SRC=${CMAKE_SOURCE_DIR}"
    "PYTHONPATH=${CMAKE_SOURCE_DIR}/python")
endif()
