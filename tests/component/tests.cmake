# Component tests: one process. The code under test runs in the test
# process against in-process fakes of its peers (support/fake_cluster.h).

# libshardkv and the CLI against an in-process fake controller and servers.
kv_add_test(test_client_fake SOURCES component/test_client_fake.c
  LIBS kv_cli kv_fake_cluster kv_proto kv_testutil TIMEOUT 90 LABELS concurrency)

# Controllers inside the test process through their life cycle: restart on
# a data dir, stop with a held watch, refused starts, and a three-replica
# Raft group over loopback TCP.
kv_add_test(test_controller_inproc SOURCES component/test_controller_inproc.c
  LIBS kv_controller kv_testutil TIMEOUT 60 LABELS concurrency)

# Servers inside the test process through their life cycle (server.h)
# against the fake controller: serve and stop, two servers moving a range,
# restart on a data dir, leave, refused starts.
kv_add_test(test_server_inproc SOURCES component/test_server_inproc.c
  LIBS kv_server kv_fake_ctl kv_testutil TIMEOUT 60 LABELS concurrency)
