# Tests of the wire schema and the status translation (proto/).
kv_add_test(test_wire SOURCES test_wire.c LIBS kv_proto TIMEOUT 30)
