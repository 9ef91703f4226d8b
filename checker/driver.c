/*
 * driver.c - the reconfiguration driver of shardkv-checker: at random
 * (seeded) moments it moves random ranges of the checker's keys between
 * active nodes and rebalances; when it started the cluster itself it also
 * joins new servers (either `shardkv join` or a server started with
 * --join), removes servers (`shardkv leave`, or SIGTERM, which drains) and,
 * with --kill, SIGKILLs servers and restarts them with their data dir.
 * With --kill-controller (a replicated control plane) it SIGKILLs the
 * controller leader a few milliseconds into a move or a rebalance, from a
 * short-lived thread, so that the kill lands while the change is being
 * planned, committed or answered; the replica restarts a moment later.
 *
 * With --kill-interval MS, apart from the steps, a server is SIGKILLed
 * every 0.5..1.5 MS: one that owns a key of the checker's, at a moment one
 * of its threads is inside a log write or sync (polled in /proc for up to
 * AIM_MS; killed anyway after that), so that writes it applied and logged
 * are still unanswered. It restarts at once, and the clients' retries of
 * those writes, under the same request ids, reach it within their
 * deadline: it must answer them from its exactly-once memory (doc/contract.md
 * §3), or the history shows an append token twice or a put come back.
 * With --kill-at-handover those kills aim at a migration's handover
 * instead: the server whose log has just shown its fence as a source
 * (confirmed by the controller, the commit about to leave) or the commit
 * as a destination is the one killed, so that a restart lands between a
 * commit and the handover's publication (doc/protocol.md "Migrations",
 * after a crash).
 *
 * Admin calls refused with BUSY (a range is moving) are counted and simply
 * tried again at a later step; a step counts as a reconfiguration only when
 * the controller published a new epoch for it. Some steps wait for their
 * migrations (--wait), others do not, so migrations overlap.
 *
 * Every step (and every restart) is kept as a nemesis event, its start and
 * end on the operations' clock, for the history file and for lining a
 * violation up with the step that caused it. A move or leave marks the keys
 * it moves as hot (chk_workload_hot_add) until no migration is in flight.
 *
 * The multi-key gate: moves cut only at the workload's boundaries, which
 * never split a group; rebalance, join and leave cut where the servers'
 * samples say, which may. Around those steps (and while a server joins by
 * itself or drains after SIGTERM, and for a while after a step that failed
 * under --kill-controller, whose change may still commit) the gate is
 * closed; it opens again once a configuration at least as new as the
 * step's epoch has been read and the groups it split are marked. Every
 * tick also reads each new epoch and audits the groups, so a split the
 * gate missed is counted as a leak (chk_driver_stats.gate_leaks).
 *
 * Runs on the main thread only (it forks the servers).
 */
#include "checker/checker.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS        50u  /* how often processes are polled */
#define MIN_ACTIVE     2    /* never leave or kill below this many active nodes */
#define WAIT_PERCENT   40   /* steps run with --wait */
#define RESTART_MIN_MS 300u /* a killed server restarts after 300..1500 ms */
#define RESTART_MAX_MS 1500u
#define GATE_HOLD_MS   3000u  /* the gate stays closed after a failed cutting step */
#define AUDIT_MAX      64     /* epochs read per tick at most */
#define AIM_MS         300u   /* a timed kill waits this long at most for a log write */
#define AIM_POLL_US    100u   /* ... polling the victim's threads this often */
#define PAUSE_GRACE_MS 100u   /* a reply sent just before a SIGSTOP may arrive this late */
#define PAUSE_GAP_MS   1000u  /* at least this long between a SIGCONT and the next SIGSTOP */
#define WATCH_MS       15000u /* a paused node is watched this long after its SIGCONT */
#define DEAD_DOWN_MS   20000u /* a node killed for good is seen down within this, or given up */
/* --kill-controller-in-failover: the leader is SIGKILLed this long at most
 * after the server's SIGKILL, a little past the moment the leader declares
 * the node down (lease 2 s + down delay 1 s + election timeout 1 s,
 * doc/replication.md "Liveness and leases"), or when the node is seen down. */
#define FO_KILL_MAX_MS 4500u
#define MAX_PAUSES     4096 /* pauses kept for chk_driver_pause_check */
#define MID_MAX        512  /* configurations read between a pause's before and after */

/* One --pause: the server stopped, its node, when, and the configurations
 * before the SIGSTOP, after the SIGCONT and every one between (to tell
 * which keys it owned throughout: with replicas a failover during the
 * pause, and a move back before `after` was read, give a key away and
 * back). */
typedef struct {
	size_t nem;             /* its nemesis event */
	uint32_t node;          /* the paused server's node id */
	uint64_t stop, cont;    /* SIGSTOP and SIGCONT (ns); cont 0: still paused */
	shardkv_config *before; /* read just before the SIGSTOP (owned) */
	shardkv_config *after;  /* read just after the SIGCONT (owned; may be NULL) */
	shardkv_config **mid;   /* the epochs between them (owned; NULL entries: unread) */
	size_t nmid;            /* entries */
	uint64_t epoch;         /* the last epoch watched for its node's state */
	bool down_seen;         /* a configuration said `down` */
	bool back_seen;         /* ... and later `active` again */
} pause_rec;

/* The thread that ends a pause: it sends SIGSTOP, sleeps, sends SIGCONT.
 * On its own thread so that the pause lasts what was asked even while the
 * driver's thread waits in an admin call. */
struct pauser {
	pid_t pid;             /* whom (a child that cannot exit while stopped) */
	unsigned ms;           /* how long */
	atomic_bool cut_short; /* set by the driver: SIGCONT now */
	atomic_bool done;      /* set by the thread once SIGCONT is sent */
	uint64_t stop_ns;      /* written by the thread before `done`, read after join */
	uint64_t cont_ns;      /* ditto */
};

struct chk_driver {
	const chk_opts *o;                  /* options */
	shardkv_client *admin;              /* borrowed admin handle */
	chk_cluster *cl;                    /* the spawned cluster, or NULL */
	chk_workload *w;                    /* for the key boundaries */
	chk_rng rng;                        /* the driver's random stream */
	chk_driver_stats st;                /* what it did */
	uint64_t next_step;                 /* when the next step is due (ns) */
	bool join_pending[CHK_MAX_SERVERS]; /* started with --join, not yet seen in a config */
	unsigned max_active;                /* join only below this many members */
	size_t join_nem[CHK_MAX_SERVERS];   /* per server: its open join or SIGTERM event */
	chk_nemesis *nem;                   /* the steps so far, in start order */
	size_t nnem, capnem;                /* used and allocated (at most CHK_MAX_NEM) */
	bool gate;                          /* the multi-key gate is closed by the driver */
	uint64_t gate_until;                /* keep it closed until then (ns) */
	uint64_t gate_epoch;                /* ... and until a config of this epoch is read */
	uint64_t cfg_read_ns;               /* when the last config read that succeeded began */
	uint64_t seen_epoch;                /* the last epoch audited */
	bool hot;                           /* hot keys are marked */
	uint64_t next_kill;                 /* --kill-interval: the next timed kill (ns) */
	uint64_t next_pause;                /* --pause: the next SIGSTOP (ns) */
	pause_rec *pauses;                  /* every pause so far */
	size_t npauses, cappauses;          /* used and allocated */
	bool pausing;                       /* the pauser thread runs */
	int pause_srv;                      /* ... on this server */
	pthread_t pthr;                     /* ... the thread */
	struct pauser pz;                   /* ... and what it shares with it */
	size_t watch;                       /* pauses[watch]'s node is watched; SIZE_MAX: none */
	uint64_t watch_until;               /* ... until then (ns) */
	uint64_t next_fault;                /* --kill-no-restart, --wipe: the next fault (ns) */
	uint32_t gone_node;                 /* a node killed for good, to remove once down */
	int gone_srv;                       /* its slot when it stays dead; -1: reused (wipe) */
	uint64_t gone_since;                /* when it was killed (ns) */
	uint64_t fo_kill_at;                /* --kill-controller-in-failover: kill the leader
	                                       then (ns); 0: none due */
	bool fo_kill_on_down;               /* ... or once gone_node is seen down */
};

chk_driver *
chk_driver_create(const chk_opts *o, shardkv_client *admin, chk_cluster *cl, chk_workload *w)
{
	chk_driver *d = calloc(1, sizeof(*d));

	if (d == NULL)
		return NULL;
	d->o = o;
	d->admin = admin;
	d->cl = cl;
	d->w = w;
	d->rng.s = o->seed ^ 0xd1b54a32d192ed03ull;
	d->max_active = o->servers + 2;
	d->next_step = chk_now_ns() + (uint64_t)o->reconfig_ms * 1000000u;
	d->next_kill = chk_now_ns() + (uint64_t)o->kill_ms * 1000000u;
	d->next_pause = chk_now_ns() + (uint64_t)o->pause_iv_ms * 1000000u / 2;
	d->next_fault = chk_now_ns() + (uint64_t)o->fault_iv_ms * 1000000u / 2;
	d->watch = SIZE_MAX;
	d->gone_srv = -1;
	for (int i = 0; i < CHK_MAX_SERVERS; i++)
		d->join_nem[i] = SIZE_MAX;
	return d;
}

void
chk_driver_destroy(chk_driver *d)
{
	if (d == NULL)
		return;
	if (d->gate)
		chk_workload_mk_unblock(d->w);
	if (d->pausing) {
		atomic_store(&d->pz.cut_short, true);
		pthread_join(d->pthr, NULL);
	}
	for (size_t i = 0; i < d->npauses; i++) {
		shardkv_config_free(d->pauses[i].before);
		shardkv_config_free(d->pauses[i].after);
		for (size_t j = 0; j < d->pauses[i].nmid; j++)
			shardkv_config_free(d->pauses[i].mid[j]);
		free(d->pauses[i].mid);
	}
	free(d->pauses);
	free(d->nem);
	free(d);
}

void
chk_driver_nemesis(const chk_driver *d, const chk_nemesis **nem, size_t *n)
{
	*nem = d->nem;
	*n = d->nnem;
}

/* Writes n bytes of p as the inside of a JSON string into buf, bytes
 * outside printable ASCII as the four characters \xNN. */
static const char *
json_esc(char *buf, size_t len, const void *p, size_t n)
{
	const unsigned char *s = p;
	size_t o = 0;

	for (size_t i = 0; i < n && o + 7 < len; i++) {
		if (s[i] == '"' || s[i] == '\\') {
			buf[o++] = '\\';
			buf[o++] = (char)s[i];
		} else if (s[i] < 0x20 || s[i] >= 0x7f) {
			/* Spelled as the log does (\xNN), so that the file holds no
			 * NUL a JSON reader may refuse. */
			o += (size_t)snprintf(buf + o, len - o, "\\\\x%02x", s[i]);
		} else {
			buf[o++] = (char)s[i];
		}
	}
	buf[o] = 0;
	return buf;
}

/* Starts a nemesis event: f and the JSON members of its value. Returns its
 * index, or SIZE_MAX when the record is full. */
static size_t __attribute__((format(printf, 3, 4)))
nem_begin(chk_driver *d, const char *f, const char *fmt, ...)
{
	va_list ap;

	if (d->nnem == d->capnem) {
		size_t cap = d->capnem ? 2 * d->capnem : 256;
		if (cap > CHK_MAX_NEM)
			cap = CHK_MAX_NEM;
		chk_nemesis *x = cap > d->capnem ? realloc(d->nem, cap * sizeof(*x)) : NULL;
		if (x == NULL)
			return SIZE_MAX;
		d->nem = x;
		d->capnem = cap;
	}
	chk_nemesis *e = &d->nem[d->nnem];
	memset(e, 0, sizeof(*e));
	e->start = chk_now_ns();
	snprintf(e->f, sizeof(e->f), "%s", f);
	va_start(ap, fmt);
	vsnprintf(e->args, sizeof(e->args), fmt, ap);
	va_end(ap);
	return d->nnem++;
}

/* Ends nemesis event i with the JSON members of its outcome. */
static void __attribute__((format(printf, 3, 4)))
nem_end(chk_driver *d, size_t i, const char *fmt, ...)
{
	va_list ap;

	if (i >= d->nnem)
		return;
	d->nem[i].end = chk_now_ns();
	va_start(ap, fmt);
	vsnprintf(d->nem[i].result, sizeof(d->nem[i].result), fmt, ap);
	va_end(ap);
}

/* Ends an admin step's event with its result. */
static void
nem_end_rv(chk_driver *d, size_t i, int rv, const shardkv_admin_result *res)
{
	if (rv == 0)
		nem_end(d, i, "\"result\": \"ok\", \"epoch\": %" PRIu64 ", \"migrations\": %zu",
		        res->epoch, res->nmigrations);
	else
		nem_end(d, i, "\"result\": \"%s\"", shardkv_strerror(rv));
}

/* Closes the multi-key gate for a step that may cut inside a group. */
static void
gate_close(chk_driver *d)
{
	if (d->o->groups == 0)
		return;
	if (!d->gate) {
		if (!chk_workload_mk_block(d->w, d->o->op_timeout_ms + 1000))
			chk_log("multi-key operations still in flight after %u ms",
			        d->o->op_timeout_ms + 1000);
		d->gate = true;
	}
}

/* After a cutting step: the gate opens once a config of `epoch` (or
 * newer) is audited, and not before `hold_ms`. */
static void
gate_after(chk_driver *d, int rv, const shardkv_admin_result *res)
{
	uint64_t hold = rv != 0 && d->o->kill_ctl ? GATE_HOLD_MS : 0;

	if (rv == 0 && res->epoch > d->gate_epoch)
		d->gate_epoch = res->epoch;
	if (chk_now_ns() + hold * 1000000u > d->gate_until)
		d->gate_until = chk_now_ns() + hold * 1000000u;
}

const chk_driver_stats *
chk_driver_get_stats(const chk_driver *d)
{
	return &d->st;
}

/* The node of cfg at address url, or NULL. */
static const shardkv_node *
node_by_url(const shardkv_config *cfg, const char *url)
{
	for (size_t i = 0; i < cfg->nnodes; i++)
		if (strcmp(cfg->nodes[i].address, url) == 0)
			return &cfg->nodes[i];
	return NULL;
}

/* The owner of key in cfg's range map. */
static uint32_t
owner_of(const shardkv_config *cfg, const char *key, size_t klen, size_t *range)
{
	size_t i = chk_config_range(cfg, key, klen);

	if (i == SIZE_MAX)
		return 0;
	if (range)
		*range = i;
	return cfg->ranges[i].node;
}

static size_t
count_active(const shardkv_config *cfg)
{
	size_t n = 0;
	for (size_t i = 0; i < cfg->nnodes; i++)
		n += cfg->nodes[i].state == SHARDKV_NODE_ACTIVE;
	return n;
}

static unsigned
step_flags(chk_driver *d)
{
	/* No --wait while a killed server waits for its restart: the driver
	 * restarts it, so a migration to or from it would wait for nothing.
	 * None with --kill-interval either: a waiting step would hold the
	 * timed kills off for as long as it waits. */
	if (d->o->kill_ms || d->gone_node != 0)
		return 0;
	/* Nor while a server is stopped or dead: a migration from it would
	 * hold the driver (and the pause's bookkeeping) for as long. */
	for (int i = 0; d->cl && i < d->cl->nservers; i++)
		if (d->cl->srv[i].state == CHK_SRV_KILLED ||
		    d->cl->srv[i].state == CHK_SRV_PAUSED || d->cl->srv[i].state == CHK_SRV_DEAD)
			return 0;
	if (chk_rng_below(&d->rng, 100) < WAIT_PERCENT) {
		d->st.waited++;
		return SHARDKV_WAIT;
	}
	return 0;
}

/* Counts the outcome of an admin step. */
static void
outcome(chk_driver *d, const char *what, int rv, const shardkv_admin_result *res,
        uint64_t epoch_before, unsigned flags, uint64_t *kind)
{
	if (rv == 0) {
		if (res->epoch > epoch_before || res->nmigrations > 0) {
			d->st.reconfigs++;
			d->st.migrations += res->nmigrations;
			(*kind)++;
			if (d->o->verbose)
				chk_log("%s: epoch %" PRIu64 ", %zu migrations%s", what, res->epoch,
				        res->nmigrations, flags & SHARDKV_WAIT ? " (waited)" : "");
		} else {
			d->st.noops++;
		}
		return;
	}
	if (rv == SHARDKV_EBUSY) {
		d->st.busy++;
		if (d->o->verbose)
			chk_log("%s: busy (%s)", what, shardkv_errmsg());
		return;
	}
	if ((flags & SHARDKV_WAIT) && rv == SHARDKV_ETIMEDOUT)
		d->st.wait_timeouts++;
	d->st.failed++;
	chk_log("%s failed: %s (%s)", what, shardkv_strerror(rv), shardkv_errmsg());
}

/* Whether node `id` of cfg is a server the checker is taking down (it
 * must not receive ranges). */
static bool
going_away(const chk_driver *d, const shardkv_config *cfg, uint32_t id)
{
	if (d->cl == NULL)
		return false;
	for (int i = 0; i < d->cl->nservers; i++) {
		const chk_server *s = &d->cl->srv[i];
		const shardkv_node *nd = node_by_url(cfg, s->url);
		if (nd && nd->id == id)
			return s->state != CHK_SRV_RUNNING;
	}
	return false;
}

/* Picks a destination among the active nodes, not `avoid` when possible. */
static uint32_t
pick_node(chk_driver *d, const shardkv_config *cfg, uint32_t avoid)
{
	uint32_t ids[256];
	size_t n = 0;

	for (size_t i = 0; i < cfg->nnodes && n < 256; i++)
		if (cfg->nodes[i].state == SHARDKV_NODE_ACTIVE && cfg->nodes[i].id != avoid &&
		    !going_away(d, cfg, cfg->nodes[i].id))
			ids[n++] = cfg->nodes[i].id;
	if (n == 0)
		return 0;
	return ids[chk_rng_below(&d->rng, n)];
}

/* Writes key bytes printable (\xNN for the others) into buf. */
static const char *
printable(char *buf, size_t len, const char *k, size_t kl)
{
	size_t o = 0;

	for (size_t i = 0; i < kl && o + 5 < len; i++) {
		unsigned char ch = (unsigned char)k[i];
		if (ch >= 0x20 && ch < 0x7f && ch != '\\')
			buf[o++] = (char)ch;
		else
			o += (size_t)snprintf(buf + o, len - o, "\\x%02x", ch);
	}
	buf[o] = 0;
	return buf;
}

/* The copy rate of a step: --move-rate for half the steps that do not
 * wait (a paced copy lasts long enough for operations to meet it), else
 * unpaced. */
static uint32_t
step_rate(chk_driver *d, unsigned flags)
{
	if (d->o->move_rate == 0 || (flags & SHARDKV_WAIT) || chk_rng_below(&d->rng, 2))
		return 0;
	return d->o->move_rate;
}

/* Moves a random range of the checker's keys to a random active node. */
static void
step_move(chk_driver *d, const shardkv_config *cfg)
{
	size_t nb = 0;
	const char **b = chk_workload_boundaries(d->w, &nb);
	char start[600], end[600], node[16];
	/* The step's description: two printable() keys, the node and the
	 * words around them always fit, so it is never cut. */
	char ps[700], pe[700],
	    what[sizeof(ps) + sizeof(pe) + sizeof(node) + sizeof("move [, ) -> node ")];
	size_t sl, el;
	uint64_t kind = chk_rng_below(&d->rng, 100);

	if (b == NULL || nb == 0) {
		free(b);
		return;
	}
	if (kind < 55) {
		/* Between two of the keys (or past the last one). */
		size_t i = chk_rng_below(&d->rng, nb), j = chk_rng_below(&d->rng, nb + 1);
		if (j <= i) {
			size_t t = i;
			i = j;
			j = t + 1;
		}
		sl = (size_t)snprintf(start, sizeof(start), "%s", b[i]);
		if (j >= nb)
			el = (size_t)snprintf(end, sizeof(end), "%s~", b[nb - 1]);
		else
			el = (size_t)snprintf(end, sizeof(end), "%s", b[j]);
	} else if (kind < 80) {
		/* One key alone: [k, k + "\0"); a group's prefix: the whole
		 * group with its filler keys, [p, p + "~~"). */
		size_t i = chk_rng_below(&d->rng, nb);
		sl = (size_t)snprintf(start, sizeof(start), "%s", b[i]);
		memcpy(end, start, sl);
		end[sl] = 0;
		el = sl + 1;
		if (sl > 0 && start[sl - 1] == '/' && sl + 3 < sizeof(end)) {
			memcpy(end + sl, "~~", 3);
			el = sl + 2;
		}
	} else {
		/* The whole current range that holds a random key. */
		size_t i = chk_rng_below(&d->rng, nb), r = 0;
		if (owner_of(cfg, b[i], strlen(b[i]), &r) == 0) {
			free(b);
			return;
		}
		const shardkv_range *rg = &cfg->ranges[r];
		sl = rg->start.len < sizeof(start) ? rg->start.len : sizeof(start) - 1;
		el = rg->end.len < sizeof(end) ? rg->end.len : sizeof(end) - 1;
		if (sl)
			memcpy(start, rg->start.data, sl);
		if (el)
			memcpy(end, rg->end.data, el);
		start[sl] = end[el] = 0;
	}
	free(b);
	uint32_t from = owner_of(cfg, start, sl, NULL);
	uint32_t to = pick_node(d, cfg, from);
	if (to == 0)
		return;
	snprintf(node, sizeof(node), "%" PRIu32, to);
	unsigned flags = step_flags(d);
	uint32_t rate = step_rate(d, flags);
	shardkv_admin_result res = {0};
	char js[200], je[200];
	chk_workload_hot_clear(d->w);
	chk_workload_hot_add(d->w, start, sl, end, el);
	d->hot = true;
	size_t ne =
	    nem_begin(d, "move",
	              "\"start\": \"%s\", \"end\": \"%s\", \"from\": %" PRIu32 ", \"to\": %" PRIu32
	              ", \"wait\": %s, \"rate_mb_s\": %" PRIu32,
	              json_esc(js, sizeof(js), start, sl), json_esc(je, sizeof(je), end, el), from,
	              to, flags & SHARDKV_WAIT ? "true" : "false", rate);
	int rv = shardkv_move(d->admin, start, sl, end, el, node, rate, flags, &res);
	nem_end_rv(d, ne, rv, &res);
	snprintf(what, sizeof(what), "move [%s, %s) -> node %s",
	         printable(ps, sizeof(ps), start, sl), printable(pe, sizeof(pe), end, el), node);
	outcome(d, what, rv, &res, cfg->epoch, flags, &d->st.moves);
}

static void
step_rebalance(chk_driver *d, const shardkv_config *cfg)
{
	unsigned flags = step_flags(d);
	shardkv_admin_result res = {0};
	gate_close(d);
	uint32_t rate = step_rate(d, flags);
	size_t ne = nem_begin(d, "rebalance", "\"wait\": %s, \"rate_mb_s\": %" PRIu32,
	                      flags & SHARDKV_WAIT ? "true" : "false", rate);
	int rv = shardkv_rebalance(d->admin, rate, flags, &res);
	nem_end_rv(d, ne, rv, &res);
	gate_after(d, rv, &res);
	outcome(d, "rebalance", rv, &res, cfg->epoch, flags, &d->st.rebalances);
}

/* Starts a server and joins it: `shardkv join` (half the time, maybe
 * without rebalancing) or the server's own --join. */
static void
step_join(chk_driver *d, const shardkv_config *cfg)
{
	bool self = chk_rng_below(&d->rng, 2) == 0;
	if (self)
		gate_close(d); /* until it is seen registered (poll_procs) */
	int i = chk_cluster_add_server(d->cl, self);

	if (i < 0) {
		d->st.failed++;
		chk_log("join: cannot start a server");
		return;
	}
	d->join_pending[i] = self; /* the slot may be reused */
	if (self) {
		d->join_nem[i] = nem_begin(d, "join", "\"server\": \"%s\", \"how\": \"--join\"",
		                           d->cl->srv[i].url);
		if (d->o->verbose)
			chk_log("join: started %s with --join", d->cl->srv[i].url);
		return;
	}
	unsigned flags = step_flags(d);
	if (chk_rng_below(&d->rng, 4) == 0)
		flags |= SHARDKV_NO_REBALANCE;
	shardkv_admin_result res = {0};
	char what[128];
	bool cuts = !(flags & SHARDKV_NO_REBALANCE);
	if (cuts)
		gate_close(d);
	size_t ne = nem_begin(d, "join", "\"server\": \"%s\", \"how\": \"join\", \"rebalance\": %s",
	                      d->cl->srv[i].url, cuts ? "true" : "false");
	int rv = shardkv_join(d->admin, d->cl->srv[i].url, flags, &res);
	nem_end_rv(d, ne, rv, &res);
	if (cuts)
		gate_after(d, rv, &res);
	snprintf(what, sizeof(what), "join %s%s", d->cl->srv[i].url,
	         flags & SHARDKV_NO_REBALANCE ? " (no rebalance)" : "");
	outcome(d, what, rv, &res, cfg->epoch, flags, &d->st.joins);
	if (rv != 0 && rv != SHARDKV_ETIMEDOUT) {
		/* Not a member: it would retry registering forever. */
		chk_cluster_signal(d->cl, i, SIGINT);
		d->cl->srv[i].state = CHK_SRV_STOPPING;
	}
}

/* Servers that run and are active members of cfg, by index. */
static size_t
active_servers(chk_driver *d, const shardkv_config *cfg, int *idx)
{
	size_t n = 0;
	for (int i = 0; i < d->cl->nservers; i++) {
		const chk_server *s = &d->cl->srv[i];
		const shardkv_node *nd = node_by_url(cfg, s->url);
		if (s->state == CHK_SRV_RUNNING && s->pid > 0 && nd &&
		    nd->state == SHARDKV_NODE_ACTIVE)
			idx[n++] = i;
	}
	return n;
}

/* Removes a server: `shardkv leave` (it is stopped once gone), or SIGTERM
 * when nothing moves, it owns a range and it listens (the server then
 * drains itself and exits; one spawned a moment ago, by a restart after a
 * kill, may not take signals yet and would die of it). A server that owns
 * no range exits on SIGTERM without leaving and stays an active node, so
 * it only ever gets `leave`. */
static void
step_leave(chk_driver *d, const shardkv_config *cfg)
{
	int idx[CHK_MAX_SERVERS];
	size_t n = active_servers(d, cfg, idx);
	bool quiet = cfg->nmigrations == 0;

	if (n <= MIN_ACTIVE || count_active(cfg) <= MIN_ACTIVE)
		return;
	for (int i = 0; i < d->cl->nservers; i++)
		quiet &= !d->join_pending[i];
	int i = idx[chk_rng_below(&d->rng, n)];
	chk_server *s = &d->cl->srv[i];
	const shardkv_node *nd = node_by_url(cfg, s->url);
	bool owns = false;
	for (size_t r = 0; nd && r < cfg->nranges; r++)
		owns |= cfg->ranges[r].node == nd->id;
	/* Its ranges are hot while they move away. */
	chk_workload_hot_clear(d->w);
	for (size_t r = 0; nd && r < cfg->nranges; r++)
		if (cfg->ranges[r].node == nd->id)
			chk_workload_hot_add(d->w, cfg->ranges[r].start.data,
			                     cfg->ranges[r].start.len, cfg->ranges[r].end.data,
			                     cfg->ranges[r].end.len);
	d->hot = true;
	gate_close(d);
	if (quiet && owns && chk_rng_below(&d->rng, 100) < 40 &&
	    chk_cluster_server_listens(d->cl, i)) {
		/* The gate stays closed until it has exited (poll_procs). */
		d->join_nem[i] =
		    nem_begin(d, "leave", "\"server\": \"%s\", \"how\": \"SIGTERM\"", s->url);
		chk_cluster_signal(d->cl, i, SIGTERM);
		s->state = CHK_SRV_TERMINATING;
		d->st.reconfigs++;
		d->st.leaves++;
		if (d->o->verbose)
			chk_log("leave: SIGTERM to %s", s->url);
		return;
	}
	unsigned flags = step_flags(d);
	shardkv_admin_result res = {0};
	char what[128];
	size_t ne = nem_begin(d, "leave", "\"server\": \"%s\", \"how\": \"leave\"", s->url);
	int rv = shardkv_leave(d->admin, s->url, flags, &res);
	nem_end_rv(d, ne, rv, &res);
	gate_after(d, rv, &res);
	snprintf(what, sizeof(what), "leave %s", s->url);
	outcome(d, what, rv, &res, cfg->epoch, flags, &d->st.leaves);
	if (rv == 0 || rv == SHARDKV_ETIMEDOUT)
		s->state = CHK_SRV_LEAVING;
}

/* --kill: SIGKILLs an active server; it restarts a moment later. */
static void
step_kill(chk_driver *d, const shardkv_config *cfg)
{
	int idx[CHK_MAX_SERVERS];
	size_t n = active_servers(d, cfg, idx);

	if (n < MIN_ACTIVE)
		return;
	int i = idx[chk_rng_below(&d->rng, n)];
	chk_server *s = &d->cl->srv[i];
	size_t ne = nem_begin(d, "kill", "\"server\": \"%s\", \"signal\": \"SIGKILL\"", s->url);
	chk_cluster_signal(d->cl, i, SIGKILL);
	while (!chk_cluster_poll_exit(d->cl, i)) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	nem_end(d, ne, "\"result\": \"exited\"");
	s->state = CHK_SRV_KILLED;
	s->restart_ns =
	    chk_now_ns() +
	    (RESTART_MIN_MS + chk_rng_below(&d->rng, RESTART_MAX_MS - RESTART_MIN_MS)) * 1000000u;
	d->st.kills++;
	if (d->o->verbose)
		chk_log("kill: SIGKILL to %s", s->url);
}

/* The system calls of a log write: the records go to the file, then (with
 * --fsync always) to the disk, and only then are their writes answered. */
static const long write_calls[] = {
    SYS_fdatasync, SYS_fsync, SYS_pwrite64, SYS_pwritev,
#ifdef SYS_pwritev2
    SYS_pwritev2,
#endif
};

static const char *
write_call_name(long nr)
{
	if (nr == SYS_fdatasync)
		return "fdatasync";
	if (nr == SYS_fsync)
		return "fsync";
	if (nr < 0)
		return "none";
	return "pwrite";
}

/* The victim of a timed kill: the owner of a random key of the checker's
 * among the active servers idx[0..n) (not a server that holds filler
 * only), else any of them. */
static int
pick_victim(chk_driver *d, const shardkv_config *cfg, const int *idx, size_t n)
{
	size_t nb = 0;
	const char **b = chk_workload_boundaries(d->w, &nb);
	int v = idx[chk_rng_below(&d->rng, n)];

	for (int tries = 0; b != NULL && nb > 0 && tries < 8; tries++) {
		const char *k = b[chk_rng_below(&d->rng, nb)];
		uint32_t id = owner_of(cfg, k, strlen(k), NULL);
		for (size_t j = 0; j < n; j++) {
			const shardkv_node *nd = node_by_url(cfg, d->cl->srv[idx[j]].url);
			if (nd != NULL && nd->id == id) {
				free(b);
				return idx[j];
			}
		}
	}
	free(b);
	return v;
}

/* Waits up to AIM_MS for a thread of server i to be inside a log write or
 * sync. Returns the system call, or -1 when none came. */
static long
aim(chk_cluster *cl, int i)
{
	uint64_t until = chk_now_ns() + (uint64_t)AIM_MS * 1000000u;
	size_t n = sizeof(write_calls) / sizeof(write_calls[0]);
	long nr;

	while ((nr = chk_cluster_server_syscall(cl, i, write_calls, n)) < 0 &&
	       chk_now_ns() < until) {
		struct timespec ts = {0, (long)AIM_POLL_US * 1000};
		nanosleep(&ts, NULL);
	}
	return nr;
}

/* The active servers of a timed kill into idx (their count), or 0 when
 * one is down already or too few are active. */
static size_t
kill_candidates(chk_driver *d, int *idx, shardkv_config **cfgp)
{
	chk_cluster *cl = d->cl;
	shardkv_config *cfg = NULL;
	size_t n;

	*cfgp = NULL;
	for (int i = 0; i < cl->nservers; i++)
		if (cl->srv[i].state == CHK_SRV_KILLED)
			return 0;
	if (shardkv_config_get(d->admin, 0, &cfg) != 0)
		return 0;
	if ((n = active_servers(d, cfg, idx)) < MIN_ACTIVE) {
		shardkv_config_free(cfg);
		return 0;
	}
	*cfgp = cfg;
	return n;
}

/* SIGKILLs server i (what it was doing: `in`), waits for its exit and
 * restarts it at once, each step a nemesis event. */
static void
kill_and_restart(chk_driver *d, int i, const char *in)
{
	chk_cluster *cl = d->cl;
	chk_server *s = &cl->srv[i];
	size_t ne = nem_begin(d, "kill",
	                      "\"server\": \"%s\", \"signal\": \"SIGKILL\", \"timed\": true, "
	                      "\"in\": \"%s\"",
	                      s->url, in);
	chk_cluster_signal(cl, i, SIGKILL);
	while (!chk_cluster_poll_exit(cl, i)) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	nem_end(d, ne, "\"result\": \"exited\"");
	d->st.kills++;
	if (d->o->verbose)
		chk_log("kill: SIGKILL to %s (in %s)", s->url, in);
	ne = nem_begin(d, "restart", "\"server\": \"%s\"", s->url);
	if (chk_cluster_restart_server(cl, i) == 0) {
		nem_end(d, ne, "\"result\": \"started\"");
		d->st.restarts++;
	} else {
		nem_end(d, ne, "\"result\": \"failed\"");
		s->state = CHK_SRV_STOPPED;
		chk_log("cannot restart %s", s->url);
	}
}

/* --kill-interval: SIGKILLs a server, in a log write when one comes within
 * AIM_MS, and restarts it at once. One server down at a time. */
static void
timed_kill(chk_driver *d)
{
	chk_cluster *cl = d->cl;
	shardkv_config *cfg;
	int idx[CHK_MAX_SERVERS];
	size_t n = kill_candidates(d, idx, &cfg);

	if (n == 0)
		return;
	int i = pick_victim(d, cfg, idx, n);
	shardkv_config_free(cfg);
	chk_server *s = &cl->srv[i];

	long nr = aim(cl, i);
	if (chk_cluster_poll_exit(cl, i)) {
		/* It exited by itself while the kill was aimed. */
		chk_log("%s exited unexpectedly (status 0x%x); log %s", s->url, s->exit_status,
		        s->log);
		s->crashed = true;
		s->state = CHK_SRV_STOPPED;
		d->st.crashes++;
		return;
	}
	d->st.kills_in_log += nr >= 0;
	kill_and_restart(d, i, write_call_name(nr));
}

#define HANDOVER_AIM_MS 1000u /* a handover kill waits this long at most for one */

/* The log lines of a handover step (migrate_out.c, migrate_in.c). */
static const char *const handover_marks[] = {" migrate fenced id=",
                                             " migrate incoming range committed id="};

/* Waits up to HANDOVER_AIM_MS for one of the servers idx[0..n) to log a
 * handover step, reading what their logs grow by. Returns the index of
 * that server (*mark: which step), or -1 when none came. */
static int
aim_handover(chk_cluster *cl, const int *idx, size_t n, int *mark)
{
	enum { TAIL = 96, CHUNK = 65536 };
	off_t at[CHK_MAX_SERVERS];
	char tail[CHK_MAX_SERVERS][TAIL];
	size_t ntail[CHK_MAX_SERVERS];
	char *buf = malloc(TAIL + CHUNK + 1);
	uint64_t until = chk_now_ns() + (uint64_t)HANDOVER_AIM_MS * 1000000u;
	int hit = -1;

	if (buf == NULL)
		return -1;
	for (size_t j = 0; j < n; j++) {
		struct stat st;
		at[j] = stat(cl->srv[idx[j]].log, &st) == 0 ? st.st_size : 0;
		ntail[j] = 0;
	}
	while (hit < 0 && chk_now_ns() < until) {
		for (size_t j = 0; j < n && hit < 0; j++) {
			int fd = open(cl->srv[idx[j]].log, O_RDONLY | O_CLOEXEC);
			ssize_t r;
			if (fd < 0)
				continue;
			/* What the last read ended with comes first: a mark cut
			 * between two reads is still found. */
			memcpy(buf, tail[j], ntail[j]);
			while (hit < 0 && (r = pread(fd, buf + ntail[j], CHUNK, at[j])) > 0) {
				size_t len = ntail[j] + (size_t)r;
				at[j] += r;
				buf[len] = '\0';
				for (int m = 0; m < 2 && hit < 0; m++)
					if (strstr(buf, handover_marks[m]) != NULL) {
						hit = idx[j];
						*mark = m;
					}
				ntail[j] = len < TAIL ? len : TAIL;
				memmove(buf, buf + len - ntail[j], ntail[j]);
				memcpy(tail[j], buf, ntail[j]);
			}
			close(fd);
		}
		if (hit < 0) {
			struct timespec ts = {0, (long)AIM_POLL_US * 1000};
			nanosleep(&ts, NULL);
		}
	}
	free(buf);
	return hit;
}

/* --kill-at-handover: SIGKILLs the server that has just logged a handover
 * step, and restarts it at once; nothing when none came within
 * HANDOVER_AIM_MS. One server down at a time. */
static void
handover_kill(chk_driver *d)
{
	shardkv_config *cfg;
	int idx[CHK_MAX_SERVERS], mark = 0;
	size_t n = kill_candidates(d, idx, &cfg);

	if (n == 0)
		return;
	shardkv_config_free(cfg);
	int i = aim_handover(d->cl, idx, n, &mark);
	if (i < 0)
		return;
	d->st.kills_at_handover++;
	kill_and_restart(d, i, mark == 0 ? "a fenced source" : "a committed destination");
}

/* A delayed SIGKILL (the thread owns it). */
struct delayed_kill {
	pid_t pid;         /* whom */
	unsigned delay_us; /* after how long */
};

static void *
delayed_kill_main(void *arg)
{
	struct delayed_kill *k = arg;
	struct timespec ts = {(time_t)(k->delay_us / 1000000u),
	                      (long)(k->delay_us % 1000000u) * 1000};

	nanosleep(&ts, NULL);
	kill(k->pid, SIGKILL);
	free(k);
	return NULL;
}

/* SIGKILLs the controller leader replica in delay_us (on a thread of its
 * own; at once for 0) and has it restarted 300..1500 ms later. Only one
 * replica is down at a time (a majority stays up). Returns the replica's
 * index, or -1 when none was killed (one is down already, no leader known). */
static int
kill_ctl_leader(chk_driver *d, unsigned delay_us)
{
	chk_cluster *cl = d->cl;
	shardkv_config *st = NULL;
	struct delayed_kill *k;
	pthread_t t;
	int leader = -1;

	for (int i = 0; i < cl->nctl; i++)
		if (cl->rkilled[i] || cl->rpid[i] <= 0)
			return -1;
	if (shardkv_status(d->admin, &st) != 0)
		return -1;
	for (size_t i = 0; i < st->ncontrollers; i++)
		if (strcmp(st->controllers[i].role, "leader") == 0 && st->controllers[i].id >= 1 &&
		    (int)st->controllers[i].id <= cl->nctl)
			leader = (int)st->controllers[i].id - 1;
	shardkv_config_free(st);
	if (leader < 0 || (k = malloc(sizeof(*k))) == NULL)
		return -1;
	k->pid = cl->rpid[leader];
	k->delay_us = delay_us;
	/* Marked first, so that its exit does not count as a crash. */
	cl->rkilled[leader] = true;
	cl->rrestart_ns[leader] =
	    chk_now_ns() +
	    (RESTART_MIN_MS + chk_rng_below(&d->rng, RESTART_MAX_MS - RESTART_MIN_MS)) * 1000000u;
	if (delay_us == 0 || pthread_create(&t, NULL, delayed_kill_main, k) != 0) {
		kill(k->pid, SIGKILL);
		free(k);
	} else {
		pthread_detach(t);
	}
	d->st.ctl_kills++;
	return leader;
}

/* --kill-controller: kills the leader replica 0..20 ms into a move or a
 * rebalance. */
static void
step_kill_ctl(chk_driver *d, const shardkv_config *cfg)
{
	unsigned delay_us = 1 + (unsigned)chk_rng_below(&d->rng, 20000);
	int leader = kill_ctl_leader(d, delay_us);

	if (leader < 0)
		return;
	size_t ne = nem_begin(d, "kill-controller", "\"replica\": %d, \"delay_us\": %u", leader + 1,
	                      delay_us);
	nem_end(d, ne, "\"result\": \"sent\"");
	if (d->o->verbose)
		chk_log("kill-controller: SIGKILL to leader replica %d in %u us", leader + 1,
		        delay_us);
	if (chk_rng_below(&d->rng, 2) == 0)
		step_move(d, cfg);
	else
		step_rebalance(d, cfg);
}

/* ---------------------------------------------------------------------------
 * --pause: SIGSTOP a server for longer than its lease, then SIGCONT
 * ------------------------------------------------------------------------- */

static void *
pauser_main(void *arg)
{
	struct pauser *p = arg;
	uint64_t until;

	p->stop_ns = chk_now_ns();
	kill(p->pid, SIGSTOP);
	until = p->stop_ns + (uint64_t)p->ms * 1000000u;
	while (chk_now_ns() < until && !atomic_load(&p->cut_short)) {
		struct timespec ts = {0, 5000000};
		nanosleep(&ts, NULL);
	}
	kill(p->pid, SIGCONT);
	p->cont_ns = chk_now_ns();
	atomic_store(&p->done, true);
	return NULL;
}

/* Whether a server is down on purpose or waits to be restarted: no pause
 * or fault for good starts then. */
static bool
any_down(const chk_driver *d)
{
	for (int i = 0; i < d->cl->nservers; i++)
		if (d->cl->srv[i].state == CHK_SRV_KILLED || d->cl->srv[i].state == CHK_SRV_DEAD ||
		    d->cl->srv[i].state == CHK_SRV_PAUSED)
			return true;
	return d->gone_node != 0;
}

/* Whether some range of cfg has fewer replicas than `want` (a range that
 * arrived by migration is single until its replicas are added), fewer
 * in-sync replicas than replicas, or a fence (the previous primary of a
 * transfer, about to leave the ISR to be copied again): a fault now could
 * take its last in-sync copy (one fault at a time, as the replication
 * guarantees are stated: doc/replication.md). */
static bool
under_replicated(const shardkv_config *cfg, unsigned want)
{
	for (size_t i = 0; i < cfg->nranges; i++) {
		const shardkv_range *r = &cfg->ranges[i];
		if (r->nreplicas < want || r->ninsync < r->nreplicas || r->fence != 0)
			return true;
	}
	return false;
}

/* Whether key is in a range that a migration of cfg moves. */
static bool
moving(const shardkv_config *cfg, const char *key)
{
	size_t kl = strlen(key);

	for (size_t i = 0; i < cfg->nmigrations && cfg->migrations; i++) {
		const shardkv_migration *m = &cfg->migrations[i];
		size_t sl = m->start.len, el = m->end.len;
		int cs = sl ? memcmp(m->start.data, key, sl < kl ? sl : kl) : 0;
		int ce = el ? memcmp(key, m->end.data, kl < el ? kl : el) : -1;
		if ((cs < 0 || (cs == 0 && sl <= kl)) &&
		    (el == 0 || ce < 0 || (ce == 0 && kl < el)))
			return true;
	}
	return false;
}

/* The owner of one of the checker's keys in use (a random one, from a
 * random start through all of them) among the servers idx[0..n), or -1. */
static int
key_owner(chk_driver *d, const shardkv_config *cfg, const int *idx, size_t n)
{
	size_t nb = 0;
	const char **b = chk_workload_boundaries(d->w, &nb);
	int v = -1;

	for (size_t t = 0, k0 = nb ? chk_rng_below(&d->rng, nb) : 0; b && t < nb && v < 0; t++) {
		const char *k = b[(k0 + t) % nb];
		if (moving(cfg, k))
			continue;
		uint32_t id = owner_of(cfg, k, strlen(k), NULL);
		for (size_t j = 0; j < n && v < 0; j++) {
			const shardkv_node *nd = node_by_url(cfg, d->cl->srv[idx[j]].url);
			if (nd != NULL && nd->id == id)
				v = idx[j];
		}
	}
	free(b);
	return v;
}

/* Starts a pause of the owner of one of the checker's keys. */
static void
pause_start(chk_driver *d)
{
	chk_cluster *cl = d->cl;
	shardkv_config *cfg = NULL;
	int idx[CHK_MAX_SERVERS];

	if (any_down(d) || d->npauses >= MAX_PAUSES)
		return;
	if (d->npauses == d->cappauses) {
		size_t cap = d->cappauses ? 2 * d->cappauses : 16;
		pause_rec *x = realloc(d->pauses, cap * sizeof(*x));
		if (x == NULL)
			return;
		d->pauses = x;
		d->cappauses = cap;
	}
	if (shardkv_config_get(d->admin, 0, &cfg) != 0)
		return;
	size_t n = active_servers(d, cfg, idx);
	if (n == 0) {
		shardkv_config_free(cfg);
		return;
	}
	int i = key_owner(d, cfg, idx, n);
	if (i < 0) { /* none of the keys is on a server that may stop now */
		shardkv_config_free(cfg);
		return;
	}
	const shardkv_node *nd = node_by_url(cfg, cl->srv[i].url);
	pause_rec *r = &d->pauses[d->npauses];
	memset(r, 0, sizeof(*r));
	r->node = nd ? nd->id : 0;
	r->before = cfg;
	r->epoch = cfg->epoch;
	memset(&d->pz, 0, sizeof(d->pz));
	d->pz.pid = cl->srv[i].pid;
	d->pz.ms = d->o->pause_ms;
	r->nem = nem_begin(d, "pause",
	                   "\"server\": \"%s\", \"node\": %" PRIu32
	                   ", \"ms\": %u, \"signal\": \"SIGSTOP\"",
	                   cl->srv[i].url, r->node, d->o->pause_ms);
	cl->srv[i].state = CHK_SRV_PAUSED;
	if (pthread_create(&d->pthr, NULL, pauser_main, &d->pz) != 0) {
		cl->srv[i].state = CHK_SRV_RUNNING;
		nem_end(d, r->nem, "\"result\": \"not started\"");
		shardkv_config_free(cfg);
		return;
	}
	d->npauses++;
	d->pausing = true;
	d->pause_srv = i;
	if (d->o->verbose)
		chk_log("pause: SIGSTOP to %s (node %" PRIu32 ") for %u ms", cl->srv[i].url,
		        r->node, d->o->pause_ms);
}

/* Ends the pause once its thread has sent SIGCONT (at once when `now`). */
static void
pause_finish(chk_driver *d, bool now)
{
	if (!d->pausing)
		return;
	if (now)
		atomic_store(&d->pz.cut_short, true);
	else if (!atomic_load(&d->pz.done))
		return;
	pthread_join(d->pthr, NULL);
	d->pausing = false;
	pause_rec *r = &d->pauses[d->npauses - 1];
	chk_server *s = &d->cl->srv[d->pause_srv];
	r->stop = d->pz.stop_ns;
	r->cont = d->pz.cont_ns;
	if (r->nem < d->nnem) {
		d->nem[r->nem].start = r->stop;
		d->nem[r->nem].end = r->cont;
		snprintf(d->nem[r->nem].result, sizeof(d->nem[r->nem].result),
		         "\"result\": \"resumed\"");
	}
	if (s->state == CHK_SRV_PAUSED)
		s->state = CHK_SRV_RUNNING;
	if (shardkv_config_get(d->admin, 0, &r->after) != 0)
		r->after = NULL;
	/* Every configuration between: a key given away and back in them
	 * was not the paused node's throughout (bounded: a pause sees a few
	 * dozen epochs). */
	if (r->before && r->after && r->after->epoch > r->before->epoch + 1 &&
	    r->after->epoch - r->before->epoch - 1 <= MID_MAX &&
	    (r->mid = calloc(r->after->epoch - r->before->epoch - 1, sizeof(*r->mid))) != NULL) {
		r->nmid = r->after->epoch - r->before->epoch - 1;
		for (size_t j = 0; j < r->nmid; j++)
			if (shardkv_config_get(d->admin, r->before->epoch + 1 + j, &r->mid[j]) != 0)
				r->mid[j] = NULL;
	}
	d->st.pauses++;
	d->watch = d->npauses - 1;
	d->watch_until = r->cont + (uint64_t)WATCH_MS * 1000000u;
	/* The next SIGSTOP: --pause-interval after this one's, give or take
	 * half, and not before PAUSE_GAP_MS from now. */
	uint64_t iv = (uint64_t)d->o->pause_iv_ms * 1000000u;
	uint64_t next = r->stop + iv / 2 + chk_rng_below(&d->rng, iv + 1);
	uint64_t gap = chk_now_ns() + (uint64_t)PAUSE_GAP_MS * 1000000u;
	d->next_pause = next > gap ? next : gap;
	if (d->o->verbose)
		chk_log("pause: SIGCONT to %s after %.0f ms", s->url,
		        (double)(r->cont - r->stop) / 1e6);
}

/* Logs an instant nemesis event about a node's state. */
static void
nem_node(chk_driver *d, const char *f, uint32_t node, const char *why)
{
	size_t ne = nem_begin(d, f, "\"node\": %" PRIu32 ", \"cause\": \"%s\"", node, why);
	nem_end(d, ne, "\"result\": \"seen\"");
	if (d->o->verbose)
		chk_log("%s: node %" PRIu32 " (%s)", f, node, why);
}

/* Notes the paused node's state in cfg: `down`, then `active` again. */
static void
pause_note(chk_driver *d, pause_rec *r, const shardkv_config *cfg)
{
	const shardkv_node *nd = NULL;

	for (size_t i = 0; i < cfg->nnodes; i++)
		if (cfg->nodes[i].id == r->node)
			nd = &cfg->nodes[i];
	if (nd && nd->state == SHARDKV_NODE_DOWN && !r->down_seen) {
		r->down_seen = true;
		d->st.pause_downs++;
		nem_node(d, "node-down", r->node, "pause");
	} else if (nd && nd->state == SHARDKV_NODE_ACTIVE && r->down_seen && !r->back_seen) {
		r->back_seen = true;
		d->st.pause_backs++;
		nem_node(d, "node-active", r->node, "pause");
	}
}

/* Watches the paused (or lately resumed) node through every epoch
 * published since the last tick (the driver may have waited in a step
 * meanwhile): `down`, then `active` again, each a nemesis event. */
static void
pause_watch(chk_driver *d)
{
	shardkv_config *cfg = NULL;

	if (d->watch == SIZE_MAX && !d->pausing)
		return;
	pause_rec *r = d->pausing ? &d->pauses[d->npauses - 1] : &d->pauses[d->watch];
	if (shardkv_config_get(d->admin, 0, &cfg) != 0)
		return;
	uint64_t from = r->epoch + 1;
	if (cfg->epoch > AUDIT_MAX && from < cfg->epoch - AUDIT_MAX)
		from = cfg->epoch - AUDIT_MAX;
	for (uint64_t e = from; e < cfg->epoch; e++) {
		shardkv_config *old = NULL;
		if (shardkv_config_get(d->admin, e, &old) == 0)
			pause_note(d, r, old);
		shardkv_config_free(old);
	}
	if (cfg->epoch > r->epoch) {
		pause_note(d, r, cfg);
		r->epoch = cfg->epoch;
	}
	shardkv_config_free(cfg);
	if (!d->pausing && (r->back_seen || chk_now_ns() >= d->watch_until)) {
		if (r->down_seen && !r->back_seen) {
			chk_log("node %" PRIu32 " still down %u ms after its SIGCONT", r->node,
			        WATCH_MS);
			d->st.failed++;
		}
		d->watch = SIZE_MAX;
	}
}

void
chk_driver_pause_check(chk_driver *d, const chk_key *keys, size_t nkeys, const chk_op *ops,
                       size_t nops, chk_pause_check *out)
{
	bool *own = calloc(nkeys + 1, sizeof(*own)), *used = calloc(nkeys + 1, sizeof(*used));

	memset(out, 0, sizeof(*out));
	if (own == NULL || used == NULL) {
		free(own);
		free(used);
		return;
	}
	/* Keys the clients used (of an append key's generations, few are). */
	for (size_t i = 0; i < nops; i++)
		if (ops[i].key < nkeys && ops[i].client != 0)
			used[ops[i].key] = true;
	for (size_t p = 0; p < d->npauses; p++) {
		pause_rec *r = &d->pauses[p];
		uint64_t first = UINT64_MAX, acked = 0, failed = 0, unavail = 0, nown = 0, held = 0;
		if (r->cont == 0 || r->before == NULL || r->after == NULL)
			continue;
		/* Its keys: owned before the SIGSTOP, after the SIGCONT and in
		 * every configuration between (none read: only before and after),
		 * and moving in none of them: a range that moves to the stopped
		 * node is named its own, but its source serves it until the move
		 * commits. */
		for (size_t k = 0; k < nkeys; k++) {
			const char *kn = keys[k].name;
			size_t kl = strlen(kn);
			own[k] = used[k] && owner_of(r->before, kn, kl, NULL) == r->node &&
			         owner_of(r->after, kn, kl, NULL) == r->node &&
			         !chk_config_moving(r->before, kn, kl) &&
			         !chk_config_moving(r->after, kn, kl);
			for (size_t j = 0; own[k] && j < r->nmid; j++)
				own[k] = r->mid[j] == NULL ||
				         (owner_of(r->mid[j], kn, kl, NULL) == r->node &&
				          !chk_config_moving(r->mid[j], kn, kl));
			nown += own[k];
		}
		uint64_t from = r->stop + (uint64_t)PAUSE_GRACE_MS * 1000000u;
		for (size_t i = 0; i < nops; i++) {
			const chk_op *o = &ops[i];
			if (o->key >= nkeys || !own[o->key] || o->client == 0)
				continue;
			if (o->status != CHK_FAILED) {
				if (o->complete >= from && o->complete < r->cont)
					acked++;
				else if (o->complete >= r->cont && o->complete < first)
					first = o->complete;
				held += o->complete >= r->cont && o->invoke >= r->stop &&
				        o->invoke < r->cont;
			} else if (o->invoke < r->cont && o->ret >= r->stop) {
				failed++;
				unavail += o->err == SHARDKV_EUNAVAIL;
			}
		}
		out->keys += nown;
		out->acked_paused += acked;
		out->held += held;
		out->failed += failed;
		out->unavailable += unavail;
		long long back = -1;
		if (first != UINT64_MAX) {
			back = (long long)((first - r->cont) / 1000000u);
			out->served_again++;
			if ((uint64_t)back > out->back_ms_max)
				out->back_ms_max = (uint64_t)back;
		}
		if (acked)
			chk_log("node %" PRIu32 " was stopped, yet %" PRIu64
			        " operations on its keys succeeded meanwhile",
			        r->node, acked);
		if (r->nem < d->nnem)
			snprintf(d->nem[r->nem].result, sizeof(d->nem[r->nem].result),
			         "\"result\": \"resumed\", \"keys\": %" PRIu64
			         ", \"acked_stopped\": %" PRIu64 ", \"held\": %" PRIu64
			         ", \"failed\": %" PRIu64 ", \"unavailable\": %" PRIu64
			         ", \"back_ms\": %lld",
			         nown, acked, held, failed, unavail, back);
	}
	free(own);
	free(used);
}

/* ---------------------------------------------------------------------------
 * --kill-no-restart and --wipe: a server gone for good (ranges with
 * replicas only: the options refuse one copy)
 * ------------------------------------------------------------------------- */

/* --kill-controller-in-failover: SIGKILLs the controller leader now, in the
 * failover of gone_node; `down` says whether the node was seen down. */
static void
failover_kill_ctl(chk_driver *d, bool down)
{
	uint64_t after_ms = (chk_now_ns() - d->gone_since) / 1000000u;
	int leader;

	d->fo_kill_at = 0;
	d->fo_kill_on_down = false;
	if ((leader = kill_ctl_leader(d, 0)) < 0) {
		chk_log("kill-controller in the failover of node %" PRIu32 ": no leader to kill",
		        d->gone_node);
		return;
	}
	d->st.fo_ctl_kills++;
	d->st.fo_ctl_before_down += !down;
	size_t ne = nem_begin(d, "kill-controller",
	                      "\"replica\": %d, \"failover_of\": %" PRIu32
	                      ", \"after_server_kill_ms\": %" PRIu64 ", \"node_down_seen\": %s",
	                      leader + 1, d->gone_node, after_ms, down ? "true" : "false");
	nem_end(d, ne, "\"result\": \"sent\"");
	if (d->o->verbose)
		chk_log("kill-controller: SIGKILL to leader replica %d, %" PRIu64
		        " ms into the failover of node %" PRIu32 " (%s)",
		        leader + 1, after_ms, d->gone_node, down ? "seen down" : "not seen down");
}

/* SIGKILLs the owner of one of the checker's keys. --kill-no-restart leaves
 * it dead; --wipe deletes its data dir and starts it again, on a new
 * address, as a new node (--join). Either way its old node is removed once
 * the controller says it is down (gone_watch). */
static void
dead_fault(chk_driver *d)
{
	chk_cluster *cl = d->cl;
	shardkv_config *cfg = NULL;
	int idx[CHK_MAX_SERVERS];
	bool wipe = d->o->wipe && (!d->o->kill_no_restart || chk_rng_below(&d->rng, 2) == 0);

	if (any_down(d) || shardkv_config_get(d->admin, 0, &cfg) != 0)
		return;
	size_t n = active_servers(d, cfg, idx);
	if (n <= MIN_ACTIVE || count_active(cfg) <= MIN_ACTIVE ||
	    under_replicated(cfg, d->o->replicas < count_active(cfg)
	                              ? d->o->replicas
	                              : (unsigned)count_active(cfg))) {
		shardkv_config_free(cfg);
		return;
	}
	int i = pick_victim(d, cfg, idx, n);
	chk_server *s = &cl->srv[i];
	const shardkv_node *nd = node_by_url(cfg, s->url);
	uint32_t node = nd ? nd->id : 0;
	shardkv_config_free(cfg);
	if (node == 0)
		return;
	size_t ne = nem_begin(d, "kill",
	                      "\"server\": \"%s\", \"node\": %" PRIu32
	                      ", \"signal\": \"SIGKILL\", \"restart\": %s",
	                      s->url, node, wipe ? "\"wiped\"" : "false");
	chk_cluster_kill_server(cl, i);
	nem_end(d, ne, "\"result\": \"exited\"");
	s->state = CHK_SRV_DEAD;
	d->st.dead_kills++;
	d->gone_node = node;
	d->gone_since = chk_now_ns();
	d->gone_srv = i;
	if (d->o->verbose)
		chk_log("kill: SIGKILL to %s (node %" PRIu32 "), %s", s->url, node,
		        wipe ? "to be wiped" : "not restarted");
	if (d->o->kill_ctl_failover) {
		/* Odd faults at a random moment up to a little past the
		 * leader's down declaration (the new leader must declare it
		 * again), even ones once the node is seen down (the new leader
		 * must carry on with the removal, the replacement and the ISR
		 * changes). */
		if (d->st.dead_kills % 2 == 1) {
			d->fo_kill_at =
			    d->gone_since + chk_rng_below(&d->rng, FO_KILL_MAX_MS + 1) * 1000000u;
			d->fo_kill_on_down = false;
		} else {
			d->fo_kill_at = 0;
			d->fo_kill_on_down = true;
		}
	}
	if (!wipe)
		return;
	char old[sizeof(s->url)];
	memcpy(old, s->url, sizeof(old));
	ne = nem_begin(d, "wipe", "\"server\": \"%s\", \"data_dir\": \"%s\"", old, s->data);
	if (chk_cluster_wipe_server(cl, i) != 0 || chk_cluster_start_server(cl, i, true) != 0) {
		nem_end(d, ne, "\"result\": \"failed\"");
		chk_log("cannot wipe and start %s again", old);
		d->st.failed++;
		return;
	}
	nem_end(d, ne, "\"result\": \"started\", \"address\": \"%s\"", s->url);
	/* A new node on a new address: registered like any --join. */
	d->gone_srv = -1;
	d->join_pending[i] = true;
	d->join_nem[i] =
	    nem_begin(d, "join", "\"server\": \"%s\", \"how\": \"--join\", \"wiped\": %" PRIu32,
	              s->url, node);
	d->st.replacements++;
	gate_close(d);
}

/* Whether node is `gone` (or no longer listed) in the latest configuration. */
static bool
gone_in_config(chk_driver *d, uint32_t node)
{
	shardkv_config *cfg = NULL;
	bool gone = true;

	if (shardkv_config_get(d->admin, 0, &cfg) != 0)
		return false;
	for (size_t i = 0; i < cfg->nnodes; i++)
		if (cfg->nodes[i].id == node)
			gone = cfg->nodes[i].state == SHARDKV_NODE_GONE;
	shardkv_config_free(cfg);
	return gone;
}

/* Removes the node killed for good once it is down, then (--kill-no-restart)
 * starts a replacement server that joins. */
static void
gone_watch(chk_driver *d)
{
	shardkv_config *cfg = NULL;
	shardkv_admin_result res = {0};
	uint32_t lost = 0;
	char node[16];

	if (d->gone_node == 0 || shardkv_config_get(d->admin, 0, &cfg) != 0)
		return;
	const shardkv_node *nd = NULL;
	for (size_t i = 0; i < cfg->nnodes; i++)
		if (cfg->nodes[i].id == d->gone_node)
			nd = &cfg->nodes[i];
	bool down = nd && nd->state == SHARDKV_NODE_DOWN;
	uint64_t epoch = cfg->epoch;
	shardkv_config_free(cfg);
	if (!down) {
		if (chk_now_ns() - d->gone_since > (uint64_t)DEAD_DOWN_MS * 1000000u) {
			chk_log("node %" PRIu32 " not down %u ms after its SIGKILL; not removed",
			        d->gone_node, DEAD_DOWN_MS);
			d->st.failed++;
			d->st.fo_unfinished += d->o->kill_ctl_failover;
			d->gone_node = 0;
			d->fo_kill_at = 0;
			d->fo_kill_on_down = false;
		}
		return;
	}
	if (d->fo_kill_on_down || d->fo_kill_at) {
		/* Seen down before the timed kill came: kill now all the same. */
		failover_kill_ctl(d, true);
		return; /* removed at a later tick, through the new leader */
	}
	nem_node(d, "node-down", d->gone_node, "killed");
	snprintf(node, sizeof(node), "%" PRIu32, d->gone_node);
	size_t ne = nem_begin(d, "remove", "\"node\": %" PRIu32, d->gone_node);
	gate_close(d);
	/* With one copy (SHARDKV_CHECKER_ONE_COPY_FAULTS) its ranges go to
	 * other nodes empty: the history shows what they held as lost. */
	unsigned flags =
	    d->o->one_copy_faults && d->o->replicas <= 1 ? SHARDKV_ACCEPT_DATA_LOSS : 0;
	int rv = shardkv_remove(d->admin, node, flags, &res, &lost);
	nem_end_rv(d, ne, rv, &res);
	if (rv == 0 && lost)
		chk_log("remove %s: %" PRIu32 " ranges lost their only copy", node, lost);
	gate_after(d, rv, &res);
	if (rv == SHARDKV_EBUSY) {
		d->st.busy++;
		return; /* tried again at the next tick */
	}
	if (rv != 0 && d->o->kill_ctl_failover && !gone_in_config(d, d->gone_node) &&
	    chk_now_ns() - d->gone_since < 2ull * DEAD_DOWN_MS * 1000000u) {
		/* Most likely the killed leader's: tried again through the next. */
		chk_log("remove %s: %s (%s); trying again", node, shardkv_strerror(rv),
		        shardkv_errmsg());
		d->st.busy++;
		return;
	}
	if (rv != 0 && gone_in_config(d, d->gone_node)) {
		/* Committed by a leader that died before it answered. */
		rv = 0;
		res.epoch = epoch + 1;
	}
	if (rv != 0) {
		chk_log("remove %s failed: %s (%s)", node, shardkv_strerror(rv), shardkv_errmsg());
		d->st.failed++;
	} else {
		d->st.removes++;
		d->st.reconfigs += res.epoch > epoch;
	}
	d->gone_node = 0;
	if (d->gone_srv >= 0) {
		/* --kill-no-restart: the slot is free again; a replacement joins. */
		d->cl->srv[d->gone_srv].state = CHK_SRV_STOPPED;
		d->gone_srv = -1;
		int i = chk_cluster_add_server(d->cl, true);
		if (i < 0) {
			chk_log("cannot start a replacement server");
			d->st.failed++;
			return;
		}
		gate_close(d);
		d->join_pending[i] = true;
		d->join_nem[i] = nem_begin(
		    d, "join", "\"server\": \"%s\", \"how\": \"--join\", \"replaces\": %s",
		    d->cl->srv[i].url, node);
		d->st.replacements++;
	}
	uint64_t iv = (uint64_t)d->o->fault_iv_ms * 1000000u;
	d->next_fault = chk_now_ns() + iv / 2 + chk_rng_below(&d->rng, iv + 1);
}

static void
one_step(chk_driver *d)
{
	shardkv_config *cfg = NULL;
	int rv = shardkv_config_get(d->admin, 0, &cfg);

	if (rv != 0) {
		d->st.failed++;
		chk_log("config failed: %s (%s)", shardkv_strerror(rv), shardkv_errmsg());
		return;
	}
	/* Weighted choice among the steps that are possible now. */
	enum { MOVE, REBALANCE, JOIN, LEAVE, KILL, KILL_CTL, NKINDS };
	static const unsigned weight[NKINDS] = {50, 12, 12, 12, 15, 15};
	bool ok[NKINDS] = {true, true, false, false, false, false};
	if (d->cl) {
		int idx[CHK_MAX_SERVERS];
		size_t members = 0, act = active_servers(d, cfg, idx);
		for (int i = 0; i < d->cl->nservers; i++)
			members += d->cl->srv[i].pid > 0 && d->cl->srv[i].state == CHK_SRV_RUNNING;
		ok[JOIN] = members < d->max_active && d->cl->nservers < CHK_MAX_SERVERS;
		ok[LEAVE] = act > MIN_ACTIVE;
		ok[KILL] = d->o->kill && act >= MIN_ACTIVE;
		ok[KILL_CTL] = d->o->kill_ctl && d->cl->nctl > 2;
	}
	unsigned total = 0;
	for (int k = 0; k < NKINDS; k++)
		total += ok[k] ? weight[k] : 0;
	uint64_t r = chk_rng_below(&d->rng, total);
	int kind = 0;
	while (!ok[kind] || r >= weight[kind]) {
		r -= ok[kind] ? weight[kind] : 0;
		kind++;
	}
	switch (kind) {
	case MOVE:
		step_move(d, cfg);
		break;
	case REBALANCE:
		step_rebalance(d, cfg);
		break;
	case JOIN:
		step_join(d, cfg);
		break;
	case LEAVE:
		step_leave(d, cfg);
		break;
	case KILL:
		step_kill(d, cfg);
		break;
	default:
		step_kill_ctl(d, cfg);
		break;
	}
	shardkv_config_free(cfg);
}

/* Reaps exits, stops servers that are gone, restarts killed ones. */
static void
poll_procs(chk_driver *d, bool restart_now)
{
	chk_cluster *cl = d->cl;
	shardkv_config *cfg = NULL;
	bool need_cfg = false;

	int back = chk_cluster_restart_replicas(cl, restart_now);
	d->st.restarts += (uint64_t)back;
	if (back > 0) {
		size_t ne = nem_begin(d, "restart", "\"controller_replicas\": %d", back);
		nem_end(d, ne, "\"result\": \"started\"");
	}
	if (back && d->o->verbose)
		chk_log("restarted %d controller replica(s)", back);
	if (!chk_cluster_controller_alive(cl) && cl->ctl_crashed) {
		d->st.crashes++;
		cl->ctl_crashed = false;
		chk_log("the controller exited unexpectedly");
	}
	for (int i = 0; i < cl->nservers; i++) {
		chk_server *s = &cl->srv[i];
		need_cfg |= s->state == CHK_SRV_LEAVING || s->state == CHK_SRV_TERMINATING ||
		            d->join_pending[i];
	}
	if (need_cfg && shardkv_config_get(d->admin, 0, &cfg) != 0)
		cfg = NULL;
	for (int i = 0; i < cl->nservers; i++) {
		chk_server *s = &cl->srv[i];
		const shardkv_node *nd = cfg ? node_by_url(cfg, s->url) : NULL;
		if (d->join_pending[i] && nd) {
			d->join_pending[i] = false;
			nem_end(d, d->join_nem[i], "\"result\": \"registered\", \"node\": %" PRIu32,
			        nd->id);
			d->join_nem[i] = SIZE_MAX;
			d->st.reconfigs++;
			d->st.joins++;
			if (d->o->verbose)
				chk_log("join: %s registered as node %" PRIu32, s->url, nd->id);
		}
		if (s->state == CHK_SRV_LEAVING && nd && nd->state == SHARDKV_NODE_GONE) {
			chk_cluster_signal(cl, i, SIGINT);
			s->state = CHK_SRV_STOPPING;
		}
		/* Not reaped while the pauser thread may still signal its pid
		 * (it cannot exit while stopped anyway); checked after. */
		if (s->pid > 0 && s->state != CHK_SRV_PAUSED && chk_cluster_poll_exit(cl, i)) {
			if (s->state == CHK_SRV_TERMINATING && cfg && nd &&
			    nd->state != SHARDKV_NODE_GONE) {
				chk_log("%s exited after SIGTERM but is still %s: it did not drain "
				        "(status 0x%x)",
				        s->url, shardkv_node_state_name(nd->state), s->exit_status);
				s->crashed = true;
				d->st.crashes++;
			} else if (s->state == CHK_SRV_RUNNING || s->state == CHK_SRV_LEAVING ||
			           s->state == CHK_SRV_PAUSED) {
				chk_log("%s exited unexpectedly (status 0x%x); log %s", s->url,
				        s->exit_status, s->log);
				s->crashed = true;
				d->st.crashes++;
			}
			if (s->state == CHK_SRV_TERMINATING && d->join_nem[i] != SIZE_MAX) {
				nem_end(d, d->join_nem[i], "\"result\": \"exited\"");
				d->join_nem[i] = SIZE_MAX;
			}
			if (s->state != CHK_SRV_KILLED)
				s->state = CHK_SRV_STOPPED;
		}
		if (s->state == CHK_SRV_KILLED && (restart_now || chk_now_ns() >= s->restart_ns)) {
			size_t ne = nem_begin(d, "restart", "\"server\": \"%s\"", s->url);
			if (chk_cluster_restart_server(cl, i) == 0) {
				nem_end(d, ne, "\"result\": \"started\"");
				d->st.restarts++;
				if (d->o->verbose)
					chk_log("restarted %s", s->url);
			} else {
				nem_end(d, ne, "\"result\": \"failed\"");
				s->state = CHK_SRV_STOPPED;
				chk_log("cannot restart %s", s->url);
			}
		}
	}
	shardkv_config_free(cfg);
}

/* Whether something that may cut inside a group is under way: a server
 * joining by itself or draining after SIGTERM, or a recent failed step. */
static bool
cutting(const chk_driver *d)
{
	for (int i = 0; d->cl && i < d->cl->nservers; i++)
		if (d->join_pending[i] || d->cl->srv[i].state == CHK_SRV_TERMINATING)
			return true;
	return chk_now_ns() < d->gate_until;
}

/* Audits every epoch published since the last tick, clears the hot keys
 * once nothing moves, and opens the gate when nothing cuts any more. */
static void
watch_config(chk_driver *d)
{
	shardkv_config *cfg = NULL;

	uint64_t t = chk_now_ns(), since = d->cfg_read_ns;

	if ((d->o->groups == 0 && !d->hot) || shardkv_config_get(d->admin, 0, &cfg) != 0)
		return;
	d->cfg_read_ns = t;
	if (d->o->groups) {
		uint64_t from = d->seen_epoch + 1;
		if (cfg->epoch > AUDIT_MAX && from < cfg->epoch - AUDIT_MAX)
			from = cfg->epoch - AUDIT_MAX;
		for (uint64_t e = from; d->seen_epoch && e < cfg->epoch; e++) {
			shardkv_config *old = NULL;
			if (shardkv_config_get(d->admin, e, &old) == 0)
				d->st.gate_leaks +=
				    chk_workload_mk_audit(d->w, old, d->gate, since);
			shardkv_config_free(old);
		}
		if (cfg->epoch >= d->seen_epoch) {
			d->st.gate_leaks += chk_workload_mk_audit(d->w, cfg, d->gate, since);
			d->seen_epoch = cfg->epoch;
		}
		if (d->gate && cfg->epoch >= d->gate_epoch && !cutting(d)) {
			chk_workload_mk_unblock(d->w);
			d->gate = false;
		}
	}
	if (d->hot && cfg->nmigrations == 0) {
		chk_workload_hot_clear(d->w);
		d->hot = false;
	}
	shardkv_config_free(cfg);
}

unsigned
chk_driver_tick(chk_driver *d, bool steps)
{
	uint64_t now;

	if (d->cl) {
		poll_procs(d, false);
		pause_finish(d, false);
		pause_watch(d);
		gone_watch(d);
	}
	watch_config(d);
	now = chk_now_ns();
	if (steps && d->cl && d->o->pause_ms && !d->pausing && now >= d->next_pause) {
		pause_start(d);
		if (!d->pausing) /* nothing to pause now: try again a little later */
			d->next_pause = now + (uint64_t)PAUSE_GAP_MS * 1000000u;
		now = chk_now_ns();
	}
	if (d->cl && d->gone_node != 0 && d->fo_kill_at != 0 && now >= d->fo_kill_at) {
		failover_kill_ctl(d, false);
		now = chk_now_ns();
	}
	if (steps && d->cl && (d->o->kill_no_restart || d->o->wipe) && d->gone_node == 0 &&
	    now >= d->next_fault) {
		dead_fault(d);
		if (d->gone_node == 0) {
			uint64_t iv = (uint64_t)d->o->fault_iv_ms * 1000000u;
			d->next_fault = now + iv / 2 + chk_rng_below(&d->rng, iv + 1);
		}
		now = chk_now_ns();
	}
	if (steps && d->cl && d->o->kill_ms && now >= d->next_kill) {
		if (d->o->kill_handover)
			handover_kill(d);
		else
			timed_kill(d);
		uint64_t iv = (uint64_t)d->o->kill_ms * 1000000u;
		d->next_kill = chk_now_ns() + iv / 2 + chk_rng_below(&d->rng, iv + 1);
		now = chk_now_ns();
	}
	if (!steps || d->o->no_reconfig || now < d->next_step)
		return TICK_MS;
	one_step(d);
	watch_config(d);
	/* The next step after 0.5..1.5 times the interval. */
	uint64_t iv = (uint64_t)d->o->reconfig_ms * 1000000u;
	d->next_step = chk_now_ns() + iv / 2 + chk_rng_below(&d->rng, iv + 1);
	return TICK_MS;
}

/* --kill-controller-in-failover: every range must end up led by an active
 * node (the failovers the killed leaders began were finished by the next);
 * waits for it DEAD_DOWN_MS at most, counting fo_unfinished otherwise. */
static void
failovers_finished(chk_driver *d)
{
	uint64_t t0 = chk_now_ns();
	uint32_t bad = 0;

	poll_procs(d, true); /* every controller replica up */
	do {
		shardkv_config *cfg = NULL;
		struct timespec ts = {0, (long)TICK_MS * 1000000L};
		if (shardkv_config_get(d->admin, 0, &cfg) == 0) {
			bad = 0;
			for (size_t i = 0; i < cfg->nranges && bad == 0; i++) {
				const shardkv_node *nd = NULL;
				for (size_t k = 0; k < cfg->nnodes; k++)
					if (cfg->nodes[k].id == cfg->ranges[i].node)
						nd = &cfg->nodes[k];
				if (nd == NULL || nd->state != SHARDKV_NODE_ACTIVE)
					bad = cfg->ranges[i].node;
			}
			shardkv_config_free(cfg);
			if (bad == 0)
				return;
		}
		nanosleep(&ts, NULL);
	} while (chk_now_ns() - t0 < (uint64_t)DEAD_DOWN_MS * 1000000u);
	chk_log("failover unfinished: a range is still led by node %" PRIu32
	        ", which is not active, %u ms after the last fault",
	        bad, DEAD_DOWN_MS);
	d->st.fo_unfinished++;
}

void
chk_driver_settle_procs(chk_driver *d)
{
	if (d->cl) {
		pause_finish(d, true);
		poll_procs(d, true);
		/* A node killed for good near the end is removed before the final
		 * reads (gone_watch gives up DEAD_DOWN_MS after the kill; busy
		 * retries stop at twice that). */
		while (d->gone_node != 0 &&
		       chk_now_ns() - d->gone_since < 2ull * DEAD_DOWN_MS * 1000000u) {
			struct timespec ts = {0, (long)TICK_MS * 1000000L};
			if (d->fo_kill_at != 0 && chk_now_ns() >= d->fo_kill_at)
				failover_kill_ctl(d, false);
			gone_watch(d);
			if (d->gone_node != 0)
				nanosleep(&ts, NULL);
			poll_procs(d, false);
		}
		d->gone_node = 0;
		d->fo_kill_at = 0;
		d->fo_kill_on_down = false;
		if (d->o->kill_ctl_failover)
			failovers_finished(d);
	}
}
