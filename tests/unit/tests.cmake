# Unit tests: one module each, no process, no socket beyond loopback inside
# the test process. The whole layer runs in seconds: `ctest -L unit`.

# common/: request/reply plumbing, the shared secret, TLS files and
# request/reply over tls+tcp:// (certificates made by support/tls_certs.sh
# with openssl; those tests skip without it).
kv_add_test(test_rpc SOURCES unit/test_rpc.c LIBS kv_testutil TIMEOUT 60 LABELS concurrency)
kv_add_test(test_auth SOURCES unit/test_auth.c LIBS kv_testutil TIMEOUT 30)
kv_add_test(test_tls SOURCES unit/test_tls.c LIBS kv_testutil TIMEOUT 60)
target_compile_definitions(test_tls PRIVATE
  KV_TLS_CERTS_SH="${CMAKE_CURRENT_SOURCE_DIR}/support/tls_certs.sh")
# The on-disk framing shared by the log, snapshots and the config log.
kv_add_test(test_frame SOURCES unit/test_frame.c TIMEOUT 30)
# Work left to the end of an event loop's round (common/defer.h): once,
# in order, only at the end, per thread.
kv_add_test(test_defer SOURCES unit/test_defer.c TIMEOUT 30)
# A thread's time slice (common/slice.h): its own, and in range.
kv_add_test(test_slice SOURCES unit/test_slice.c TIMEOUT 30)
# The lease rule (common/lease.h) with injected clocks: its edge cases, and
# a simulation of renewals, delays, partitions, pauses and leader changes
# in which no node is declared down while its server holds a lease (and in
# which the rule without its margin, election timeout or wait is caught).
kv_add_test(test_lease SOURCES unit/test_lease.c TIMEOUT 60)

# proto/: the wire schema and the status translation.
kv_add_test(test_wire SOURCES unit/test_wire.c LIBS kv_proto TIMEOUT 30)
# Every message of every codec family of proto/ through encode and decode.
kv_add_test(test_codec SOURCES unit/test_codec.c LIBS kv_proto TIMEOUT 30)

# The local store (shardserver/store.h). The concurrency programs also run
# under ThreadSanitizer in CI (label "concurrency"); each is sized to stay
# under a minute there on two cores.
kv_add_test(test_store SOURCES unit/test_store.c LIBS kv_store_testutil TIMEOUT 60)
kv_add_test(test_store_scan SOURCES unit/test_store_scan.c LIBS kv_store_testutil TIMEOUT 60)
kv_add_test(test_store_concurrency SOURCES unit/test_store_concurrency.c LIBS kv_store_testutil
  TIMEOUT 120 LABELS concurrency)
kv_add_test(test_store_append SOURCES unit/test_store_append.c LIBS kv_store_testutil
  TIMEOUT 120 LABELS concurrency)
kv_add_test(test_store_model SOURCES unit/test_store_model.c LIBS kv_store TIMEOUT 120)
# Expiry, conditional writes, incr, count and range delete, with an injected clock.
kv_add_test(test_store_expiry SOURCES unit/test_store_expiry.c LIBS kv_store TIMEOUT 60)

# The shard server's durability modules: the write-ahead log
# (shardserver/wal.h) and snapshot files (shardserver/snap.h).
# test_wal: format and recovery cases, one thread.
# test_wal_concurrency: the same source built for the cases with many
# threads and injected write failures; it also runs under ThreadSanitizer.
# test_snap: snapshot round trips and every kind of damage.
kv_add_test(test_wal SOURCES unit/test_wal.c LIBS kv_durable kv_testutil TIMEOUT 120)
kv_add_test(test_wal_concurrency SOURCES unit/test_wal.c LIBS kv_durable kv_testutil TIMEOUT 240
  LABELS concurrency)
target_compile_definitions(test_wal_concurrency PRIVATE KV_WAL_TEST_CONCURRENCY=1)
# The catch-up's buffer and positions (shardserver/repl/catchup.h).
kv_add_test(test_catchup SOURCES unit/test_catchup.c LIBS kv_repl TIMEOUT 30)
# What a backup applied last from a primary (shardserver/repl/recent.h).
kv_add_test(test_recent SOURCES unit/test_recent.c LIBS kv_repl TIMEOUT 30)
kv_add_test(test_snap SOURCES unit/test_snap.c LIBS kv_durable kv_testutil TIMEOUT 120)
# test_durable_dedup: the exactly-once memory (with a delete's returned
# value) comes back from the log and from snapshots after a restart.
kv_add_test(test_durable_dedup SOURCES unit/test_durable_dedup.c
  LIBS kv_durable kv_testutil TIMEOUT 60)
# test_durable_expiry: deadlines come back from the log and from snapshots,
# range-delete steps are replayed, old records read as before.
kv_add_test(test_durable_expiry SOURCES unit/test_durable_expiry.c
  LIBS kv_durable kv_testutil TIMEOUT 60)
# test_durable_side: the side logs of incoming range transfers are replayed
# where adopted, removed once a snapshot holds them or when never adopted.
kv_add_test(test_durable_side SOURCES unit/test_durable_side.c
  LIBS kv_durable kv_testutil TIMEOUT 60)

# The shard server's pure modules (owner table, dedup table, codec).
kv_add_test(test_server_units SOURCES unit/test_server_units.c LIBS kv_server kv_testutil TIMEOUT 60)

# The controller's placement and config log.
kv_add_test(test_controller_placement SOURCES unit/test_controller_placement.c
  LIBS kv_controller TIMEOUT 30)
kv_add_test(test_controller_scheduler SOURCES unit/test_controller_scheduler.c
  LIBS kv_controller TIMEOUT 60)
kv_add_test(test_controller_clog SOURCES unit/test_controller_clog.c
  LIBS kv_controller kv_testutil TIMEOUT 30)

# libshardkv's routing and merging, and the CLI without a cluster.
kv_add_test(test_client_json SOURCES unit/test_client_json.c LIBS kv_cli kv_testutil
  TIMEOUT 30)
kv_add_test(test_client_cli SOURCES unit/test_client_cli.c LIBS kv_cli_run kv_testutil
  TIMEOUT 30)
kv_add_test(test_client_batch SOURCES unit/test_client_batch.c LIBS shardkv TIMEOUT 30)
# shardkv bench: histogram, parsing, report shapes (no cluster); the same
# source runs against real daemons as cluster/'s test_client_bench_cluster.
kv_add_test(test_client_bench SOURCES unit/test_client_bench.c LIBS kv_cli_run kv_testutil
  TIMEOUT 60)

# The history checker's model on hand-made histories (checker/history.c).
kv_add_test(test_checker_model SOURCES unit/test_checker_model.c LIBS kv_checker_model
  TIMEOUT 30)
# History files (checker/histfile.c): written, read back, refused when malformed.
kv_add_test(test_checker_histfile SOURCES unit/test_checker_histfile.c LIBS kv_checker_model
  TIMEOUT 30)

# The logger's key=value pairs are logfmt whatever the arguments hold
# (common/log.h).
kv_add_test(test_log_format SOURCES unit/test_log_format.c TIMEOUT 30)

# --version on every daemon and tool: "NAME VERSION[ (commit C)]", exit 0.
kv_add_test(test_version COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_version.sh
  ${PROJECT_VERSION} $<TARGET_FILE:shardkv-server> $<TARGET_FILE:shardkv-controller>
  $<TARGET_FILE:shardkv-checker> TIMEOUT 30)
