/*
 * migrations.c - what the controller tracks of migrations beyond the
 * configuration: the progress their sources report (phase, copied and
 * total bytes and keys, rate) and the reason of those that failed or were
 * cancelled, which a --wait answer reports.
 *
 * Neither is durable. Progress is dropped when a configuration without
 * the migration is installed; failures are a ring of the latest
 * CTL_MAX_FAILS. The configuration stays the one record of which
 * migrations are in flight.
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
kv_ctl__prog_prune_locked(kv_controller *c, const kv_config *cur)
{
	size_t k = 0;

	for (size_t i = 0; i < c->nprog; i++) {
		bool live = false;
		for (size_t j = 0; j < cur->nmigs && !live; j++)
			live = cur->migs[j].id == c->prog[i].id;
		if (live)
			c->prog[k++] = c->prog[i];
	}
	c->nprog = k;
}

struct ctl_prog *
kv_ctl__prog_find_locked(kv_controller *c, uint64_t id, bool create)
{
	struct ctl_prog *p;

	for (size_t i = 0; i < c->nprog; i++)
		if (c->prog[i].id == id)
			return &c->prog[i];
	if (!create)
		return NULL;
	p = realloc(c->prog, (c->nprog + 1) * sizeof(*p));
	if (p == NULL)
		return NULL;
	c->prog = p;
	p = &c->prog[c->nprog++];
	memset(p, 0, sizeof(*p));
	p->id = id;
	p->born_ns = kv_now_ns();
	return p;
}

void
kv_ctl__fail_record_locked(kv_controller *c, uint64_t id, int err, const char *detail)
{
	struct ctl_fail *f = &c->fails[c->nextfail++ % CTL_MAX_FAILS];

	f->id = id;
	f->err = err;
	snprintf(f->msg, sizeof(f->msg), "%s", detail);
}

const struct ctl_fail *
kv_ctl__fail_find_locked(const kv_controller *c, uint64_t id)
{
	for (size_t i = 0; i < CTL_MAX_FAILS; i++)
		if (c->fails[i].id == id)
			return &c->fails[i];
	return NULL;
}

bool
kv_ctl__mig_in(const kv_config *cfg, uint64_t id)
{
	for (size_t i = 0; i < cfg->nmigs; i++)
		if (cfg->migs[i].id == id)
			return true;
	return false;
}

const kv_migration *
kv_ctl__mig_find(const kv_config *cfg, uint64_t id)
{
	for (size_t i = 0; i < cfg->nmigs; i++)
		if (cfg->migs[i].id == id)
			return &cfg->migs[i];
	return NULL;
}
