# Tests of the shard server's durability modules: the write-ahead log
# (shardserver/wal.h) and snapshot files (shardserver/snap.h).
# test_wal: format and recovery cases, one thread.
# test_wal_concurrency: the same source built for the cases with many
# threads and injected write failures; it also runs under ThreadSanitizer.
# test_snap: snapshot round trips and every kind of damage.
kv_add_test(test_wal SOURCES test_wal.c LIBS kv_server kv_testutil TIMEOUT 120)
kv_add_test(test_wal_concurrency SOURCES test_wal.c LIBS kv_server kv_testutil TIMEOUT 240
  LABELS concurrency)
target_compile_definitions(test_wal_concurrency PRIVATE KV_WAL_TEST_CONCURRENCY=1)
kv_add_test(test_snap SOURCES test_snap.c LIBS kv_server kv_testutil TIMEOUT 120)
