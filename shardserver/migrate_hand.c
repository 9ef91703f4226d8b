/*
 * migrate_hand.c - the handover file's entries of a migration set
 * (migrate_int.h; the file: nodefile.h; what it is for: doc/protocol.md
 * "Migrations", after a crash). The source adds a migration before it
 * sends TransferCommit (migrate_out.c), the destination before it applies
 * it (migrate_in.c); each add writes and fsyncs the whole file under hmu.
 * A restarted node reads them at kv_mig_create: a source takes the range
 * of a listed migration back fenced, a destination serves it.
 */
#include "common/err.h"
#include "common/log.h"
#include "shardserver/migrate_int.h"

#include <stdlib.h>

#define COMP "migrate"

int
kv_mig__hand_init(kv_mig *g)
{
	int rv;

	if ((g->hand = calloc(KV_HANDFILE_MAX, sizeof(*g->hand))) == NULL)
		return KV_ENOMEM;
	g->nhand = 0;
	if (g->env.data_dir != NULL &&
	    (rv = kv_handfile_load(g->env.data_dir, g->hand, KV_HANDFILE_MAX, &g->nhand)) != 0) {
		KV_ERROR(COMP, "cannot read the handover file", "dir=%s err=%s", g->env.data_dir,
		         kv_errname(rv));
		free(g->hand);
		g->hand = NULL;
		return rv;
	}
	pthread_mutex_init(&g->hmu, NULL);
	return KV_OK;
}

void
kv_mig__hand_fini(kv_mig *g)
{
	pthread_mutex_destroy(&g->hmu);
	free(g->hand);
	g->hand = NULL;
}

bool
kv_mig__listed(const kv_config *c, uint64_t id)
{
	for (size_t i = 0; i < c->nmigs; i++)
		if (c->migs[i].id == id)
			return true;
	return false;
}

/* Whether the entries hold (id, out); caller holds hmu. */
static bool
hand_has_locked(const kv_mig *g, uint64_t id, bool out)
{
	for (size_t i = 0; i < g->nhand; i++)
		if (g->hand[i].id == id && g->hand[i].out == out)
			return true;
	return false;
}

bool
kv_mig__hand_has(kv_mig *g, uint64_t id, bool out)
{
	pthread_mutex_lock(&g->hmu);
	bool has = hand_has_locked(g, id, out);
	pthread_mutex_unlock(&g->hmu);
	return has;
}

int
kv_mig__hand_add(kv_mig *g, uint64_t id, uint64_t epoch, bool out)
{
	int rv = KV_OK;

	pthread_mutex_lock(&g->hmu);
	if (hand_has_locked(g, id, out))
		goto unlock;
	if (g->nhand >= KV_HANDFILE_MAX) {
		rv = KV_ELIMIT;
		goto unlock;
	}
	g->hand[g->nhand++] = (kv_handover_ent){.id = id, .epoch = epoch, .out = out};
	if (g->env.data_dir != NULL &&
	    (rv = kv_handfile_save(g->env.data_dir, g->hand, g->nhand)) != 0)
		g->nhand--;
unlock:
	pthread_mutex_unlock(&g->hmu);
	return rv;
}

void
kv_mig__hand_prune(kv_mig *g, const kv_config *c)
{
	size_t j = 0;

	pthread_mutex_lock(&g->hmu);
	for (size_t i = 0; i < g->nhand; i++)
		if (g->hand[i].epoch > c->epoch || kv_mig__listed(c, g->hand[i].id))
			g->hand[j++] = g->hand[i];
	g->nhand = j;
	pthread_mutex_unlock(&g->hmu);
}
