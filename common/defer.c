/*
 * defer.c - work left to the end of a thread's round (defer.h).
 */
#include "common/defer.h"

#include <stddef.h>

#define DEFER_MAX 8

static _Thread_local struct {
	int depth; /* kv_defer_begin calls not yet ended */
	int n;     /* entries in d */
	struct {
		kv_defer_fn fn;
		void *arg;
	} d[DEFER_MAX];
} rnd;

void
kv_defer_begin(void)
{
	if (rnd.depth++ == 0)
		rnd.n = 0;
}

bool
kv_defer(kv_defer_fn fn, void *arg)
{
	if (rnd.depth == 0 || fn == NULL)
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

	if (rnd.depth == 0 || --rnd.depth > 0)
		return; /* an inner round: the outer one's end runs them */
	/* the round is over before the first runs: what they leave is not
	 * deferred again (kv_defer is false) */
	rnd.n = 0;
	for (int i = 0; i < n; i++)
		rnd.d[i].fn(rnd.d[i].arg);
}
