# Tests of the history checker (checker/): its model on hand-made histories,
# and shardkv-checker itself against a cluster it starts (--spawn) for a
# bounded time under random join, leave, move and rebalance steps. The
# seed is fixed so a failure can be replayed with the same reconfiguration
# steps; `shardkv-checker --help` shows how to run it longer or against a
# running cluster.
#
# Every run carries filler data (--fill 20000 --fill-size 1000: about 20 MB,
# so a moved range holds data and a copy lasts long enough for operations
# to meet it), mputs and mgets over groups of registers (--multi), async
# operations in flight beside the blocking ones (--async, --handles), and
# half the operations aimed at the keys being moved (--hot, default 50);
# checker_cluster paces half its unwaited copies at 4 MB/s (--move-rate),
# so that some copies last seconds (with --kill, paced copies held most
# later steps off as busy: 11 reconfigurations instead of 58).
# checker_kill_always also runs with 150 ms operation deadlines, so that
# operations time out (indeterminate) and the library retries with the
# same request ids.
kv_add_test(test_checker_model SOURCES test_checker_model.c LIBS kv_checker_model TIMEOUT 30)
kv_add_test(test_checker_histfile SOURCES test_checker_histfile.c LIBS kv_checker_model TIMEOUT 30)

if(TARGET shardkv-checker AND TARGET shardkv-controller AND TARGET shardkv-server)
  add_test(NAME checker_cluster
    COMMAND shardkv-checker --spawn ${CMAKE_CURRENT_BINARY_DIR}/checker-runs --servers 3
      --clients 4 --duration 45 --reconfig-interval 400 --seed 4242
      --fill 20000 --fill-size 1000 --multi 8 --async 4 --handles 2 --move-rate 4)
  set_tests_properties(checker_cluster PROPERTIES TIMEOUT 150 LABELS integration
    ENVIRONMENT "SHARDKV_BIN_DIR=$<TARGET_FILE_DIR:shardkv-server>")
  # The same under SIGKILL of servers (restarted with their data dir) with
  # each durable --fsync mode: nothing acknowledged may be lost or applied
  # twice across crashes, including crashes in the middle of migrations.
  set(checker_kill_always_extra --op-timeout 150 --async 2)
  set(checker_kill_batch_extra --async 4 --handles 2)
  foreach(mode always batch)
    add_test(NAME checker_kill_${mode}
      COMMAND shardkv-checker --spawn ${CMAKE_CURRENT_BINARY_DIR}/checker-runs --servers 3
        --clients 4 --duration 30 --reconfig-interval 400 --seed 5151 --kill --fsync ${mode}
        --fill 20000 --fill-size 1000 --multi 8 ${checker_kill_${mode}_extra})
    set_tests_properties(checker_kill_${mode} PROPERTIES TIMEOUT 150 LABELS integration
      ENVIRONMENT "SHARDKV_BIN_DIR=$<TARGET_FILE_DIR:shardkv-server>")
  endforeach()
  # A replicated control plane (three Raft replicas) whose leader is
  # SIGKILLed a few ms into moves and rebalances (and restarted), while
  # servers are SIGKILLed too: still no lost or doubled acknowledged write,
  # no failed reconfiguration step left half-applied.
  add_test(NAME checker_kill_controller
    COMMAND shardkv-checker --spawn ${CMAKE_CURRENT_BINARY_DIR}/checker-runs --servers 3
      --controllers 3 --kill-controller --kill --fsync batch
      --clients 4 --duration 30 --reconfig-interval 400 --seed 6262
      --fill 20000 --fill-size 1000 --multi 8 --async 2)
  set_tests_properties(checker_kill_controller PROPERTIES TIMEOUT 150 LABELS integration
    ENVIRONMENT "SHARDKV_BIN_DIR=$<TARGET_FILE_DIR:shardkv-server>")
endif()
