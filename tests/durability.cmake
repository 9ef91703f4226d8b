# Tests of the shard server's durability modules: the write-ahead log
# (shardserver/durable/wal.h) and snapshot files (shardserver/durable/snap.h).
# test_wal: format and recovery cases, one thread.
# test_wal_concurrency: the same source built for the cases with many
# threads and injected write failures; it also runs under ThreadSanitizer.
# test_snap: snapshot round trips and every kind of damage.
kv_add_test(test_wal SOURCES test_wal.c LIBS kv_durable kv_testutil TIMEOUT 120)
kv_add_test(test_wal_concurrency SOURCES test_wal.c LIBS kv_durable kv_testutil TIMEOUT 240
  LABELS concurrency)
target_compile_definitions(test_wal_concurrency PRIVATE KV_WAL_TEST_CONCURRENCY=1)
kv_add_test(test_snap SOURCES test_snap.c LIBS kv_durable kv_testutil TIMEOUT 120)

# End-to-end durability with real daemons (tests/cluster_util.h): servers
# killed with SIGKILL and restarted from their data dirs (under load, during
# snapshots and migrations), damaged logs, and a data dir on a full file
# system. They need kv_cluster_util and kv_cluster_test() from cluster.cmake,
# which is included after this file: the registration is deferred to the end
# of the directory.
# (CMake before 3.19 has no DEFER: the same registration, spelled out.)
function(kv_durability_cluster_test name timeout)
  if(CMAKE_VERSION VERSION_LESS 3.19)
    kv_add_test(${name} SOURCES ${name}.c LIBS kv_cluster_util TIMEOUT ${timeout}
      LABELS integration)
    add_dependencies(${name} shardkv-controller shardkv-server shardkv_bin)
  else()
    # Arguments of a deferred call are evaluated when it runs: pass literals.
    cmake_language(EVAL CODE "cmake_language(DEFER DIRECTORY \"${CMAKE_CURRENT_SOURCE_DIR}\" CALL kv_cluster_test ${name} ${timeout})")
  endif()
endfunction()
if(TARGET shardkv-controller AND TARGET shardkv-server AND TARGET shardkv_bin)
  kv_durability_cluster_test(test_durability_restart 420)
  kv_durability_cluster_test(test_durability_diskfull 180)
endif()
