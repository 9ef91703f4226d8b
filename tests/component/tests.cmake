# Component tests: one process. The code under test runs in the test
# process against in-process fakes of its peers (support/fake_cluster.h).

# libshardkv and the CLI against an in-process fake controller and servers.
kv_add_test(test_client_fake SOURCES component/test_client_fake.c
  LIBS shardkv_cli kv_fake_cluster kv_proto kv_testutil TIMEOUT 90 LABELS concurrency)
