/*
 * history.c - the configuration history: every configuration the
 * controller has published, hist[i] with epoch i + 1 (controller_int.h).
 *
 * The history only grows: a configuration is immutable once installed and
 * lives until the controller is destroyed, so a pointer to one may be used
 * without the lock (held answers do). Installing one also forgets the
 * progress of the migrations it ended and marks the held requests it
 * answers. This file does not decide what the next configuration is
 * (commands.c with placement.c) nor make it durable (the config log or
 * Raft, fsm.c): it is what both end in.
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
kv_ctl__hist_reserve_locked(kv_controller *c, size_t more)
{
	while (c->nhist + more > c->caphist) {
		size_t cap = c->caphist ? c->caphist * 2 : 64;
		kv_config **h = realloc(c->hist, cap * sizeof(*h));
		if (h == NULL)
			return KV_ENOMEM;
		c->hist = h;
		c->caphist = cap;
	}
	return KV_OK;
}

/* Appends a configuration (taken; its epoch is nhist + 1 and the history
 * has room) to the history and answers the held requests it concerns. */
void
kv_ctl__install_locked(kv_controller *c, kv_config *next)
{
	c->hist[c->nhist++] = next;
	for (size_t i = 0; i < next->nmigs; i++)
		if (next->migs[i].id >= c->next_mig_id)
			c->next_mig_id = next->migs[i].id + 1;
	kv_ctl__prog_prune_locked(c, next);
	kv_ctl__handover_note_locked(c, next);
	kv_ctl__wake_locked(c);
}

int
kv_ctl__replay_cb(void *arg, const uint8_t *p, size_t n, uint64_t offset)
{
	kv_controller *c = arg;
	kv_config *cfg;
	int rv;

	(void)offset;
	if ((rv = kv_codec_config_unpack(p, n, &cfg)) != KV_OK)
		return rv == KV_ENOMEM ? rv : KV_ECORRUPT;
	if (cfg->epoch != c->nhist + 1) {
		kv_config_free(cfg);
		return KV_ECORRUPT; /* epochs must follow each other */
	}
	if (c->nhist == c->caphist) {
		size_t cap = c->caphist ? c->caphist * 2 : 64;
		kv_config **h = realloc(c->hist, cap * sizeof(*h));
		if (h == NULL) {
			kv_config_free(cfg);
			return KV_ENOMEM;
		}
		c->hist = h;
		c->caphist = cap;
	}
	c->hist[c->nhist++] = cfg;
	for (size_t i = 0; i < cfg->nmigs; i++)
		if (cfg->migs[i].id >= c->next_mig_id)
			c->next_mig_id = cfg->migs[i].id + 1;
	return KV_OK;
}

uint64_t
kv_controller_epoch(kv_controller *c)
{
	uint64_t e;

	pthread_mutex_lock(&c->mu);
	e = kv_ctl__latest_locked(c)->epoch;
	pthread_mutex_unlock(&c->mu);
	return e;
}
