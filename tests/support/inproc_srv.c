/*
 * inproc_srv.c - in-process shard servers for component tests (see
 * inproc_srv.h).
 */
#include "tests/support/inproc_srv.h"

#include "common/err.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

void
inproc_srv_init(inproc_srv *v, const char *tmpdir, int i, const char *ctl_url, unsigned contexts)
{
	memset(v, 0, sizeof(*v));
	kv_test_free_url(v->url, sizeof(v->url));
	snprintf(v->dir, sizeof(v->dir), "%s/n%d", tmpdir, i + 1);
	v->ctl[0] = ctl_url;
	v->cfg = (kv_server_cfg){.listen = v->url,
	                         .ctl = v->ctl,
	                         .nctl = 1,
	                         .data_dir = v->dir,
	                         .join = true,
	                         .fsync = KV_FSYNC_BATCH,
	                         .contexts = contexts,
	                         .watch_timeout_ms = 500};
	/* KV_TEST_FSYNC=always|batch|none runs a component test's servers at
	 * that --fsync (tests/component/tests.cmake registers some twice). */
	const char *fs = getenv("KV_TEST_FSYNC");
	kv_fsync_mode m;
	if (fs != NULL && kv_fsync_mode_parse(fs, &m) == 0)
		v->cfg.fsync = m;
}

void
inproc_srv_up(inproc_srv *v)
{
	char err[256];
	int rv = kv_server_create(&v->cfg, &v->s, err, sizeof(err));
	if (rv != 0)
		fail_msg("create: %s: %s", kv_errname(rv), err);
	assert_int_equal(kv_server_start(v->s), 0);
}

void
inproc_srv_down(inproc_srv *v)
{
	assert_int_equal(kv_server_stop(v->s), 0);
	kv_server_destroy(v->s);
	v->s = NULL;
}

void
inproc_srv_setup(inproc_srv *v, int n, fake_ctl **ctl, char *tmpdir, size_t tmplen,
                 const char *name, unsigned contexts)
{
	snprintf(tmpdir, tmplen, "/tmp/%s.XXXXXX", name);
	assert_non_null(mkdtemp(tmpdir));
	*ctl = fake_ctl_start();
	for (int i = 0; i < n; i++)
		inproc_srv_init(&v[i], tmpdir, i, (*ctl)->url, contexts);
}

void
inproc_srv_cleanup(inproc_srv *v, int n, fake_ctl **ctl, const char *tmpdir)
{
	clients_close();
	for (int i = 0; i < n; i++) {
		kv_server_destroy(v[i].s);
		v[i].s = NULL;
	}
	fake_ctl_stop(*ctl);
	*ctl = NULL;
	kv_test_rmtree(tmpdir);
}

bool
inproc_srv_holds(kv_server *s, const char *key, const char *want)
{
	kv_buf v = {0};
	bool ok = kv_server_get_for_test(s, key, strlen(key), &v) == 0;

	if (ok && want != NULL)
		ok = v.len == strlen(want) && memcmp(v.data, want, v.len) == 0;
	kv_buf_fini(&v);
	return ok;
}
