/*
 * client.c - the libshardkv handle: configuration cache, owner hints,
 * watch thread, the table of connections and the calls to the controllers
 * (kvc_controller_call). Requests to shard servers go through the engine
 * (engine.c), which uses this file and is not used by it.
 *
 * DESIGN. The handle caches the newest configuration it has seen as a
 * reference-counted immutable snapshot; an operation takes a reference,
 * routes with it and drops it, so a new configuration can be installed at
 * any time without waiting for operations. The cache only moves forward
 * (a configuration is installed only when its epoch is newer). It learns
 * new epochs three ways: the first operation fetches one (get_config), a
 * background thread keeps one Watch long poll outstanding on a controller,
 * and an operation that sees a newer epoch in an OwnerHint fetches one.
 * WRONG_OWNER hints are also remembered (a few ranges, newest first) as
 * amendments of the cached configuration, so that later calls for the same
 * range skip the old owner until a newer configuration replaces them.
 * Installing a newer configuration runs the engine's hook (cfg_hook, set
 * by engine.c: kvc_engine_follow), so that requests waiting on a server it
 * replaced or marks down follow it at once.
 *
 * Threads and locks (doc/threads.md has the project-wide list):
 *   - caller threads: any number, running operations (and controller
 *     calls, which block the caller);
 *   - the watch thread: started with the first configuration fetch unless
 *     no_watch; stopped by shardkv_close, which cancels its send or receive
 *     (an aio, so that its socket is only ever closed by the watch thread,
 *     with nothing in progress on it) and signals cfg_cv (that wakes a
 *     backoff).
 *   conn_mu protects the connection table; cfg_mu protects the cache, the
 *   remembered hints and the watch state. Neither is held across a network
 *   call, and they are never held together (nor with an engine lock).
 */
#include "client/client_int.h"
#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The public codes are the KV_E* codes re-declared: every one must match. */
#define KVC__CHECK_ERR(name, value, msg)                                                           \
	_Static_assert((int)SHARDKV_E##name == (int)KV_E##name, "SHARDKV_E" #name " drifted");
KV_ERR_MAP(KVC__CHECK_ERR)
#undef KVC__CHECK_ERR
_Static_assert((int)KV_ERR_MIN == (int)SHARDKV_EMISMATCH, "a KV_E* code has no SHARDKV_E*");
_Static_assert((int)SHARDKV_LOG_DEBUG == (int)KV_LOG_DEBUG &&
                   (int)SHARDKV_LOG_INFO == (int)KV_LOG_INFO &&
                   (int)SHARDKV_LOG_WARN == (int)KV_LOG_WARN &&
                   (int)SHARDKV_LOG_ERROR == (int)KV_LOG_ERROR &&
                   (int)SHARDKV_LOG_OFF == (int)KV_LOG_OFF,
               "SHARDKV_LOG_* drifted from KV_LOG_*");

#define KVC_DEFAULT_TIMEOUT_MS 5000u
#define KVC_WATCH_POLL_MS      10000u /* how long the controller holds a watch */
#define KVC_BACKOFF_MAX_MS     100u

/* A controller call fails early, with SHARDKV_EUNAVAIL, when every
 * controller address has refused connections (nothing listens there) for
 * this long: a mistyped address or a stopped cluster is reported in about a
 * second instead of at the deadline, while a controller that restarts
 * within it is still waited for. */
#define KVC_REFUSED_MS 1000u

/* The detail of the last failure on this thread (shardkv_errmsg). */
static _Thread_local char kvc_errbuf[512];

int
kvc_fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(kvc_errbuf, sizeof(kvc_errbuf), fmt, ap);
	va_end(ap);
	return err;
}

void
kvc_clear_error(void)
{
	kvc_errbuf[0] = 0;
}

const char *
shardkv_errmsg(void)
{
	return kvc_errbuf;
}

const char *
shardkv_strerror(int err)
{
	return kv_strerror(err);
}

void
shardkv_free(void *p)
{
	free(p);
}

bool
kvc_retryable(int err)
{
	switch (err) {
	case KV_ETIMEDOUT:
	case KV_EUNAVAIL:
	case KV_ECLOSED:
	case KV_EBUSY:
	case KV_EMOVING:
	case KV_EWRONGOWNER:
	case KV_ESTALE:
		return true;
	default:
		return false;
	}
}

uint64_t
kvc_next_id(shardkv_client *c)
{
	return atomic_fetch_add(&c->next_id, 1);
}

/* shardkv_set_thread_timeout: this thread's deadline for every call, 0: the
 * handle's. */
static _Thread_local uint32_t kvc_thread_timeout_ms;

void
shardkv_set_thread_timeout(uint32_t timeout_ms)
{
	kvc_thread_timeout_ms = timeout_ms;
}

uint32_t
shardkv_thread_timeout(void)
{
	return kvc_thread_timeout_ms;
}

uint64_t
kvc_deadline(shardkv_client *c)
{
	uint32_t ms = kvc_thread_timeout_ms ? kvc_thread_timeout_ms : atomic_load(&c->timeout_ms);
	return kv_now_ns() + (uint64_t)ms * 1000000u;
}

uint64_t
kvc_deadline_late(shardkv_client *c)
{
	uint32_t ms = kvc_thread_timeout_ms ? kvc_thread_timeout_ms : atomic_load(&c->timeout_ms);
	return kv_now_late_ns() + (uint64_t)ms * 1000000u;
}

/*
 * Log level. The library logs to stderr through common/log.h, whose own
 * default (info) suits the daemons; a library must not write to its user's
 * stderr unasked, so the first shardkv_open() lowers it to warnings unless
 * the program chose a level before (doc/library.md, "Logging").
 */
static pthread_once_t kvc_log_once = PTHREAD_ONCE_INIT;
static atomic_bool kvc_log_chosen; /* shardkv_set_log_level was called */

static void
log_default(void)
{
	if (!atomic_load(&kvc_log_chosen))
		kv_log_set_level(KV_LOG_WARN);
}

int
shardkv_set_log_level(int level)
{
	if (level < SHARDKV_LOG_DEBUG || level > SHARDKV_LOG_OFF)
		return kvc_fail(KV_EINVAL, "log level %d is not one of SHARDKV_LOG_*", level);
	atomic_store(&kvc_log_chosen, true);
	kv_log_set_level((enum kv_log_level)level);
	return KV_OK;
}

uint32_t
kvc_remaining_ms(uint64_t deadline_ns)
{
	uint64_t now = kv_now_ns();

	if (now >= deadline_ns)
		return 0;
	uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
	return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

void
kvc_backoff(uint64_t deadline_ns, uint32_t *backoff_ms)
{
	uint32_t left = kvc_remaining_ms(deadline_ns);
	uint32_t ms = *backoff_ms < left ? *backoff_ms : left;
	struct timespec ts = {.tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L};

	if (ms)
		nanosleep(&ts, NULL);
	*backoff_ms = *backoff_ms * 2 > KVC_BACKOFF_MAX_MS ? KVC_BACKOFF_MAX_MS : *backoff_ms * 2;
}

/* A random non-zero 64-bit id for the handle. */
static uint64_t
random_id(void)
{
	uint64_t v = 0;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		if (read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
			v = 0;
		close(fd);
	}
	if (v == 0)
		v = kv_hash64(&fd, sizeof(fd)) ^ kv_now_ns() ^ ((uint64_t)getpid() << 32);
	return v ? v : 1;
}

/* ---------------------------------------------------------------------------
 * Connections
 * ------------------------------------------------------------------------- */

int
kvc_conn_get(shardkv_client *c, const char *address, kv_rpc_client **out, kvc_conn **conn)
{
	int rv = KV_OK;
	kvc_conn *k;

	pthread_mutex_lock(&c->conn_mu);
	for (size_t i = 0; i < c->nconns; i++) {
		if (strcmp(c->conns[i]->address, address) == 0) {
			*out = c->conns[i]->rpc;
			*conn = c->conns[i];
			goto out;
		}
	}
	if (c->nconns == c->capconns) {
		size_t cap = c->capconns ? c->capconns * 2 : 8;
		kvc_conn **n = realloc(c->conns, cap * sizeof(*n));
		if (n == NULL) {
			rv = KV_ENOMEM;
			goto out;
		}
		c->conns = n;
		c->capconns = cap;
	}
	if ((k = calloc(1, sizeof(*k))) == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	if ((k->address = strdup(address)) == NULL) {
		free(k);
		rv = KV_ENOMEM;
		goto out;
	}
	atomic_init(&k->queue, NULL);
	if ((rv = kv_rpc_client_create_tls(address, c->tls, &k->rpc)) != KV_OK) {
		free(k->address);
		free(k);
		goto out;
	}
	c->conns[c->nconns++] = k;
	*out = k->rpc;
	*conn = k;
out:
	pthread_mutex_unlock(&c->conn_mu);
	return rv;
}

void
kvc_conn_redial(shardkv_client *c, const char *address)
{
	kv_rpc_client *rpc;
	kvc_conn *k;

	if (kvc_conn_get(c, address, &rpc, &k) == KV_OK)
		kv_rpc_client_redial(rpc);
}

uint32_t
kvc_attempt_ms(uint64_t deadline_ns)
{
	uint32_t ms = kvc_remaining_ms(deadline_ns);
	if (ms > 1000u)
		ms = ms / 2 > 1000u ? ms / 2 : 1000u;
	return ms;
}

/* One attempt at one controller address. */
static int
controller_try(shardkv_client *c, const char *address, const kv_admin_req *q, uint32_t rpc_ms,
               kv_admin_resp *r)
{
	kv_rpc_client *rpc;
	kvc_conn *unused;
	nng_msg *req, *rep;
	int rv;

	if ((rv = kvc_conn_get(c, address, &rpc, &unused)) != KV_OK)
		return rv;
	if ((rv = kv_admin_req_encode(q, &req)) != KV_OK)
		return rv;
	kv_rpc_client_fail_refused(rpc, true); /* see KVC_REFUSED_MS */
	if ((rv = kv_rpc_call(rpc, req, &rep, rpc_ms)) != KV_OK) {
		if (rv == KV_EAUTH)
			kvc_fail(rv, "%s", kv_rpc_why()[0] ? kv_rpc_why() : "TLS handshake failed");
		return rv;
	}
	rv = kv_admin_resp_decode(nng_msg_body(rep), nng_msg_len(rep), r);
	nng_msg_free(rep);
	return rv;
}

/* The last kvc_controller_call on this thread ended on refusals. */
static _Thread_local bool kvc_refused_last;

bool
kvc_ctl_refused(void)
{
	return kvc_refused_last;
}

int
kvc_controller_call(shardkv_client *c, kv_admin_req *q, uint64_t deadline_ns, kv_admin_resp *r)
{
	uint32_t backoff = 1;
	char *redirect = NULL; /* a leader named by a NOT_LEADER reply */
	kvc_refused_last = false;
	size_t first, tries = 0;
	size_t refusals = 0; /* consecutive attempts of this call whose address refused */
	int rv = KV_EUNAVAIL;

	/* A --wait can last long, so it must go to a live controller: when none
	 * has answered yet, find one with a cheap request first. */
	pthread_mutex_lock(&c->conn_mu);
	bool known = c->ctl_known;
	pthread_mutex_unlock(&c->conn_mu);
	if (q->wait && c->nctl > 1 && !known) {
		kv_admin_req probe = {.op = KV_ADM_GET_CONFIG};
		if ((rv = kvc_controller_call(c, &probe, deadline_ns, r)) != KV_OK)
			return rv;
		kv_admin_resp_fini(r);
	}
	q->client_id = c->client_id;
	q->request_id = kvc_next_id(c);
	q->auth.p = c->auth.data;
	q->auth.len = c->auth.len;
	pthread_mutex_lock(&c->conn_mu);
	first = c->ctl_next;
	pthread_mutex_unlock(&c->conn_mu);
	for (;;) {
		uint32_t left = kvc_remaining_ms(deadline_ns);
		size_t i = (first + tries) % c->nctl;
		const char *addr = redirect ? redirect : c->ctl_addrs[i];

		if (left == 0)
			break;
		if (q->timeout_ms == 0 || q->timeout_ms > left)
			q->timeout_ms = left;
		/* A dead replica must not eat the whole deadline: with several
		 * controllers one attempt gets a share, also when a follower sent
		 * us there (it may name a leader that just died), and at most 2 s
		 * (watches excepted: they are held on purpose). A --wait gets it
		 * all, after the probe above. */
		uint32_t attempt = left;
		if (!q->wait && c->nctl > 1) {
			attempt = left / (uint32_t)c->nctl;
			attempt = attempt < 1000u ? (left < 1000u ? left : 1000u) : attempt;
			if (q->op != KV_ADM_WATCH && attempt > 2000u)
				attempt = 2000u;
		}
		/* A --wait gets the whole deadline, so first make sure this replica
		 * answers at all: a follower may still name a leader that died. */
		if (q->wait && c->nctl > 1) {
			kv_admin_req probe = {.op = KV_ADM_GET_CONFIG,
			                      .client_id = q->client_id,
			                      .request_id = kvc_next_id(c),
			                      .auth = q->auth};
			uint32_t pms = left < 1000u ? left : 1000u;
			probe.timeout_ms = pms;
			rv = controller_try(c, addr, &probe, pms, r);
			if (rv == KV_OK)
				kv_admin_resp_fini(r);
			else
				goto unanswered;
		}
		uint64_t t0 = kv_now_ns();
		rv = controller_try(c, addr, q, attempt, r);
		if (rv == KV_EUNAVAIL && kv_rpc_refused()) {
			uint64_t since = 0;
			refusals++;
			/* The streak is the handle's: a retry's fetches are short calls. */
			atomic_compare_exchange_strong(&c->refused_since, &since, t0);
			since = atomic_load(&c->refused_since);
			if (refusals >= c->nctl && since != 0 &&
			    kv_now_ns() - since >= (uint64_t)KVC_REFUSED_MS * 1000000u) {
				free(redirect);
				kvc_refused_last = true;
				return kvc_fail(KV_EUNAVAIL,
				                "cannot reach the controller at %s%s: connection "
				                "refused (nothing listens there)",
				                c->ctl_addrs[0],
				                c->nctl > 1 ? " (nor the others)" : "");
			}
		} else {
			refusals = 0;
			atomic_store(&c->refused_since, 0);
		}
		if (rv == KV_OK && r->not_leader) {
			/* addr may be the old redirect: use it before freeing that. */
			char *next = r->leader_address && r->leader_address[0]
			                 ? strdup(r->leader_address)
			                 : NULL;
			rv = kvc_fail(KV_EUNAVAIL, "controller %s is not the leader%s", addr,
			              next ? "" : " (election in progress)");
			free(redirect);
			redirect = next;
			kv_admin_resp_fini(r);
			if (redirect == NULL) {
				tries++;
				kvc_backoff(deadline_ns, &backoff);
			}
			continue;
		}
		if (rv == KV_OK && r->err == KV_EUNAVAIL) {
			rv = kvc_fail(KV_EUNAVAIL, "controller %s: %s", addr,
			              r->error[0] ? r->error : "unavailable");
			kv_admin_resp_fini(r);
		} else if (rv == KV_OK) {
			pthread_mutex_lock(&c->conn_mu);
			if (redirect == NULL)
				c->ctl_next = i;
			c->ctl_known = true;
			pthread_mutex_unlock(&c->conn_mu);
			free(redirect);
			return KV_OK;
		} else if (rv == KV_EAUTH) {
			free(redirect);
			return rv; /* a refused TLS handshake; controller_try said why */
		} else if (!kvc_retryable(rv) && rv != KV_EPROTO) {
			break;
		} else {
		unanswered:
			kvc_fail(rv, "controller %s did not answer", addr);
		}
		free(redirect);
		redirect = NULL;
		tries++;
		/* Every controller was tried once: wait a little before the next round. */
		if (tries % c->nctl == 0)
			kvc_backoff(deadline_ns, &backoff);
	}
	free(redirect);
	if (rv == KV_ETIMEDOUT || rv == KV_EUNAVAIL || rv == KV_ECLOSED)
		return kvc_fail(rv == KV_ECLOSED ? KV_EUNAVAIL : rv,
		                "no controller answered (%s%s)", c->ctl_addrs[0],
		                c->nctl > 1 ? ", ..." : "");
	return kvc_fail(rv, "controller %s", c->ctl_addrs[0]);
}

/* ---------------------------------------------------------------------------
 * Configuration cache
 * ------------------------------------------------------------------------- */

static void
hint_free(kvc_hintent *h)
{
	kv_buf_fini(&h->start);
	kv_buf_fini(&h->end);
	free(h->address);
	memset(h, 0, sizeof(*h));
}

/* Drops every hint. Call with cfg_mu held. */
static void
hints_clear_locked(shardkv_client *c)
{
	for (size_t i = 0; i < c->nhints; i++)
		hint_free(&c->hints[i]);
	c->nhints = 0;
}

void
kvc_hint_learn(shardkv_client *c, uint64_t epoch, const kv_data_hint *h, const char *address,
               kv_bytes key)
{
	kvc_hintent e = {.epoch = epoch};

	if (!kv_range_contains(h->start.data, h->start.len, h->end.data, h->end.len, key.p,
	                       key.len))
		return;
	if (kv_buf_set(&e.start, h->start.data, h->start.len) != KV_OK ||
	    kv_buf_set(&e.end, h->end.data, h->end.len) != KV_OK ||
	    (e.address = strdup(address)) == NULL) {
		hint_free(&e);
		return;
	}
	pthread_mutex_lock(&c->cfg_mu);
	if (c->cfg == NULL || c->cfg->cfg->epoch != epoch) {
		pthread_mutex_unlock(&c->cfg_mu); /* a newer config already came */
		hint_free(&e);
		return;
	}
	if (c->nhints == KVC_MAX_HINTS)
		hint_free(&c->hints[--c->nhints]);
	memmove(&c->hints[1], &c->hints[0], c->nhints * sizeof(kvc_hintent));
	c->hints[0] = e;
	c->nhints++;
	pthread_mutex_unlock(&c->cfg_mu);
}

char *
kvc_hint_lookup(shardkv_client *c, uint64_t epoch, kv_bytes key)
{
	char *a = NULL;

	/* No hint at all (the common case): no lock. A hint added meanwhile is
	 * missed at worst, and hints are only shortcuts. */
	if (atomic_load_explicit(&c->nhints, memory_order_relaxed) == 0)
		return NULL;
	pthread_mutex_lock(&c->cfg_mu);
	for (size_t i = 0; i < c->nhints; i++) {
		const kvc_hintent *h = &c->hints[i];
		if (h->epoch == epoch && kv_range_contains(h->start.data, h->start.len, h->end.data,
		                                           h->end.len, key.p, key.len)) {
			a = strdup(h->address);
			break;
		}
	}
	pthread_mutex_unlock(&c->cfg_mu);
	return a;
}

void
kvc_hint_forget(shardkv_client *c, const char *address)
{
	pthread_mutex_lock(&c->cfg_mu);
	for (size_t i = 0; i < c->nhints;) {
		if (strcmp(c->hints[i].address, address) == 0) {
			hint_free(&c->hints[i]);
			memmove(&c->hints[i], &c->hints[i + 1],
			        (c->nhints - i - 1) * sizeof(kvc_hintent));
			c->nhints--;
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&c->cfg_mu);
}

void
kvc_cfg_put(kvc_cfgref *r)
{
	if (r == NULL)
		return;
	if (atomic_fetch_sub(&r->refs, 1) == 1) {
		kv_config_free(r->cfg);
		free(r->queues);
		free(r);
	}
}

void
kvc_cfg_install(shardkv_client *c, kv_config *cfg)
{
	kvc_cfgref *n, *old = NULL, *stale = NULL;

	if (cfg == NULL)
		return;
	if ((n = malloc(sizeof(*n))) == NULL) {
		kv_config_free(cfg);
		return;
	}
	n->cfg = cfg;
	atomic_init(&n->refs, 1);
	/* Without room for the queues, routing looks each one up. */
	n->queues = calloc(cfg->nnodes ? cfg->nnodes : 1, sizeof(*n->queues));
	pthread_mutex_lock(&c->cfg_mu);
	if (c->cfg == NULL || c->cfg->cfg->epoch < cfg->epoch) {
		old = c->cfg;
		c->cfg = n;
		atomic_store(&c->cfg_known, true);
		atomic_fetch_add(&n->refs, 1); /* for the hook below */
		hints_clear_locked(c);         /* they amended the old configuration */
		pthread_cond_broadcast(&c->cfg_cv);
	} else {
		stale = n; /* not newer: dropped below */
		n = NULL;
	}
	pthread_mutex_unlock(&c->cfg_mu);
	kvc_cfg_put(old);
	kvc_cfg_put(stale);
	if (n != NULL) {
		/* Requests waiting on a server this configuration replaced or
		 * marks down follow it now (engine.c), not at their timeout. */
		kvc_cfg_hook_fn hook = atomic_load(&c->cfg_hook);
		if (hook != NULL)
			hook(c, n);
		kvc_cfg_put(n);
	}
}

static void *watch_main(void *arg);

kvc_cfgref *
kvc_cfg_peek(shardkv_client *c)
{
	kvc_cfgref *ref;

	pthread_mutex_lock(&c->cfg_mu);
	if ((ref = c->cfg) != NULL)
		atomic_fetch_add(&ref->refs, 1);
	pthread_mutex_unlock(&c->cfg_mu);
	return ref;
}

int
kvc_cfg_get(shardkv_client *c, uint64_t min_epoch, uint64_t deadline_ns, kvc_cfgref **out)
{
	kv_admin_req q = {.op = KV_ADM_GET_CONFIG};
	kv_admin_resp r;
	kv_config *cfg;
	kvc_cfgref *ref = NULL;
	int rv;

	pthread_mutex_lock(&c->cfg_mu);
	if (c->cfg && c->cfg->cfg->epoch >= min_epoch) {
		ref = c->cfg;
		atomic_fetch_add(&ref->refs, 1);
	}
	pthread_mutex_unlock(&c->cfg_mu);
	if (ref) {
		*out = ref;
		return KV_OK;
	}
	if ((rv = kvc_controller_call(c, &q, deadline_ns, &r)) != KV_OK)
		return rv;
	cfg = r.err == KV_OK ? kv_admin_resp_take_config(&r) : NULL;
	if (cfg == NULL) {
		rv = r.err != KV_OK ? r.err : KV_EPROTO;
		kvc_fail(rv, "fetching the configuration: %s",
		         r.error[0] ? r.error : kv_strerror(rv));
		kv_admin_resp_fini(&r);
		return rv;
	}
	kvc_cfg_install(c, cfg);
	kv_admin_resp_fini(&r);
	pthread_mutex_lock(&c->cfg_mu);
	ref = c->cfg;
	if (ref)
		atomic_fetch_add(&ref->refs, 1);
	if (!c->no_watch && !c->watch_started && !c->closing) {
		if (pthread_create(&c->watch_thread, NULL, watch_main, c) == 0)
			c->watch_started = true;
	}
	pthread_mutex_unlock(&c->cfg_mu);
	if (ref == NULL)
		return kvc_fail(KV_EUNAVAIL, "no configuration");
	if (ref->cfg->nranges == 0) {
		kvc_cfg_put(ref);
		return kvc_fail(KV_EUNAVAIL, "the cluster has no servers yet (join one first)");
	}
	*out = ref;
	return KV_OK;
}

/* ---------------------------------------------------------------------------
 * Watch thread
 * ------------------------------------------------------------------------- */

/* Waits up to ms on cfg_cv; returns whether the handle is closing. */
static bool
watch_sleep(shardkv_client *c, uint32_t ms)
{
	struct timespec ts;
	bool closing;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000u;
	ts.tv_nsec += (long)(ms % 1000u) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->cfg_mu);
	if (!c->closing)
		pthread_cond_timedwait(&c->cfg_cv, &c->cfg_mu, &ts);
	closing = c->closing;
	pthread_mutex_unlock(&c->cfg_mu);
	return closing;
}

/*
 * Runs the operation `start` put on the watch aio and waits for it. The
 * operation is cancelled when the handle is closing, whether shardkv_close
 * came before (seen here) or comes after (it cancels c->watch_aio).
 */
static int
watch_wait(shardkv_client *c, nng_aio *aio)
{
	pthread_mutex_lock(&c->cfg_mu);
	if (c->closing)
		nng_aio_cancel(aio);
	pthread_mutex_unlock(&c->cfg_mu);
	nng_aio_wait(aio);
	return nng_aio_result(aio);
}

/* The watch thread's socket to one controller, kept from one poll to the
 * next: a configuration change then costs one answer and one request, not
 * a socket, a dial and a closing thread per handle (every handle watches;
 * a client with many, like shardkv bench's one per thread, made dozens at
 * each change, all at the moment of a move). */
typedef struct {
	nng_socket s;
	bool open;  /* s is open and dialled */
	size_t ctl; /* the controller it is dialled to */
} watch_sock;

/* Closes the watch socket when open, through kv_rpc_socket_close: a close
 * that nng's stuck reaper holds must not hold shardkv_close. */
static void
watch_sock_close(watch_sock *w)
{
	if (w->open)
		kv_rpc_socket_close(w->s, "watch");
	w->open = false;
}

/*
 * One long poll on controller ctl over the watch thread's own socket (not
 * the shared rpc clients: shardkv_close must be able to interrupt it),
 * opened and dialled when it is not yet. The send and the receive are aio
 * operations that shardkv_close cancels; the socket is used again only
 * after a complete answer, and closed after any failure, so never while
 * an operation is in progress on it (nng 1.5 can hang when a socket is
 * closed under a blocking receive). Returns 0 with *cfg set (NULL on a
 * poll timeout) or a KV_E* code.
 */
static int
watch_once(shardkv_client *c, watch_sock *w, size_t ctl, uint64_t known, kv_config **cfg)
{
	kv_admin_req q = {.op = KV_ADM_WATCH, .epoch = known, .timeout_ms = KVC_WATCH_POLL_MS};
	kv_admin_resp r;
	nng_aio *aio = NULL;
	nng_msg *msg = NULL;
	int rv;

	*cfg = NULL;
	if (w->open && w->ctl != ctl)
		watch_sock_close(w);
	if (!w->open) {
		if ((rv = nng_req0_open(&w->s)) != 0)
			return kv_err_from_nng(rv);
		w->open = true;
		w->ctl = ctl;
		nng_socket_set_ms(w->s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
		nng_socket_set_size(w->s, NNG_OPT_RECVMAXSZ, KV_RPC_MAX_MSG);
		/* Non-blocking: the connection is made in the background (and
		 * again after a drop), and the send below (bounded,
		 * cancellable) waits for it. */
		if ((rv = kv_tls_dial(w->s, c->ctl_addrs[ctl], c->tls, NNG_FLAG_NONBLOCK, NULL)) !=
		    0) {
			watch_sock_close(w);
			return rv;
		}
	}
	if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
		watch_sock_close(w);
		return kv_err_from_nng(rv);
	}
	pthread_mutex_lock(&c->cfg_mu);
	if (c->closing) {
		pthread_mutex_unlock(&c->cfg_mu);
		rv = KV_ECLOSED;
		goto out;
	}
	c->watch_aio = aio;
	pthread_mutex_unlock(&c->cfg_mu);

	q.client_id = c->client_id;
	q.request_id = kvc_next_id(c);
	q.auth.p = c->auth.data;
	q.auth.len = c->auth.len;
	if ((rv = kv_admin_req_encode(&q, &msg)) != KV_OK)
		goto out;
	nng_aio_set_msg(aio, msg);
	nng_aio_set_timeout(aio, 2000);
	nng_send_aio(w->s, aio);
	if ((rv = watch_wait(c, aio)) != 0) {
		nng_msg_free(nng_aio_get_msg(aio));
		rv = kv_err_from_nng(rv);
		goto out;
	}
	nng_aio_set_timeout(aio, (nng_duration)(KVC_WATCH_POLL_MS + 5000u));
	nng_recv_aio(w->s, aio);
	if ((rv = watch_wait(c, aio)) != 0) {
		rv = kv_err_from_nng(rv);
		goto out;
	}
	msg = nng_aio_get_msg(aio);
	rv = kv_admin_resp_decode(nng_msg_body(msg), nng_msg_len(msg), &r);
	nng_msg_free(msg);
	if (rv == KV_OK) {
		rv = r.err;
		if (rv == KV_OK)
			*cfg = kv_admin_resp_take_config(&r);
		kv_admin_resp_fini(&r);
	}
out:
	pthread_mutex_lock(&c->cfg_mu);
	c->watch_aio = NULL;
	pthread_mutex_unlock(&c->cfg_mu);
	nng_aio_free(aio);
	/* A complete answer leaves nothing in progress: the socket serves the
	 * next poll. Anything else (a timeout, a cancel, an error answer that
	 * moves to another controller) closes it. */
	if (rv != KV_OK)
		watch_sock_close(w);
	return rv;
}

static void *
watch_main(void *arg)
{
	shardkv_client *c = arg;
	watch_sock w = {.open = false};
	size_t ctl = 0;
	uint32_t backoff = 100;

	kv_log_thread_name("shardkv-watch");
	for (;;) {
		uint64_t known = 0;
		kv_config *cfg = NULL;
		int rv;

		pthread_mutex_lock(&c->cfg_mu);
		if (c->closing) {
			pthread_mutex_unlock(&c->cfg_mu);
			break;
		}
		if (c->cfg)
			known = c->cfg->cfg->epoch;
		pthread_mutex_unlock(&c->cfg_mu);

		rv = watch_once(c, &w, ctl, known, &cfg);
		if (rv == KV_OK) {
			backoff = 100;
			if (cfg != NULL)
				kvc_cfg_install(c, cfg);
			continue;
		}
		/* Another controller may answer (a follower, or a dead replica). */
		ctl = (ctl + 1) % c->nctl;
		if (watch_sleep(c, backoff))
			break;
		backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
	}
	watch_sock_close(&w);
	return NULL;
}

/* ---------------------------------------------------------------------------
 * Handle
 * ------------------------------------------------------------------------- */

static int
split_controllers(shardkv_client *c, const char *list)
{
	const char *p = list;

	while (*p) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		if (len > 0) {
			char **n = realloc(c->ctl_addrs, (c->nctl + 1) * sizeof(char *));
			if (n == NULL)
				return KV_ENOMEM;
			c->ctl_addrs = n;
			if ((c->ctl_addrs[c->nctl] = strndup(p, len)) == NULL)
				return KV_ENOMEM;
			c->nctl++;
		}
		if (e == NULL)
			break;
		p = e + 1;
	}
	return c->nctl ? KV_OK : KV_EINVAL;
}

int
shardkv_open(const char *controllers, const shardkv_options *opt, shardkv_client **out)
{
	shardkv_client *c;
	int rv;

	kvc_clear_error();
	pthread_once(&kvc_log_once, log_default);
	if (controllers == NULL || out == NULL)
		return kvc_fail(KV_EINVAL, "no controller address");
	if ((c = calloc(1, sizeof(*c))) == NULL)
		return KV_ENOMEM;
	c->client_id = random_id();
	atomic_init(&c->next_id, 1);
	atomic_init(&c->refused_since, 0);
	atomic_init(&c->timeout_ms,
	            opt && opt->timeout_ms ? opt->timeout_ms : KVC_DEFAULT_TIMEOUT_MS);
	c->no_watch = opt ? opt->no_watch : false;
	if (opt && opt->auth_token_len &&
	    kv_buf_set(&c->auth, opt->auth_token, opt->auth_token_len) != KV_OK) {
		rv = KV_ENOMEM;
		goto err;
	}
	if ((rv = split_controllers(c, controllers)) != KV_OK) {
		if (rv == KV_EINVAL)
			kvc_fail(rv, "empty controller address list");
		goto err;
	}
	if (opt != NULL) {
		kv_tls_files f = {.cert = opt->tls_cert, .key = opt->tls_key, .ca = opt->tls_ca};
		char terr[512];
		if (kv_tls_files_any(&f) &&
		    (rv = kv_tls_create(&f, false, &c->tls, terr, sizeof(terr))) != KV_OK) {
			kvc_fail(rv, "%s", terr);
			goto err;
		}
	}
	for (size_t i = 0; i < c->nctl; i++) {
		char terr[512];
		if ((rv = kv_tls_check_url(c->tls != NULL, "controller", c->ctl_addrs[i], terr,
		                           sizeof(terr))) != KV_OK) {
			kvc_fail(rv, "%s", terr);
			goto err;
		}
	}
	pthread_mutex_init(&c->conn_mu, NULL);
	pthread_mutex_init(&c->cfg_mu, NULL);
	pthread_cond_init(&c->cfg_cv, NULL);
	pthread_mutex_init(&c->eng_mu, NULL);
	pthread_cond_init(&c->eng_cv, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the retry thread's timed waits */
	pthread_cond_init(&c->rq_cv, &ca);
	pthread_condattr_destroy(&ca);
	*out = c;
	return KV_OK;
err:
	for (size_t i = 0; i < c->nctl; i++)
		free(c->ctl_addrs[i]);
	free(c->ctl_addrs);
	kv_buf_fini(&c->auth);
	kv_tls_destroy(c->tls);
	free(c);
	return rv;
}

void
kvc_handle_free(shardkv_client *c)
{
	bool started;

	pthread_mutex_lock(&c->cfg_mu);
	c->closing = true;
	started = c->watch_started;
	if (c->watch_aio != NULL)
		nng_aio_cancel(c->watch_aio); /* the watch thread then closes its socket */
	pthread_cond_broadcast(&c->cfg_cv);
	pthread_mutex_unlock(&c->cfg_mu);
	if (started)
		pthread_join(c->watch_thread, NULL);

	for (size_t i = 0; i < c->nconns; i++) {
		kv_rpc_client_destroy(c->conns[i]->rpc);
		free(c->conns[i]->address);
		free(c->conns[i]);
	}
	free(c->conns);
	kvc_cfg_put(c->cfg);
	hints_clear_locked(c);
	for (size_t i = 0; i < c->nctl; i++)
		free(c->ctl_addrs[i]);
	free(c->ctl_addrs);
	kv_buf_fini(&c->auth);
	kv_tls_destroy(c->tls);
	pthread_cond_destroy(&c->cfg_cv);
	pthread_mutex_destroy(&c->cfg_mu);
	pthread_mutex_destroy(&c->conn_mu);
	pthread_cond_destroy(&c->rq_cv);
	pthread_cond_destroy(&c->eng_cv);
	pthread_mutex_destroy(&c->eng_mu);
	free(c);
}

void
shardkv_set_timeout(shardkv_client *c, uint32_t timeout_ms)
{
	atomic_store(&c->timeout_ms, timeout_ms ? timeout_ms : KVC_DEFAULT_TIMEOUT_MS);
}
