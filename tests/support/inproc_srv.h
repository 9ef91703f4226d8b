/*
 * inproc_srv.h - shard servers inside the test process (server.h's life
 * cycle) against the fake controller (fake_ctl.h), for component tests:
 * their flags and what those borrow, and bringing one up and down. A
 * failure fails the test.
 */
#ifndef KV_TESTS_SUPPORT_INPROC_SRV_H
#define KV_TESTS_SUPPORT_INPROC_SRV_H

#include "shardserver/server.h"
#include "tests/support/fake_ctl.h"

#include <stdbool.h>

/* One in-process server and what its configuration borrows. */
typedef struct {
	kv_server *s;       /* NULL: not created */
	kv_server_cfg cfg;  /* its flags */
	char url[64];       /* --listen */
	char dir[200];      /* --data-dir */
	const char *ctl[1]; /* --controller */
} inproc_srv;

/* Fills v (zeroed first) for server i: a free loopback URL, the data dir
 * TMPDIR/n<i+1>, the controller at ctl_url (borrowed), --join, batch
 * fsync, `contexts` request contexts and 500 ms watch polls. */
void inproc_srv_init(inproc_srv *v, const char *tmpdir, int i, const char *ctl_url,
                     unsigned contexts);

/* Creates and starts v's server. */
void inproc_srv_up(inproc_srv *v);

/* Stops and destroys v's server. */
void inproc_srv_down(inproc_srv *v);

/* A component test's setup: makes the scratch directory /tmp/NAME.XXXXXX
 * in tmpdir (tmplen bytes), starts the fake controller in *ctl and fills
 * v[0..n) with inproc_srv_init(.., contexts); no node is known to it yet. */
void inproc_srv_setup(inproc_srv *v, int n, fake_ctl **ctl, char *tmpdir, size_t tmplen,
                      const char *name, unsigned contexts);

/* A component test's teardown: closes the cached raw clients, destroys
 * every server of v[0..n) still there, stops *ctl (set to NULL) and
 * removes tmpdir. */
void inproc_srv_cleanup(inproc_srv *v, int n, fake_ctl **ctl, const char *tmpdir);

/* Whether server s holds key in its store (with value want unless NULL),
 * read directly, whatever it serves. */
bool inproc_srv_holds(kv_server *s, const char *key, const char *want);

#endif
