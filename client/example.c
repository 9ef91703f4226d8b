/*
 * example.c - a small program using libshardkv: open a cluster, write,
 * read, scan with a cursor, close. Build it against an installed library with
 *
 *     cc example.c $(pkg-config --cflags --libs shardkv)
 *
 * Usage: shardkv-example [CONTROLLERS]   (default tcp://127.0.0.1:7000)
 */
#include <shardkv.h>

#include <stdio.h>
#include <string.h>

static int
check(int rv, const char *what)
{
	if (rv != 0)
		fprintf(stderr, "%s: %s (%s)\n", what, shardkv_strerror(rv), shardkv_errmsg());
	return rv;
}

int
main(int argc, char **argv)
{
	const char *ctl = argc > 1 ? argv[1] : "tcp://127.0.0.1:7000";
	shardkv_options opt = {.timeout_ms = 3000};
	shardkv_client *c;
	shardkv_buf v;
	char key[32], val[32];
	int rv;

	if (check(shardkv_open(ctl, &opt, &c), "open"))
		return 1;
	/* Writes: each is applied exactly once, even when retried internally. */
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "example:%02d", i);
		snprintf(val, sizeof(val), "value %d", i);
		if ((rv = check(shardkv_put(c, key, strlen(key), val, strlen(val)), "put")))
			goto out;
	}
	/* A read: the value belongs to the caller. */
	if ((rv = check(shardkv_get(c, "example:03", 10, &v), "get")))
		goto out;
	printf("example:03 = %.*s\n", (int)v.len, (const char *)v.data);
	shardkv_free(v.data);
	/* A scan of [example:, example;) with a cursor the library owns: it
	 * fetches pages (4 entries here) and keeps the resume key itself. */
	shardkv_scan_args a = {.start = {"example:", 8}, .end = {"example;", 8}};
	shardkv_scan_iter *it;
	const shardkv_entry *e;
	if ((rv = check(shardkv_scan_iter_new(c, &a, 4, &it), "scan")))
		goto out;
	while ((rv = shardkv_scan_iter_next(it, &e)) == 0)
		printf("%.*s\t%.*s\n", (int)e->key.len, (const char *)e->key.data,
		       (int)e->value.len, (const char *)e->value.data);
	shardkv_scan_iter_free(it);
	if (rv == 1)
		rv = 0;
	else
		check(rv, "scan");
out:
	shardkv_close(c);
	return rv ? 1 : 0;
}
