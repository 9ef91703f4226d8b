/*
 * test_lease.c - the lease rule (common/lease.h) with injected clocks.
 *
 * Besides the edge cases of each function, a simulation plays the
 * protocol around the rule over many random runs, on clocks the test
 * drives: one server renewing every P on its own clock (running up to
 * `drift` fast or slow), controller leaders each on a clock of its own,
 * heartbeats and answers delayed or lost, partitions, pauses of the server
 * (SIGSTOP: it sends nothing and handles no answer until it resumes), and
 * leader changes after which the deposed leader goes on answering
 * heartbeats for up to an election timeout. The invariant
 * (doc/replication.md "Liveness and leases"): from the moment a leader
 * declares the node down, the server holds no lease, so no other primary
 * is chosen while it may still serve. The same simulation with the margin,
 * the election timeout or the new leader's wait taken away finds runs that
 * break it, which shows that it can.
 */
#include "common/lease.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define MS 1000000ull

static void
the_lease_holds_from_its_send_time_for_its_length(void **state)
{
	(void)state;
	assert_false(kv_lease_held(0, 2000 * MS, 5 * MS)); /* no renewal yet */
	assert_true(kv_lease_held(10 * MS, 2000 * MS, 10 * MS));
	assert_true(kv_lease_held(10 * MS, 2000 * MS, 2009 * MS));
	assert_false(kv_lease_held(10 * MS, 2000 * MS, 2010 * MS));
	assert_false(kv_lease_held(10 * MS, 2000 * MS, UINT64_MAX));
	/* A send time after now (not possible on one clock) holds nothing. */
	assert_false(kv_lease_held(10 * MS, 2000 * MS, 9 * MS));
}

static void
a_node_is_down_only_after_the_whole_silence_since_it_was_last_heard(void **state)
{
	(void)state;
	uint64_t down = kv_lease_down_ns(2000 * MS, 1000 * MS, 1000 * MS);
	assert_int_equal(down, 4000 * MS);
	assert_int_equal(kv_lease_down_ns(2000 * MS, 1000 * MS, 0), 3000 * MS);
	/* Heard: the last receive time, never before the leader began. */
	assert_int_equal(kv_lease_heard(0, 7 * MS), 7 * MS);
	assert_int_equal(kv_lease_heard(5 * MS, 7 * MS), 7 * MS);
	assert_int_equal(kv_lease_heard(9 * MS, 7 * MS), 9 * MS);
	assert_false(kv_lease_down_due(100 * MS, down, 4100 * MS));
	assert_true(kv_lease_down_due(100 * MS, down, 4101 * MS));
	/* A heartbeat recorded after `now` was read is no silence. */
	assert_false(kv_lease_down_due(100 * MS, down, 99 * MS));
	assert_false(kv_lease_down_due(100 * MS, down, 100 * MS));
}

/* ------------------------------------------------------------------------
 * The simulation: real time in steps of 1 ms.
 * ------------------------------------------------------------------------ */

#define STEP_MS   1u
#define RUN_MS    40000u /* simulated per run */
#define AFTER_MS  6000u  /* the run goes on this long after a declaration */
#define MAX_MSGS  256u
#define RENEW_MS  250u
#define TICK_MS   100u /* how often a leader looks at its nodes */
#define NOTICE_MS 100u /* a new leader starts counting within this of its term */

typedef struct {
	uint64_t lease_ms, margin_ms, election_ms; /* the rule's parameters */
	double drift;                              /* clock rates within 1 +- drift */
	unsigned max_delay_ms;                     /* one-way delays 0..max */
	bool new_leader_waits;                     /* false: a mutant (no live_since) */
	bool deposed_renews;                       /* leader changes with a deposed leader */
	uint64_t deposed_ms; /* ... answering up to this long after its successor began */
} sim_params;

typedef struct {
	uint64_t s; /* random state */
} rng;

static uint64_t
next(rng *r)
{
	uint64_t x = r->s += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t
below(rng *r, uint64_t n)
{
	return n ? next(r) % n : 0;
}

static double
unit(rng *r)
{
	return (double)(next(r) >> 11) / 9007199254740992.0;
}

/* A clock: local ns = base + real ms * rate. */
typedef struct {
	double rate;
	uint64_t base;
} sclock;

static uint64_t
local_ns(const sclock *c, uint64_t t_ms)
{
	return c->base + (uint64_t)((double)t_ms * (double)MS * c->rate);
}

/* A message: a heartbeat to leader `to` (answer false) or an answer to the
 * server (answer true) of the heartbeat sent at `sent` (server clock). */
typedef struct {
	uint64_t at_ms; /* delivered then (real) */
	uint64_t sent;  /* the heartbeat's send time on the server's clock */
	int to;         /* the leader it goes to */
	bool answer;
	bool ok;
} msg;

#define MAX_LEADERS 8

typedef struct {
	sclock clk;
	uint64_t since;     /* started counting (own clock) */
	uint64_t last_seen; /* last heartbeat received (own clock; 0: none) */
	uint64_t until_ms;  /* deposed: answers until then (real); UINT64_MAX: current */
	uint64_t next_tick; /* next look at its nodes (real ms) */
} leader;

/* One run. Returns true when the invariant held; *declared says whether a
 * leader declared the node down. */
static bool
sim_run(const sim_params *p, uint64_t seed, bool *declared)
{
	rng r = {seed * 0x2545f4914f6cdd1dull + 1};
	sclock srv = {1.0 + p->drift * (2 * unit(&r) - 1), below(&r, 1000) * MS + MS};
	leader ld[MAX_LEADERS];
	int nld = 1, cur = 0, known = 0; /* leaders; the current; the server's */
	msg q[MAX_MSGS];
	size_t nq = 0;
	uint64_t sent_ok = 0; /* the server's lease: send time of the last OK */
	uint64_t next_send = 0, pause_until = 0, cut_until = 0, down_at = 0;
	uint64_t down_ns =
	    kv_lease_down_ns(p->lease_ms * MS, p->margin_ms * MS, p->election_ms * MS);

	memset(ld, 0, sizeof(ld));
	ld[0].clk = (sclock){1.0 + p->drift * (2 * unit(&r) - 1), below(&r, 1000) * MS + MS};
	ld[0].since = local_ns(&ld[0].clk, 0);
	ld[0].until_ms = UINT64_MAX;
	*declared = false;
	for (uint64_t t = 0; t < RUN_MS && (down_at == 0 || t < down_at + AFTER_MS); t += STEP_MS) {
		/* Faults, now and then: a pause of the server, a partition, a
		 * new leader (the old one answering on for a while). */
		if (t > pause_until && below(&r, 20000) == 0)
			pause_until = t + 500 + below(&r, 5000);
		if (t > cut_until && below(&r, 15000) == 0)
			cut_until = t + 200 + below(&r, 5000);
		if (p->deposed_renews && nld < MAX_LEADERS && below(&r, 12000) == 0) {
			leader *n = &ld[nld];
			uint64_t notice = t + below(&r, NOTICE_MS + 1);
			n->clk = (sclock){1.0 + p->drift * (2 * unit(&r) - 1),
			                  below(&r, 1000) * MS + MS};
			n->since = p->new_leader_waits ? local_ns(&n->clk, notice) : 0;
			n->until_ms = UINT64_MAX;
			n->next_tick = notice;
			/* The deposed leader renews for up to E after the new one
			 * began counting. */
			ld[cur].until_ms = notice + below(&r, p->deposed_ms + 1);
			cur = nld++;
		}
		/* Deliveries due now. */
		for (size_t i = 0; i < nq;) {
			msg m = q[i];
			if (m.at_ms > t || (m.answer && t < pause_until)) {
				i++;
				continue;
			}
			q[i] = q[--nq];
			if (m.answer) {
				if (m.ok && m.sent > sent_ok)
					sent_ok = m.sent;
				continue;
			}
			leader *l = &ld[m.to];
			bool acting = m.to == cur || t <= l->until_ms;
			if (!acting)
				continue; /* stepped down: no answer */
			uint64_t now = local_ns(&l->clk, t);
			/* Once declared down, the node is down in the committed
			 * configuration every leader answers from: refused. */
			bool ok = down_at == 0;
			if (ok && now > l->last_seen)
				l->last_seen = now;
			if (nq < MAX_MSGS && t >= cut_until)
				q[nq++] = (msg){t + below(&r, p->max_delay_ms + 1), m.sent, m.to,
				                true, ok};
		}
		/* The server renews every P on its clock, with the leader it
		 * knows: after a change it finds the new one after a few sends
		 * (the deposed one answering meanwhile, within its window). */
		uint64_t snow = local_ns(&srv, t);
		if (t >= pause_until && snow >= next_send) {
			next_send = snow + RENEW_MS * MS;
			if (known != cur && below(&r, 8) == 0)
				known = cur;
			if (nq < MAX_MSGS && t >= cut_until)
				q[nq++] = (msg){t + below(&r, p->max_delay_ms + 1), snow, known,
				                false, false};
		}
		/* The current leader looks every TICK_MS. */
		leader *l = &ld[cur];
		if (down_at == 0 && t >= l->next_tick) {
			l->next_tick = t + TICK_MS;
			uint64_t heard = kv_lease_heard(l->last_seen, l->since);
			if (kv_lease_down_due(heard, down_ns, local_ns(&l->clk, t))) {
				down_at = t;
				*declared = true;
			}
		}
		/* The invariant: declared down, no lease. */
		if (down_at != 0 && kv_lease_held(sent_ok, p->lease_ms * MS, snow))
			return false;
	}
	return true;
}

/* Runs n seeds; returns the runs that broke the invariant, and counts
 * those that declared the node down in *ndeclared. */
static unsigned
sim_many(const sim_params *p, unsigned n, unsigned *ndeclared)
{
	unsigned bad = 0;

	*ndeclared = 0;
	for (unsigned i = 0; i < n; i++) {
		bool declared;
		if (!sim_run(p, i + 1, &declared))
			bad++;
		*ndeclared += declared;
	}
	return bad;
}

#define RUNS 400u

/* The shipped numbers (common/config.h KV_LEASE_*, a 1 s election timeout),
 * clocks drifting by up to 15% (the rule holds below 20%), delays up to
 * 300 ms each way, leader changes whose deposed leader answers for up to
 * one election timeout. */
static const sim_params shipped = {.lease_ms = 2000,
                                   .margin_ms = 1000,
                                   .election_ms = 1000,
                                   .drift = 0.15,
                                   .max_delay_ms = 300,
                                   .new_leader_waits = true,
                                   .deposed_renews = true,
                                   .deposed_ms = 1000};

static void
no_node_is_declared_down_while_its_server_holds_a_lease(void **state)
{
	(void)state;
	sim_params rep = shipped;
	sim_params one = rep;
	unsigned nd;

	one.election_ms = 0; /* a single controller: no leader changes */
	one.deposed_renews = false;
	assert_int_equal(sim_many(&rep, RUNS, &nd), 0);
	print_message("replicated: %u of %u runs declared the node down\n", nd, RUNS);
	assert_true(nd > RUNS / 4); /* the faults do bring declarations */
	assert_int_equal(sim_many(&one, RUNS, &nd), 0);
	print_message("single controller: %u of %u runs declared the node down\n", nd, RUNS);
	assert_true(nd > RUNS / 4);
}

static void
the_simulation_catches_a_weaker_rule_and_drift_past_the_bound(void **state)
{
	(void)state;
	const sim_params base = shipped;
	sim_params m;
	unsigned nd, bad;

	/* No margin: a server clock slower than the leader's outlives it. */
	m = base;
	m.margin_ms = 0;
	m.election_ms = 0;
	m.deposed_renews = false;
	bad = sim_many(&m, RUNS, &nd);
	print_message("no margin: %u of %u runs broke it\n", bad, RUNS);
	assert_true(bad > 0);
	/* No election timeout in the rule while a deposed leader renews for
	 * up to one (and a margin shorter than that window). */
	m = base;
	m.election_ms = 0;
	m.margin_ms = 300;
	bad = sim_many(&m, RUNS, &nd);
	print_message("no election timeout: %u of %u runs broke it\n", bad, RUNS);
	assert_true(bad > 0);
	/* The drift the margin covers: D / (2L + D) = 20% with a single
	 * controller. Just below it holds; well above it does not. */
	m = base;
	m.election_ms = 0;
	m.deposed_renews = false;
	m.drift = 0.19;
	bad = sim_many(&m, RUNS, &nd);
	print_message("drift 19%%: %u of %u runs broke it\n", bad, RUNS);
	assert_int_equal(bad, 0);
	m.drift = 0.35;
	bad = sim_many(&m, RUNS, &nd);
	print_message("drift 35%%: %u of %u runs broke it\n", bad, RUNS);
	assert_true(bad > 0);
	/* A new leader that does not wait: it counts a node it never heard
	 * from as silent since its clock's zero. */
	m = base;
	m.new_leader_waits = false;
	bad = sim_many(&m, RUNS, &nd);
	print_message("new leader without the wait: %u of %u runs broke it\n", bad, RUNS);
	assert_true(bad > 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(the_lease_holds_from_its_send_time_for_its_length),
	    cmocka_unit_test(a_node_is_down_only_after_the_whole_silence_since_it_was_last_heard),
	    cmocka_unit_test(no_node_is_declared_down_while_its_server_holds_a_lease),
	    cmocka_unit_test(the_simulation_catches_a_weaker_rule_and_drift_past_the_bound),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
