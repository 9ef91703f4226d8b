/*
 * defer.c - work left to the end of a thread's round (defer.h).
 */
#include "common/defer.h"

#include <stddef.h>

#define DEFER_MAX 8

static _Thread_local struct {
	bool active; /* between kv_defer_begin and kv_defer_end */
	int n;       /* entries in d */
	struct {
		kv_defer_fn fn;
		void *arg;
	} d[DEFER_MAX];
} rnd;

void
kv_defer_begin(void)
{
	rnd.active = true;
	rnd.n = 0;
}

bool
kv_defer(kv_defer_fn fn, void *arg)
{
	if (!rnd.active || fn == NULL)
		return false;
	for (int i = 0; i < rnd.n; i++)
		if (rnd.d[i].fn == fn && rnd.d[i].arg == arg)
			return true;
	if (rnd.n == DEFER_MAX)
		return false;
	rnd.d[rnd.n].fn = fn;
	rnd.d[rnd.n].arg = arg;
	rnd.n++;
	return true;
}

void
kv_defer_end(void)
{
	int n = rnd.n;

	/* the round is over before the first runs: what they leave is not
	 * deferred again (kv_defer is false) */
	rnd.active = false;
	rnd.n = 0;
	for (int i = 0; i < n; i++)
		rnd.d[i].fn(rnd.d[i].arg);
}
