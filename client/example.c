/*
 * example.c - a small program using libshardkv: open a cluster, write,
 * read, scan, close. Build it against an installed library with
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
	shardkv_scan_result *page;
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
	/* A scan of [example:, example;) in pages of 4, resuming at page->next. */
	shardkv_bytes start = {"example:", 8};
	for (;;) {
		shardkv_scan_args a = {.start = start, .end = {"example;", 8}, .limit = 4};
		if ((rv = check(shardkv_scan_ex(c, &a, &page), "scan")))
			goto out;
		for (size_t i = 0; i < page->n; i++)
			printf("%.*s\t%.*s\n", (int)page->entries[i].key.len,
			       (const char *)page->entries[i].key.data,
			       (int)page->entries[i].value.len,
			       (const char *)page->entries[i].value.data);
		if (!page->more) {
			shardkv_scan_result_free(page);
			break;
		}
		/* Keep the resume point alive until the next call has copied it. */
		static unsigned char next[1024];
		size_t n = page->next.len < sizeof(next) ? page->next.len : sizeof(next);
		memcpy(next, page->next.data, n);
		start.data = next;
		start.len = n;
		shardkv_scan_result_free(page);
	}
out:
	shardkv_close(c);
	return rv ? 1 : 0;
}
