# Component tests: one process. The code under test runs in the test
# process against in-process fakes of its peers: the one fake controller
# (support/fake_ctl.h) and, for the client, fake shard servers
# (support/fake_cluster.h).

# libshardkv and the CLI against the fake controller and fake servers,
# including how the client follows a failover (a request on the wire to a
# server marked down, a refused connection, a down owner in its cache).
kv_add_test(test_client_fake SOURCES component/test_client_fake.c
  LIBS kv_cli kv_fake_cluster kv_proto kv_testutil TIMEOUT 90 LABELS concurrency)

# Controllers inside the test process through their life cycle: restart on
# a data dir, stop with a held watch, refused starts, and a three-replica
# Raft group over loopback TCP.
kv_add_test(test_controller_inproc SOURCES component/test_controller_inproc.c
  LIBS kv_controller kv_ctl_client kv_testutil TIMEOUT 60 LABELS concurrency)

# Servers inside the test process through their life cycle (server.h)
# against the fake controller: serve and stop, two servers moving a range,
# restart on a data dir, leave, refused starts.
kv_add_test(test_server_inproc SOURCES component/test_server_inproc.c
  LIBS kv_inproc_srv kv_testutil TIMEOUT 60 LABELS concurrency)

# The safety of a handover between two in-process servers, at the moments
# that matter (the fake controller holds its answer to the fence): a source
# stopped or a migration cancelled between the fence and the commit keeps
# every key; the destination answers MOVING until the commit, also to a
# client configured before an earlier move; many handovers under heavy
# appends lose none. scripts/mutants.sh relies on these.
kv_add_test(test_server_migration SOURCES component/test_server_migration.c
  LIBS kv_inproc_srv shardkv kv_testutil TIMEOUT 150 LABELS concurrency)

# Node liveness and server leases with a real controller and real servers in
# the test process, short leases through their create options: a stopped
# server declared down and back, a fresh controller waiting a full lease,
# a server cut off from the controller refusing data requests, remove, and
# the CLI's locate and check.
kv_add_test(test_liveness_inproc SOURCES component/test_liveness_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 120 LABELS concurrency)

# A node an operator made leave (drained, then gone) stops with info lines
# only; a node removed without a drain still logs the error.
kv_add_test(test_server_left_stop SOURCES component/test_server_left_stop.c
  LIBS kv_inproc_srv kv_testutil TIMEOUT 60)

# Replica placement and failover with a real controller (--replicas 2,
# short leases) and real servers in the test process: joins add replicas
# outside the ISR, IsrChange, a stopped primary failed over to its in-sync
# replica in the configuration that declares it down, and a range with no
# other in-sync member kept (and reported by check).
kv_add_test(test_failover_inproc SOURCES component/test_failover_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 120 LABELS concurrency)

# The controller's repairs with replicas (doc/replication.md "Repair",
# "Primary transfer"), a real controller and three real servers, the test
# playing the primary's IsrChange{add}: a node down past --down-after is
# replaced and stays down; leave --wait of a backup ends once its
# replacement is in sync; leave of a primary moves its role with the old
# primary kept in the ISR, which then answers WRONG_OWNER.
kv_add_test(test_balance_inproc SOURCES component/test_balance_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 180 LABELS concurrency)

kv_add_test(test_repair_inproc SOURCES component/test_repair_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 120 LABELS concurrency)

# The replication stream between two in-process servers (doc/replication.md
# "Writes"): acknowledged writes are on the backup, no acknowledgement while
# the backup is silent, exactly-once across a failover, and the backup's
# refusals (lower leader epoch, sequence gap, a sender that is not primary).
kv_add_test(test_replication_inproc SOURCES component/test_replication_inproc.c
  LIBS kv_inproc_srv kv_testutil TIMEOUT 90 LABELS concurrency)

# What the servers do on a failover and an ISR shrink (doc/replication.md
# "Failover", "ISR changes"): the promoted in-sync backup serves every
# acknowledged write and exactly-once retries; a silent backup is taken out
# of the ISR at the primary's request and the waiting writes complete.
kv_add_test(test_failover_serve_inproc SOURCES component/test_failover_serve_inproc.c
  LIBS kv_inproc_cluster shardkv kv_testutil TIMEOUT 120 LABELS concurrency)

# Dry runs and status figures with a real controller and real servers in the
# test process (doc/contract.md §4, §5): the plan of a move and of a
# rebalance --dry-run is what the real command then starts, and the epoch
# does not change; the CLI's text and JSON and exit codes; refused dry runs;
# the servers' uptime in status.
kv_add_test(test_dryrun_inproc SOURCES component/test_dryrun_inproc.c
  LIBS kv_inproc_cluster shardkv kv_testutil TIMEOUT 120 LABELS concurrency)

# Replicas outside the ISR (doc/replication.md "Catch-up", "Reconciliation"):
# a joined replica is copied under writes and joins the ISR, a failover to it
# loses no acknowledged write and keeps the exactly-once memory; a returning
# old primary is copied again; a diverged backup is taken out of the ISR and
# copied again; two failovers back to back under writes lose nothing, and
# the two stopped servers, back with their data, end equal to the primary.
kv_add_test(test_catchup_inproc SOURCES component/test_catchup_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 180 LABELS concurrency)

# Expiry, conditional writes, incr, exists, count and delrange through
# in-process servers with an injected expiry clock: answers and retries,
# expiry through a restart (log, snapshot) and a migration, reclaim as a
# logged delete, a big delrange in steps beside other requests.
kv_add_test(test_expiry_inproc SOURCES component/test_expiry_inproc.c
  LIBS kv_inproc_srv kv_testutil TIMEOUT 120 LABELS concurrency)

# Cutting a replicated range under writes (doc/replication.md "Moves and
# rebalance with replicas"): a `move` of part of the one range of an R=3
# cluster to another in-sync replica, with a writer all the while; every
# part is back in sync within a deadline, no write refused for long, nothing
# acknowledged lost.
kv_add_test(test_replcut_inproc SOURCES component/test_replcut_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 120 LABELS concurrency)
# A primary transfer with nothing in flight keeps the old primary in the ISR
# without a copy and ends the fence; one with records outstanding copies it
# again, nothing acknowledged lost (doc/replication.md "Primary transfer").
kv_add_test(test_transfer_inproc SOURCES component/test_transfer_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 120 LABELS concurrency)
# A backup stopped and started again at once (--min-insync 2, two servers,
# --fsync always) is copied and back in the ISR within a deadline, several
# rounds, and writes go on without losing an acknowledged one
# (doc/replication.md "Failure cases").
kv_add_test(test_readd_inproc SOURCES component/test_readd_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 180 LABELS concurrency)
# A backup back on its data dir catches up from its own data with the
# records it lacks, no copy; one whose range changed primary meanwhile is
# copied (doc/replication.md "Catch-up from the replica's own data").
kv_add_test(test_owncatchup_inproc SOURCES component/test_owncatchup_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 120)
# The same at --fsync none, whose log syncs nothing by itself: a replica's
# positions still reach the disk (the positions thread syncs for them).
kv_add_test(test_owncatchup_inproc_fsync_none COMMAND test_owncatchup_inproc TIMEOUT 120)
set_tests_properties(test_owncatchup_inproc_fsync_none PROPERTIES ENVIRONMENT "KV_TEST_FSYNC=none")
# A restarted server never counts as in sync by accident (doc/replication.md
# "Failover"): its renewal reaching the controller before its registration,
# and a controller that restarted before it, still fail its range over and
# take it out of every ISR; it is copied and rejoins.
kv_add_test(test_restart_inproc SOURCES component/test_restart_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 180 LABELS concurrency)
# A replica's copy keeps to its primary's --copy-rate: the join of a
# replica to a range of 6 MB at 2 MB/s takes at least the copy's bytes at
# that rate, less one step (a lower bound only).
kv_add_test(test_copyrate_inproc SOURCES component/test_copyrate_inproc.c
  LIBS kv_inproc_cluster kv_testutil TIMEOUT 120 LABELS concurrency)
