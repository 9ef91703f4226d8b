/*
 * test_checker_histfile.c - history files (checker/histfile.h): what the
 * checker writes reads back to the same verdict; histories from outside,
 * in the file format, are judged like recorded ones; malformed files are
 * refused with the line and the reason.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "checker/histfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads `text` as a history file. Returns chk_histfile_read's code; on 0
 * *res holds the check. */
static int
check_text(const char *text, chk_result *res, char *err, size_t errlen)
{
	FILE *f = fmemopen((void *)text, strlen(text), "r");
	chk_histfile *h = NULL;

	assert_non_null(f);
	int rv = chk_histfile_read(f, &h, err, errlen);
	fclose(f);
	if (rv != 0)
		return rv;
	const chk_key *keys;
	const chk_op *ops;
	size_t nkeys, nops;
	chk_histfile_history(h, &keys, &nkeys, &ops, &nops);
	assert_int_equal(chk_check(keys, nkeys, ops, nops, res), 0);
	for (size_t i = 0; i < res->nkept && i < 2; i++)
		chk_print_violation(stderr, keys, ops, nops, &res->v[i], 0, 10);
	chk_histfile_free(h);
	return 0;
}

/* The violations in text (which must read). */
static size_t
violations(const char *text)
{
	chk_result res;
	char err[256];

	assert_int_equal(check_text(text, &res, err, sizeof(err)), 0);
	return res.nviolations;
}

/* Asserts that text is refused, with a reason that contains `why`. */
static void
refused(const char *text, const char *why)
{
	chk_result res;
	char err[256];

	assert_int_equal(check_text(text, &res, err, sizeof(err)), -1);
	if (strstr(err, why) == NULL)
		fail_msg("reason \"%s\" does not say \"%s\"", err, why);
}

#define INV(p, f, k, v, t)                                                                         \
	"{\"process\": " #p ", \"type\": \"invoke\", \"f\": \"" f "\", \"key\": \"" k              \
	"\", \"value\": " v ", \"time\": " #t "}\n"
#define DONE(p, ty, f, k, v, t)                                                                    \
	"{\"process\": " #p ", \"type\": \"" ty "\", \"f\": \"" f "\", \"key\": \"" k              \
	"\", \"value\": " v ", \"time\": " #t "}\n"
#define PUT(p, k, v, t0, t1)                                                                       \
	INV(p, "put", k, "\"" v "\"", t0) DONE(p, "ok", "put", k, "\"" v "\"", t1)
#define GET(p, k, v, t0, t1) INV(p, "get", k, "null", t0) DONE(p, "ok", "get", k, v, t1)

#define DEL(p, k, v, t0, t1) INV(p, "del", k, "null", t0) DONE(p, "ok", "del", k, v, t1)
/* A cas from e to v (JSON values, null: absent) ending as ty; more: "" or
 * further members of the completion (", \"current\": ..."). */
#define CAS(p, ty, k, e, v, more, t0, t1)                                                          \
	"{\"process\": " #p ", \"type\": \"invoke\", \"f\": \"cas\", \"key\": \"" k                \
	"\", \"expect\": " e ", \"value\": " v ", \"time\": " #t0 "}\n"                            \
	"{\"process\": " #p ", \"type\": \"" ty "\", \"f\": \"cas\", \"key\": \"" k                \
	"\", \"expect\": " e ", \"value\": " v more ", \"time\": " #t1 "}\n"
#define SCAN_INV(p, a, b, t)                                                                       \
	"{\"process\": " #p ", \"type\": \"invoke\", \"f\": \"scan\", \"start\": \"" a             \
	"\", \"end\": \"" b "\", \"limit\": 10, \"time\": " #t "}\n"
/* kvs: a JSON object; more: "" or further members (", \"cut\": \"k\""). */
#define SCAN_OK(p, a, b, kvs, more, t)                                                             \
	"{\"process\": " #p ", \"type\": \"ok\", \"f\": \"scan\", \"start\": \"" a                 \
	"\", \"end\": \"" b "\", \"kvs\": " kvs more ", \"time\": " #t "}\n"
#define SCAN(p, a, b, kvs, more, t0, t1) SCAN_INV(p, a, b, t0) SCAN_OK(p, a, b, kvs, more, t1)

static void
valid_register_history_passes(void **state)
{
	(void)state;
	assert_int_equal(violations(PUT(1, "k", "a", 0, 10) PUT(2, "k", "b", 20, 30)
	                                GET(3, "k", "\"b\"", 35, 36) GET(3, "k", "\"b\"", 40, 41)),
	                 0);
}

/* The anomalies that comparing only operations ordered in real time lets
 * through, written as files. */
static void
flip_flop_in_a_file_is_caught(void **state)
{
	(void)state;
	/* A [0,10] and B [5,20] overlap; B is read, then A. Events in time order. */
	const char *t = INV(1, "put", "k", "\"A\"", 0) INV(2, "put", "k", "\"B\"", 5)
	    DONE(1, "ok", "put", "k", "\"A\"", 10) DONE(2, "ok", "put", "k", "\"B\"", 20)
	        GET(3, "k", "\"B\"", 25, 26) GET(3, "k", "\"A\"", 30, 31);
	assert_int_equal(violations(t), 1);
}

static void
failed_put_seen_then_overwritten_in_a_file_is_caught(void **state)
{
	(void)state;
	/* W [0,3] ok; X [1, ?) info; X read at [5,6]; W read at [10,11]. */
	const char *t = INV(1, "put", "k", "\"W\"", 0) INV(2, "put", "k", "\"X\"", 1)
	    DONE(1, "ok", "put", "k", "\"W\"", 3) DONE(2, "info", "put", "k", "\"X\"", 4)
	        GET(3, "k", "\"X\"", 5, 6) GET(3, "k", "\"W\"", 10, 11);
	assert_int_equal(violations(t), 1);
}

static void
put_left_open_at_the_end_may_have_taken_effect(void **state)
{
	(void)state;
	/* Process 2's put never completes, but a get sees it: valid. */
	const char *t =
	    PUT(1, "k", "a", 0, 10) INV(2, "put", "k", "\"b\"", 12) GET(3, "k", "\"b\"", 20, 21);
	assert_int_equal(violations(t), 0);
}

static void
appends_and_their_final_read_are_checked(void **state)
{
	(void)state;
	const char *ok =
	    INV(1, "append", "a", "\"x;\"",
	        0) "{\"process\": 1, \"type\": \"ok\", \"f\": \"append\", \"key\": \"a\", "
	           "\"value\": \"x;\", "
	           "\"result_len\": 2, \"time\": 5}\n" INV(2, "append", "a", "\"yy;\"", 6)
	               GET(3, "a", "\"x;\"", 7, 8) DONE(2, "ok", "append", "a", "\"yy;\"", 9)
	                   GET(3, "a", "\"x;yy;\"", 20, 21);
	assert_int_equal(violations(ok), 0);
	/* The final read lost the acknowledged yy;. */
	const char *lost = INV(1, "append", "a", "\"x;\"", 0)
	    DONE(1, "ok", "append", "a", "\"x;\"", 5) INV(2, "append", "a", "\"yy;\"", 6)
	        DONE(2, "ok", "append", "a", "\"yy;\"", 9) GET(3, "a", "\"x;\"", 20, 21);
	assert_int_equal(violations(lost), 1);
	/* A result_len that ends no token of the final value. */
	const char *len = INV(1, "append", "a", "\"x;\"",
	                      0) "{\"process\": 1, \"type\": \"ok\", \"f\": \"append\", \"key\": "
	                         "\"a\", \"value\": \"x;\", "
	                         "\"result_len\": 3, \"time\": 5}\n" GET(3, "a", "\"x;\"", 20, 21);
	assert_int_equal(violations(len), 1);
}

static void
mget_seeing_half_an_mput_in_a_file_is_caught(void **state)
{
	(void)state;
	const char *t =
	    "{\"process\": 6, \"type\": \"invoke\", \"f\": \"mput\", \"kvs\": {\"k1\": \"v1\", "
	    "\"k2\": "
	    "\"v2\"}, \"time\": 0}\n"
	    "{\"process\": 7, \"type\": \"invoke\", \"f\": \"mget\", \"kvs\": {\"k1\": null, "
	    "\"k2\": "
	    "null}, \"time\": 5}\n"
	    "{\"process\": 7, \"type\": \"ok\", \"f\": \"mget\", \"kvs\": {\"k1\": \"v1\", \"k2\": "
	    "null}, \"time\": 6}\n"
	    "{\"process\": 6, \"type\": \"ok\", \"f\": \"mput\", \"kvs\": {\"k1\": \"v1\", \"k2\": "
	    "\"v2\"}, \"time\": 30}\n";
	assert_int_equal(violations(t), 1);
}

/* An mget marked "atomic": false (its keys did not all live on one node)
 * may see part of an mput; each key is still checked on its own. */
/* An mput invoked, an mget (with `atomic` at and k2's value v2 as given),
 * then the mput's completion. */
#define HALF_SEEN(at, v2, dat)                                                                     \
	"{\"process\": 6, \"type\": \"invoke\", \"f\": \"mput\", \"kvs\": {\"k1\": \"v1\", "       \
	"\"k2\": \"v2\"}, \"time\": 0}\n"                                                          \
	"{\"process\": 7, \"type\": \"invoke\", \"f\": \"mget\", \"kvs\": {\"k1\": null, \"k2\": " \
	"null}, \"atomic\": " at ", \"time\": 5}\n"                                                \
	"{\"process\": 7, \"type\": \"ok\", \"f\": \"mget\", \"kvs\": {\"k1\": \"v1\", "           \
	"\"k2\": " v2 "}, \"atomic\": " dat ", \"time\": 6}\n"                                     \
	"{\"process\": 6, \"type\": \"ok\", \"f\": \"mput\", \"kvs\": {\"k1\": \"v1\", \"k2\": "   \
	"\"v2\"}, \"time\": 30}\n"

/* An mget marked "atomic": false (its keys did not all live on one node)
 * may see part of an mput; each key is still checked on its own. */
static void
an_mget_marked_not_atomic_in_a_file_is_checked_per_key_only(void **state)
{
	(void)state;
	assert_int_equal(violations(HALF_SEEN("true", "null", "true")), 1);
	assert_int_equal(violations(HALF_SEEN("false", "null", "false")), 0);
	/* Per key it is still a read: a value nobody wrote is caught. */
	assert_int_equal(violations(HALF_SEEN("false", "\"v9\"", "false")), 1);
	/* "atomic" must be a boolean, and only on mput and mget. */
	refused(HALF_SEEN("0", "null", "false"), "\"atomic\" is not true or false");
	refused("{\"process\": 1, \"type\": \"invoke\", \"f\": \"put\", \"key\": \"k\", "
	        "\"value\": \"a\", \"atomic\": false, \"time\": 0}\n"
	        "{\"process\": 1, \"type\": \"ok\", \"f\": \"put\", \"key\": \"k\", "
	        "\"value\": \"a\", \"time\": 1}\n",
	        "only mput and mget may");
}

/* Deletes in a file: the value deleted is the delete's "value" on ok
 * (null: not found); a delete of unknown outcome ("info") may or may not
 * have happened; a failed one ("fail") did not. */
static void
deletes_in_a_file_are_checked(void **state)
{
	(void)state;
	/* A get reads a value after a delete of it completed. */
	assert_int_equal(violations(PUT(1, "k", "a", 0, 10) DEL(2, "k", "\"a\"", 20, 30)
	                                GET(3, "k", "\"a\"", 40, 50)),
	                 1);
	/* Mirror: the get finds nothing, then a second delete finds nothing. */
	assert_int_equal(violations(PUT(1, "k", "a", 0, 10) DEL(2, "k", "\"a\"", 20, 30)
	                                GET(3, "k", "null", 40, 50) DEL(2, "k", "null", 60, 70)),
	                 0);
	/* A delete returns a value nobody put. */
	assert_int_equal(violations(PUT(1, "k", "a", 0, 10) DEL(2, "k", "\"zz\"", 20, 30)), 1);
	/* Absent between two puts: only a delete of unknown outcome explains it. */
	const char *absent = PUT(1, "k", "a", 0, 10) GET(3, "k", "null", 20, 30)
	    PUT(1, "k", "b", 40, 50) DEL(2, "k", "\"b\"", 60, 70);
	assert_int_equal(violations(absent), 1);
	const char *info = PUT(1, "k", "a", 0, 10) INV(2, "del", "k", "null", 12)
	    DONE(2, "info", "del", "k", "null", 15) GET(3, "k", "null", 20, 30)
	        PUT(1, "k", "b", 40, 50) DEL(2, "k", "\"b\"", 60, 70);
	assert_int_equal(violations(info), 0);
	const char *failed = PUT(1, "k", "a", 0, 10) INV(2, "del", "k", "null", 12)
	    DONE(2, "fail", "del", "k", "null", 15) GET(3, "k", "null", 20, 30)
	        PUT(1, "k", "b", 40, 50) DEL(2, "k", "\"b\"", 60, 70);
	assert_int_equal(violations(failed), 1);
}

/* Compare-and-set in a file: ok applied, fail refused ("current": what the
 * key held), info unknown; null is "absent" (if-absent, delete-if-equal). */
static void
cas_in_a_file_is_checked(void **state)
{
	(void)state;
	/* A lock taken, refused to another, released. */
	assert_int_equal(violations(CAS(1, "ok", "l", "null", "\"c1\"", "", 0, 10) CAS(
	                     2, "fail", "l", "null", "\"c2\"", ", \"current\": \"c1\"", 20, 30)
	                                CAS(1, "ok", "l", "\"c1\"", "null", "", 40, 50)
	                                    GET(3, "l", "null", 60, 70)),
	                 0);
	/* A counter moved on, the last move of unknown outcome but seen. */
	assert_int_equal(violations(PUT(1, "n", "v0", 0, 10)
	                                CAS(2, "ok", "n", "\"v0\"", "\"v1\"", "", 20, 30)
	                                    CAS(1, "info", "n", "\"v1\"", "\"v2\"", "", 40, 50)
	                                        GET(3, "n", "\"v2\"", 60, 70)),
	                 0);
	/* The lock taken twice. */
	assert_int_equal(violations(CAS(1, "ok", "l", "null", "\"c1\"", "", 0, 10)
	                                CAS(2, "ok", "l", "null", "\"c2\"", "", 20, 30)),
	                 1);
	/* Refused while the key held what it expected. */
	assert_int_equal(violations(PUT(1, "n", "v0", 0, 10) CAS(2, "fail", "n", "\"v0\"", "\"v1\"",
	                                                         ", \"current\": \"v0\"", 20, 30)),
	                 1);
	/* Refused without "current": only that the key held something else. */
	assert_int_equal(violations(PUT(1, "n", "v0", 0, 10)
	                                CAS(2, "fail", "n", "\"v9\"", "\"v1\"", "", 20, 30)),
	                 0);
}

/* Scans in a file: each register of the range is read over the scan's
 * call, "not found" when the scan passed over it. */
static void
scans_in_a_file_are_checked(void **state)
{
	(void)state;
	const char *keys = PUT(1, "b", "b1", 0, 10) PUT(1, "c", "c1", 11, 20);
	/* Valid: both keys as they are. */
	char t[4096];
	snprintf(t, sizeof(t), "%s%s", keys,
	         SCAN(2, "a", "z", "{\"b\": \"b1\", \"c\": \"c1\"}", "", 30, 40));
	assert_int_equal(violations(t), 0);
	/* A stale value of b. */
	snprintf(t, sizeof(t), "%s%s%s", keys, PUT(1, "b", "b2", 21, 25),
	         SCAN(2, "a", "z", "{\"b\": \"b1\", \"c\": \"c1\"}", "", 30, 40));
	assert_int_equal(violations(t), 1);
	/* c is missing although it was there all along. */
	snprintf(t, sizeof(t), "%s%s", keys, SCAN(2, "a", "z", "{\"b\": \"b1\"}", "", 30, 40));
	assert_int_equal(violations(t), 1);
	/* ... unless the scan was cut after b by its limit ... */
	snprintf(t, sizeof(t), "%s%s", keys,
	         SCAN(2, "a", "z", "{\"b\": \"b1\"}", ", \"cut\": \"b\"", 30, 40));
	assert_int_equal(violations(t), 0);
	/* ... or its range ends before c. */
	snprintf(t, sizeof(t), "%s%s", keys, SCAN(2, "a", "c", "{\"b\": \"b1\"}", "", 30, 40));
	assert_int_equal(violations(t), 0);
	/* A scan that returned as many keys as its limit was cut there. */
	char lim[4096] = "";
	for (int i = 0; i < 10; i++) {
		char put[512];
		snprintf(put, sizeof(put),
		         "{\"process\": 1, \"type\": \"invoke\", \"f\": \"put\", \"key\": \"k%d\", "
		         "\"value\": \"v%d\", \"time\": %d}\n"
		         "{\"process\": 1, \"type\": \"ok\", \"f\": \"put\", \"key\": \"k%d\", "
		         "\"value\": \"v%d\", \"time\": %d}\n",
		         i, i, 2 * i, i, i, 2 * i + 1);
		strcat(lim, put);
	}
	strcat(lim, PUT(1, "z9", "v", 20, 21));
	strcat(lim, SCAN(2, "a", "zz",
	                 "{\"k0\": \"v0\", \"k1\": \"v1\", \"k2\": \"v2\", \"k3\": \"v3\", "
	                 "\"k4\": \"v4\", \"k5\": \"v5\", \"k6\": \"v6\", \"k7\": \"v7\", "
	                 "\"k8\": \"v8\", \"k9\": \"v9\"}",
	                 "", 30, 40));
	assert_int_equal(violations(lim), 0);
	/* Scans are not atomic together: old on one key, new on another. */
	snprintf(t, sizeof(t), "%s%s%s%s", keys, INV(1, "put", "b", "\"b2\"", 25),
	         SCAN(2, "a", "z", "{\"b\": \"b2\", \"c\": \"c1\"}", "", 30, 40),
	         DONE(1, "ok", "put", "b", "\"b2\"", 45));
	assert_int_equal(violations(t), 0);
}

/* An append key whose last read began before its last append completed has
 * no final value: its longest read stands in for it. */
static void
append_key_without_final_read_in_a_file_is_checked_against_its_longest_read(void **state)
{
	(void)state;
	/* x; and yy; acknowledged before the longest read began; zz; after. */
	const char *ok =
	    INV(1, "append", "a", "\"x;\"", 0) DONE(1, "ok", "append", "a", "\"x;\"", 5)
	        INV(2, "append", "a", "\"yy;\"", 6) DONE(2, "ok", "append", "a", "\"yy;\"", 9)
	            GET(3, "a", "\"x;yy;\"", 20, 21) INV(1, "append", "a", "\"zz;\"", 22)
	                GET(3, "a", "\"x;\"", 23, 24) DONE(1, "ok", "append", "a", "\"zz;\"", 30);
	/* The read of x; after x;yy; ended is stale: caught although the key
	 * was never read after its last append. */
	assert_int_equal(violations(ok), 1);
	const char *lost =
	    INV(1, "append", "a", "\"x;\"", 0) DONE(1, "ok", "append", "a", "\"x;\"", 5)
	        INV(2, "append", "a", "\"yy;\"", 6) DONE(2, "ok", "append", "a", "\"yy;\"", 9)
	            GET(3, "a", "\"x;\"", 20, 21) INV(1, "append", "a", "\"zz;\"", 22)
	                DONE(1, "ok", "append", "a", "\"zz;\"", 30);
	assert_int_equal(violations(lost), 1); /* yy; is not in the longest read */
	const char *valid = INV(1, "append", "a", "\"x;\"", 0)
	    DONE(1, "ok", "append", "a", "\"x;\"", 5) INV(2, "append", "a", "\"yy;\"", 6)
	        GET(3, "a", "\"x;\"", 7, 8) DONE(2, "ok", "append", "a", "\"yy;\"", 9)
	            GET(3, "a", "\"x;yy;\"", 20, 21) INV(1, "append", "a", "\"zz;\"", 22)
	                DONE(1, "ok", "append", "a", "\"zz;\"", 30);
	chk_result res;
	char err[256];
	assert_int_equal(check_text(valid, &res, err, sizeof(err)), 0);
	assert_int_equal(res.nviolations, 0);
	assert_int_equal(res.keys_unchecked, 0);
	assert_int_equal(res.reads_checked, 2);
}

static void
malformed_files_are_refused_with_the_line_and_reason(void **state)
{
	(void)state;
	refused("not json\n", "line 1: not JSON");
	refused("[1, 2]\n", "line 1: not a JSON object");
	refused("{\"process\": \"x\", \"type\": \"invoke\", \"f\": \"get\", \"time\": 1}\n",
	        "\"process\" is not an integer");
	refused(INV(1, "get", "k", "null", 1) INV(1, "get", "k", "null", 2),
	        "line 2: process 1 invokes with an operation open");
	refused(DONE(1, "ok", "get", "k", "null", 1), "did not invoke");
	refused(INV(1, "get", "k", "null", 5) DONE(1, "ok", "get", "k", "null", 4),
	        "time goes backwards");
	refused(PUT(1, "k", "a", 0, 1) PUT(1, "k", "a", 2, 3), "written to key k twice");
	refused(PUT(1, "k", "a;", 0, 1) INV(1, "append", "k", "\"b;\"", 2)
	            DONE(1, "ok", "append", "k", "\"b;\"", 3),
	        "both appended to and put");
	refused(INV(1, "append", "k", "\"b\"", 2) DONE(1, "ok", "append", "k", "\"b\"", 3),
	        "is no token");
	refused(INV(1, "cas", "k", "null", 2) DONE(1, "ok", "cas", "k", "null", 3),
	        "cas needs \"expect\" and \"value\"");
	refused(CAS(1, "ok", "k", "\"a\"", "\"a\"", "", 2, 3), "writes the value it expects");
	refused(INV(1, "bump", "k", "null", 2) DONE(1, "ok", "bump", "k", "null", 3),
	        "\"bump\" is not checked by this version");
	refused(SCAN_INV(1, "b", "d", 2) SCAN_OK(1, "b", "d", "{\"e\": \"x\"}", "", 3),
	        "scan returned key e, outside its range");
	refused(SCAN_INV(1, "d", "b", 2) SCAN_OK(1, "d", "b", "{}", "", 3),
	        "scan of an empty range");
	refused(INV(1, "append", "k", "\"b;\"", 2) DONE(1, "ok", "append", "k", "\"b;\"", 3)
	            SCAN_INV(1, "a", "z", 4) SCAN_OK(1, "a", "z", "{\"k\": \"b;\"}", "", 5),
	        "scan returned append key k");
	refused(INV(1, "get", "k", "null", 1) DONE(1, "ok", "put", "k", "\"a\"", 2), "f differs");
	refused(INV(1, "put", "k", "null", 1) DONE(1, "ok", "put", "k", "null", 2),
	        "put of a null value");
}

/* A recorded history written out and read back is judged the same. */
static void
written_history_reads_back_to_the_same_verdict(void **state)
{
	chk_key keys[3] = {{.name = "a"}, {.name = "r"}, {.name = "s"}};
	chk_op ops[16];
	size_t n = 0;
	static const char final[] = "c1.1;c2.1;";
	(void)state;

	keys[0].append = true;
	keys[0].final_known = keys[0].final_found = true;
	keys[0].final = (const uint8_t *) final;
	keys[0].final_len = strlen(final);
	memset(ops, 0, sizeof(ops));
	ops[n++] = (chk_op){.invoke = 1,
	                    .complete = 5,
	                    .ret = 5,
	                    .val = chk_val_id(1, 1),
	                    .len = 5,
	                    .key = 0,
	                    .client = 1,
	                    .kind = CHK_APPEND};
	ops[n++] = (chk_op){.invoke = 6,
	                    .complete = CHK_NEVER,
	                    .ret = 9,
	                    .val = chk_val_id(2, 1),
	                    .key = 0,
	                    .client = 2,
	                    .kind = CHK_APPEND,
	                    .status = CHK_FAILED};
	ops[n++] = (chk_op){.invoke = 10,
	                    .complete = 12,
	                    .ret = 12,
	                    .len = 5,
	                    .hash = chk_hash(CHK_HASH_INIT, final, 5),
	                    .key = 0,
	                    .client = 3,
	                    .kind = CHK_GET};
	ops[n++] = (chk_op){.invoke = 2,
	                    .complete = 4,
	                    .ret = 4,
	                    .val = chk_val_id(4, 1),
	                    .key = 1,
	                    .client = 4,
	                    .kind = CHK_PUT,
	                    .txn = 1};
	ops[n++] = (chk_op){.invoke = 2,
	                    .complete = 4,
	                    .ret = 4,
	                    .val = chk_val_id(4, 2),
	                    .key = 2,
	                    .client = 4,
	                    .kind = CHK_PUT,
	                    .txn = 1};
	ops[n++] = (chk_op){.invoke = 13,
	                    .complete = 14,
	                    .ret = 14,
	                    .val = chk_val_id(4, 1),
	                    .key = 1,
	                    .client = 3,
	                    .kind = CHK_GET,
	                    .txn = 2};
	ops[n++] = (chk_op){.invoke = 13,
	                    .complete = 14,
	                    .ret = 14,
	                    .val = chk_val_id(4, 2),
	                    .key = 2,
	                    .client = 3,
	                    .kind = CHK_GET,
	                    .txn = 2};
	for (uint32_t k = 1; k <= 2; k++) /* an mget that was not atomic */
		ops[n++] = (chk_op){.invoke = 13,
		                    .complete = 14,
		                    .ret = 14,
		                    .val = chk_val_id(4, k),
		                    .key = k,
		                    .client = 5,
		                    .kind = CHK_GET,
		                    .txn = 3 | CHK_TXN_LOOSE};
	ops[n++] = (chk_op){.invoke = 15,
	                    .complete = 16,
	                    .ret = 16,
	                    .key = 1,
	                    .client = 0,
	                    .kind = CHK_GET,
	                    .status = CHK_NOTFOUND}; /* a stale final read */
	chk_result want, got;
	assert_int_equal(chk_check(keys, 3, ops, n, &want), 0);
	assert_int_equal(want.nviolations, 1);

	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	chk_nemesis nem[2] = {{.start = 3, .end = 11, .f = "move", .args = "\"to\": 2"},
	                      {.start = 100, .f = "kill", .args = "\"server\": \"tcp://x\""}};
	snprintf(nem[0].result, sizeof(nem[0].result), "\"result\": \"ok\"");
	assert_int_equal(chk_histfile_write(f, keys, 3, ops, n, NULL, 0, nem, 2), 0);
	fclose(f);
	char err[256];
	assert_int_equal(check_text(buf, &got, err, sizeof(err)), 0);
	assert_int_equal(got.nviolations, want.nviolations);
	assert_int_equal(got.v[0].kind, want.v[0].kind);
	/* The file also holds the append key's final read, as a get. */
	assert_int_equal(got.reads_checked, want.reads_checked + 1);
	assert_int_equal(got.appends_acked, want.appends_acked);
	assert_int_equal(got.appends_failed_applied, want.appends_failed_applied);
	assert_int_equal(want.mgets_checked, 1); /* the loose one is not */
	assert_int_equal(got.mgets_checked, want.mgets_checked);
	assert_int_equal(got.mputs, want.mputs);
	assert_non_null(strstr(buf, "\"process\": 5, \"type\": \"ok\", \"f\": \"mget\", "
	                            "\"kvs\": {\"r\": \"c4.1\", \"s\": \"c4.2\"}, "
	                            "\"atomic\": false"));
	/* The nemesis lines are there, in time order among the operations. */
	assert_non_null(strstr(buf, "{\"process\": \"nemesis\", \"type\": \"info\", \"f\": "
	                            "\"move\", \"value\": {\"to\": 2, \"phase\": \"start\"}, "
	                            "\"time\": 3}"));
	assert_non_null(strstr(buf, "\"phase\": \"end\", \"result\": \"ok\"}, \"time\": 11}"));
	free(buf);
}

/* Deletes and scans written out read back to the same verdict. */
static void
written_deletes_and_scans_read_back_to_the_same_verdict(void **state)
{
	chk_key keys[2] = {{.name = "r"}, {.name = "s"}};
	chk_op ops[8];
	size_t n = 0;
	(void)state;

	memset(ops, 0, sizeof(ops));
	ops[n++] = (chk_op){.invoke = 1,
	                    .complete = 2,
	                    .ret = 2,
	                    .val = chk_val_id(1, 1),
	                    .key = 0,
	                    .client = 1,
	                    .kind = CHK_PUT};
	ops[n++] = (chk_op){.invoke = 1,
	                    .complete = 2,
	                    .ret = 2,
	                    .val = chk_val_id(2, 1),
	                    .key = 1,
	                    .client = 2,
	                    .kind = CHK_PUT};
	ops[n++] = (chk_op){.invoke = 3,
	                    .complete = 4,
	                    .ret = 4,
	                    .val = chk_val_id(1, 1),
	                    .key = 0,
	                    .client = 3,
	                    .kind = CHK_DEL};
	/* A scan of [r, t): r absent (deleted), s present. */
	ops[n++] = (chk_op){.invoke = 5,
	                    .complete = 6,
	                    .ret = 6,
	                    .key = 0,
	                    .client = 4,
	                    .kind = CHK_SCAN,
	                    .status = CHK_NOTFOUND,
	                    .txn = 7};
	ops[n++] = (chk_op){.invoke = 5,
	                    .complete = 6,
	                    .ret = 6,
	                    .val = chk_val_id(2, 1),
	                    .key = 1,
	                    .client = 4,
	                    .kind = CHK_SCAN,
	                    .txn = 7};
	/* The deleted value read again: a violation. */
	ops[n++] = (chk_op){.invoke = 7,
	                    .complete = 8,
	                    .ret = 8,
	                    .val = chk_val_id(1, 1),
	                    .key = 0,
	                    .client = 5,
	                    .kind = CHK_GET};
	chk_scan sc = {.txn = 7, .limit = 5, .start = "r", .end = "t"};
	chk_result want, got;
	assert_int_equal(chk_check(keys, 2, ops, n, &want), 0);
	assert_int_equal(want.nviolations, 1);

	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	assert_int_equal(chk_histfile_write(f, keys, 2, ops, n, &sc, 1, NULL, 0), 0);
	fclose(f);
	char err[256];
	assert_int_equal(check_text(buf, &got, err, sizeof(err)), 0);
	assert_int_equal(got.nviolations, want.nviolations);
	assert_int_equal(got.v[0].kind, want.v[0].kind);
	assert_int_equal(got.reads_checked, want.reads_checked);
	assert_int_equal(got.deletes_acked, 1);
	assert_non_null(strstr(buf, "\"f\": \"scan\", \"start\": \"r\", \"end\": \"t\", "
	                            "\"limit\": 5, \"kvs\": {\"s\": \"c2.1\"}"));
	assert_non_null(strstr(buf, "\"type\": \"ok\", \"f\": \"del\", \"key\": \"r\", "
	                            "\"value\": \"c1.1\""));
	free(buf);
}

/* A cas written by the checker reads back as the same cas. */
static void
written_cas_reads_back_to_the_same_verdict(void **state)
{
	chk_key keys[1] = {{.name = "c"}};
	chk_op ops[4];
	size_t n = 0;
	(void)state;

	memset(ops, 0, sizeof(ops));
	/* if-absent, applied; a second refused, told c1.1; a cas of unknown outcome. */
	ops[n++] = (chk_op){.invoke = 1,
	                    .complete = 2,
	                    .ret = 2,
	                    .val = chk_val_id(1, 1),
	                    .client = 1,
	                    .kind = CHK_CAS};
	ops[n++] = (chk_op){.invoke = 3,
	                    .complete = 4,
	                    .ret = 4,
	                    .val = chk_val_id(2, 1),
	                    .len = chk_val_id(1, 1),
	                    .client = 2,
	                    .kind = CHK_CAS,
	                    .status = CHK_MISMATCH};
	ops[n++] = (chk_op){.invoke = 5,
	                    .complete = CHK_NEVER,
	                    .ret = 6,
	                    .val = chk_val_id(2, 2),
	                    .hash = chk_val_id(1, 1),
	                    .client = 2,
	                    .kind = CHK_CAS,
	                    .status = CHK_FAILED,
	                    .err = -7};
	/* A refusal told c1.1 after the unknown one: that was not applied. */
	ops[n++] = (chk_op){.invoke = 7,
	                    .complete = 8,
	                    .ret = 8,
	                    .val = chk_val_id(1, 2),
	                    .hash = chk_val_id(9, 9),
	                    .len = chk_val_id(1, 1),
	                    .client = 1,
	                    .kind = CHK_CAS,
	                    .status = CHK_MISMATCH};
	chk_result want, got;
	assert_int_equal(chk_check(keys, 1, ops, n, &want), 0);
	assert_int_equal(want.nviolations, 0);

	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	assert_int_equal(chk_histfile_write(f, keys, 1, ops, n, NULL, 0, NULL, 0), 0);
	fclose(f);
	char err[256];
	assert_int_equal(check_text(buf, &got, err, sizeof(err)), 0);
	assert_int_equal(got.nviolations, 0);
	assert_int_equal(got.cas_applied, 1);
	assert_int_equal(got.cas_mismatched, 2);
	assert_int_equal(got.cas_failed, 1);
	assert_non_null(strstr(buf,
	                       "\"type\": \"fail\", \"f\": \"cas\", \"key\": \"c\", "
	                       "\"expect\": null, \"value\": \"c2.1\", \"current\": \"c1.1\""));
	assert_non_null(strstr(buf, "\"type\": \"info\", \"f\": \"cas\""));
	free(buf);
}

/* Lines of the driver ("process": "nemesis") are read as events for the
 * report and left out of the check; a process named otherwise is refused. */
static void
nemesis_lines_are_skipped_by_the_check_and_kept(void **state)
{
	const char *t =
	    PUT(1, "k", "a", 0,
	        10) "{\"process\": \"nemesis\", \"type\": \"info\", \"f\": \"move\", \"value\": "
	            "{\"start\": \"k\", \"end\": \"l\", \"phase\": \"start\"}, \"time\": 12}\n"
	            "{\"process\": \"nemesis\", \"type\": \"info\", \"f\": \"move\", \"value\": "
	            "{\"phase\": \"end\", \"result\": \"ok\"}, \"time\": 14}\n"
	            "{\"process\": \"nemesis\", \"type\": \"info\", \"f\": \"kill\", \"time\": "
	            "15}\n" GET(3, "k", "\"a\"", 20, 21);
	(void)state;
	assert_int_equal(violations(t), 0);

	FILE *f = fmemopen((void *)t, strlen(t), "r");
	chk_histfile *h = NULL;
	char err[256];
	assert_non_null(f);
	assert_int_equal(chk_histfile_read(f, &h, err, sizeof(err)), 0);
	fclose(f);
	const chk_nemesis *nem;
	size_t nnem;
	chk_histfile_nemesis(h, &nem, &nnem);
	assert_int_equal(nnem, 3);
	assert_string_equal(nem[0].f, "move");
	assert_int_equal(nem[0].start, 12);
	assert_string_equal(nem[0].args, "\"start\":\"k\",\"end\":\"l\",\"phase\":\"start\"");
	assert_string_equal(nem[2].f, "kill");
	const chk_key *keys;
	const chk_op *ops;
	size_t nkeys, nops;
	chk_histfile_history(h, &keys, &nkeys, &ops, &nops);
	assert_int_equal(nops, 2); /* the put and the get only */
	chk_histfile_free(h);

	/* Out of time order, or a process that is neither a number nor the
	 * nemesis, is malformed. */
	refused(PUT(1, "k", "a", 0, 10) "{\"process\": \"nemesis\", \"type\": \"info\", \"f\": "
	                                "\"kill\", \"time\": 5}\n",
	        "line 3: time goes backwards");
	refused("{\"process\": \"chaos\", \"type\": \"info\", \"f\": \"kill\", \"time\": 5}\n",
	        "\"process\" is not an integer");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(valid_register_history_passes),
	    cmocka_unit_test(flip_flop_in_a_file_is_caught),
	    cmocka_unit_test(failed_put_seen_then_overwritten_in_a_file_is_caught),
	    cmocka_unit_test(put_left_open_at_the_end_may_have_taken_effect),
	    cmocka_unit_test(appends_and_their_final_read_are_checked),
	    cmocka_unit_test(mget_seeing_half_an_mput_in_a_file_is_caught),
	    cmocka_unit_test(an_mget_marked_not_atomic_in_a_file_is_checked_per_key_only),
	    cmocka_unit_test(deletes_in_a_file_are_checked),
	    cmocka_unit_test(cas_in_a_file_is_checked),
	    cmocka_unit_test(scans_in_a_file_are_checked),
	    cmocka_unit_test(
	        append_key_without_final_read_in_a_file_is_checked_against_its_longest_read),
	    cmocka_unit_test(malformed_files_are_refused_with_the_line_and_reason),
	    cmocka_unit_test(written_history_reads_back_to_the_same_verdict),
	    cmocka_unit_test(written_deletes_and_scans_read_back_to_the_same_verdict),
	    cmocka_unit_test(written_cas_reads_back_to_the_same_verdict),
	    cmocka_unit_test(nemesis_lines_are_skipped_by_the_check_and_kept),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
