/*
 * fsm.c - the Raft state machine of a replicated controller: the format
 * of the commands in the Raft log and of the snapshots, and the three
 * callbacks (apply, snapshot, restore) that the replica (replica.c) runs
 * on its loop thread; and the proposing side, which submits a command or a
 * barrier and waits for it with mu released.
 *
 * Every replica applies the same commands in the same order and decides
 * the same way, so the histories are the same everywhere. Applying only
 * installs into the history (history.c): it never calls back into the
 * commands, which run on the proposer thread (dispatch.c) and wait here.
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * A Raft command publishes one configuration. Layout (little-endian):
 *
 *   offset  size  field
 *   0       4     magic "SKVE"
 *   4       4     format version (CTL_ENTRY_VERSION)
 *   8       8     client id of the admin request (0: none)
 *   16      8     its request id
 *   24      4     length L of the packed Config
 *   28      4     zero
 *   32      L     the packed Config (epoch = the epoch it must follow + 1)
 *   32+L    0..7  zero padding to a multiple of 8 bytes (libraft's disk
 *                 format pads entries; padding them here keeps the length
 *                 that comes back from disk equal to what was proposed)
 *
 * Applying is a compare-and-set on the epoch: a command whose epoch is not
 * the latest + 1 (planned on a state that another leader changed first)
 * changes nothing, so a configuration is never applied twice nor out of
 * order, and every replica decides the same way. Raft checksums entries.
 */
#define CTL_ENTRY_VERSION 1u
#define CTL_ENTRY_HDR     32u
#define CTL_SNAP_VERSION  1u

static void
put64le(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
get64le(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static void
put32le(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t
get32le(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void
rdedup_put_locked(kv_controller *c, uint64_t client_id, uint64_t request_id, uint64_t epoch)
{
	struct ctl_rdedup *d = &c->rdedup[c->nextrdedup++ % CTL_DEDUP];

	d->client_id = client_id;
	d->request_id = request_id;
	d->epoch = epoch;
}

const struct ctl_rdedup *
kv_ctl__rdedup_find_locked(const kv_controller *c, uint64_t client_id, uint64_t request_id)
{
	for (size_t i = 0; i < CTL_DEDUP; i++)
		if (c->rdedup[i].client_id == client_id && c->rdedup[i].request_id == request_id &&
		    c->rdedup[i].epoch != 0 && c->rdedup[i].epoch <= c->nhist)
			return &c->rdedup[i];
	return NULL;
}

/* The state machine's apply (the replica's loop thread). */
static int
fsm_apply(void *arg, const uint8_t *p, size_t n)
{
	kv_controller *c = arg;
	kv_config *cfg = NULL;
	int rv;

	if (n < CTL_ENTRY_HDR || memcmp(p, "SKVE", 4) != 0 || get32le(p + 4) != CTL_ENTRY_VERSION) {
		KV_ERROR("controller", "ignored a raft entry of unknown format", "len=%zu", n);
		return KV_EPROTO;
	}
	if (get32le(p + 24) > n - CTL_ENTRY_HDR) {
		KV_ERROR("controller", "ignored a truncated raft entry", "len=%zu", n);
		return KV_EPROTO;
	}
	if ((rv = kv_codec_config_unpack(p + CTL_ENTRY_HDR, get32le(p + 24), &cfg)) != KV_OK) {
		KV_ERROR("controller", "ignored a raft entry that does not decode", "err=%s",
		         kv_errname(rv));
		return rv;
	}
	pthread_mutex_lock(&c->mu);
	if (cfg->epoch != c->nhist + 1) {
		KV_INFO("controller", "stale proposal not applied", "epoch=%llu latest=%zu",
		        (unsigned long long)cfg->epoch, c->nhist);
		kv_config_free(cfg);
		rv = KV_ESTALE;
	} else if ((rv = kv_ctl__hist_reserve_locked(c, 1)) != KV_OK) {
		kv_config_free(cfg); /* cannot happen twice the same way on all replicas */
	} else {
		if (c->cluster_id[0] == '\0' && cfg->cluster_id != NULL)
			snprintf(c->cluster_id, sizeof(c->cluster_id), "%s", cfg->cluster_id);
		if (get64le(p + 8) != 0)
			rdedup_put_locked(c, get64le(p + 8), get64le(p + 16), cfg->epoch);
		KV_DEBUG("controller", "applied configuration", "epoch=%llu",
		         (unsigned long long)cfg->epoch);
		kv_ctl__install_locked(c, cfg);
		rv = KV_OK;
	}
	pthread_mutex_unlock(&c->mu);
	return rv;
}

/*
 * Snapshot layout (little-endian): magic "SKVCSNAP", u32 version, u32
 * dedup entries D, u64 configurations N, then D times (u64 client id, u64
 * request id, u64 epoch), then N times (u32 length, packed Config) in epoch
 * order from 1.
 */
static int
fsm_snapshot(void *arg, uint8_t **out, size_t *len)
{
	kv_controller *c = arg;
	kv_buf *bufs = NULL;
	size_t total = 24 + CTL_DEDUP * 24 + 7, n;
	uint8_t *p, *w;
	int rv = KV_OK;

	pthread_mutex_lock(&c->mu);
	n = c->nhist;
	if ((bufs = calloc(n ? n : 1, sizeof(*bufs))) == NULL)
		rv = KV_ENOMEM;
	for (size_t i = 0; rv == KV_OK && i < n; i++) {
		rv = kv_codec_config_pack(c->hist[i], &bufs[i]);
		total += 4 + bufs[i].len;
	}
	total &= ~(size_t)7; /* a multiple of 8, like the log entries */
	if (rv == KV_OK && (p = calloc(1, total)) != NULL) {
		memcpy(p, "SKVCSNAP", 8);
		put32le(p + 8, CTL_SNAP_VERSION);
		put32le(p + 12, CTL_DEDUP);
		put64le(p + 16, n);
		w = p + 24;
		for (size_t i = 0; i < CTL_DEDUP; i++, w += 24) {
			put64le(w, c->rdedup[i].client_id);
			put64le(w + 8, c->rdedup[i].request_id);
			put64le(w + 16, c->rdedup[i].epoch);
		}
		for (size_t i = 0; i < n; i++) {
			put32le(w, (uint32_t)bufs[i].len);
			memcpy(w + 4, bufs[i].data, bufs[i].len);
			w += 4 + bufs[i].len;
		}
		*out = p;
		*len = total;
		KV_INFO("controller", "raft snapshot taken", "configs=%zu bytes=%zu", n, total);
	} else if (rv == KV_OK) {
		rv = KV_ENOMEM;
	}
	pthread_mutex_unlock(&c->mu);
	for (size_t i = 0; bufs && i < n; i++)
		kv_buf_fini(&bufs[i]);
	free(bufs);
	return rv;
}

/*
 * Restores a snapshot. The history is append-only and the same on every
 * replica, so only the configurations this replica lacks are added: the
 * ones it has stay where they are (held requests and watches point at them).
 */
static int
fsm_restore(void *arg, const uint8_t *p, size_t len)
{
	kv_controller *c = arg;
	uint64_t n;
	uint32_t nd;
	size_t off;
	kv_config **cfgs = NULL;
	int rv = KV_OK;

	if (len < 24 || memcmp(p, "SKVCSNAP", 8) != 0 || get32le(p + 8) != CTL_SNAP_VERSION)
		return KV_ECORRUPT;
	nd = get32le(p + 12);
	n = get64le(p + 16);
	if (nd > CTL_DEDUP || (len - 24) / 24 < nd || n > len)
		return KV_ECORRUPT;
	off = 24 + (size_t)nd * 24;
	if ((cfgs = calloc(n ? n : 1, sizeof(*cfgs))) == NULL)
		return KV_ENOMEM;
	for (uint64_t i = 0; i < n && rv == KV_OK; i++) {
		uint32_t l;
		if (len - off < 4 || (l = get32le(p + off)) > len - off - 4) {
			rv = KV_ECORRUPT;
			break;
		}
		rv = kv_codec_config_unpack(p + off + 4, l, &cfgs[i]);
		if (rv == KV_OK && cfgs[i]->epoch != i + 1)
			rv = KV_ECORRUPT;
		off += 4 + l;
	}
	pthread_mutex_lock(&c->mu);
	if (rv == KV_OK &&
	    (rv = kv_ctl__hist_reserve_locked(c, n > c->nhist ? n - c->nhist : 0)) == KV_OK) {
		for (uint64_t i = c->nhist; i < n; i++) {
			kv_ctl__install_locked(c, cfgs[i]);
			cfgs[i] = NULL;
		}
		memset(c->rdedup, 0, sizeof(c->rdedup));
		c->nextrdedup = 0;
		for (uint32_t i = 0; i < nd; i++) {
			const uint8_t *e = p + 24 + (size_t)i * 24;
			rdedup_put_locked(c, get64le(e), get64le(e + 8), get64le(e + 16));
		}
		if (c->cluster_id[0] == '\0' && c->nhist && c->hist[0]->cluster_id)
			snprintf(c->cluster_id, sizeof(c->cluster_id), "%s",
			         c->hist[0]->cluster_id);
		KV_INFO("controller", "raft snapshot restored", "epoch=%zu", c->nhist);
	}
	pthread_mutex_unlock(&c->mu);
	for (uint64_t i = 0; i < n; i++)
		kv_config_free(cfgs[i]);
	free(cfgs);
	return rv == KV_ENOMEM ? rv : (rv == KV_OK ? KV_OK : KV_ECORRUPT);
}

/* One proposal (or barrier) in flight; the proposer waits for `done`. */
struct ctl_prop {
	kv_controller *c; /* whose mu and pcv */
	bool done;        /* the replica called back */
	int status;       /* KV_OK or why it did not commit */
	int result;       /* what apply returned */
};

/* The replica's callback for a proposal or barrier (loop thread). */
static void
prop_done_cb(void *arg, int status, int result)
{
	struct ctl_prop *pr = arg;
	kv_controller *c = pr->c;

	pthread_mutex_lock(&c->mu);
	pr->status = status;
	pr->result = result;
	pr->done = true;
	pthread_cond_broadcast(&c->pcv);
	pthread_mutex_unlock(&c->mu);
}

/* Submits a barrier or (cmd != NULL) a command and waits, with mu released,
 * until the replica calls back. Returns the status; *result gets apply's. */
int
kv_ctl__repl_wait_locked(kv_controller *c, const kv_buf *cmd, int *result)
{
	struct ctl_prop *w = calloc(1, sizeof(*w));
	int rv;

	if (w == NULL)
		return KV_ENOMEM;
	w->c = c;
	rv = cmd ? kv_repl_submit(c->repl, cmd->data, cmd->len, prop_done_cb, w)
	         : kv_repl_barrier(c->repl, prop_done_cb, w);
	if (rv == KV_OK) {
		/* The replica always calls back, with KV_ECLOSED at shutdown. */
		while (!w->done)
			pthread_cond_wait(&c->pcv, &c->mu);
		rv = w->status;
		*result = w->result;
	}
	free(w);
	return rv;
}

/* Commits a packed configuration of epoch `epoch` through Raft (the
 * proposer thread, mu held; released while waiting). */
int
kv_ctl__propose_locked(kv_controller *c, const kv_buf *cfg, uint64_t epoch, char *msg,
                       size_t msglen)
{
	kv_buf e = {0};
	int result = 0, rv;

	e.len = (CTL_ENTRY_HDR + cfg->len + 7) & ~(size_t)7;
	if (cfg->len > UINT32_MAX || (e.data = calloc(1, e.len)) == NULL)
		return KV_ENOMEM;
	memcpy(e.data, "SKVE", 4);
	put32le(e.data + 24, (uint32_t)cfg->len);
	put32le(e.data + 4, CTL_ENTRY_VERSION);
	put64le(e.data + 8, c->cur_client_id);
	put64le(e.data + 16, c->cur_req_id);
	memcpy(e.data + CTL_ENTRY_HDR, cfg->data, cfg->len);
	rv = kv_ctl__repl_wait_locked(c, &e, &result);
	kv_buf_fini(&e);
	if (rv != KV_OK) {
		snprintf(msg, msglen,
		         "the change did not commit: %s (leadership changed; retry at the leader)",
		         kv_strerror(rv));
		return rv == KV_ECLOSED ? rv : KV_EUNAVAIL;
	}
	if (result != KV_OK || c->nhist < epoch) {
		snprintf(msg, msglen, "the configuration changed concurrently; retry");
		return KV_EBUSY;
	}
	return KV_OK;
}

kv_repl_fsm
kv_ctl__fsm(kv_controller *c)
{
	return (kv_repl_fsm){
	    .arg = c, .apply = fsm_apply, .snapshot = fsm_snapshot, .restore = fsm_restore};
}
