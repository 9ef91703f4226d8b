/*
 * histfile.c - history files (see histfile.h).
 *
 * DESIGN. Writing sorts the operations' events by time (a completion before
 * an invocation at the same instant, so a process never has two operations
 * open) and prints each as one JSON object. Reading parses each line with
 * jansson, pairs every completion with its process's open invocation, and
 * keeps the completed operations in file order; then, in two passes over
 * them, it names every written value (pass 1) and rewrites every read in
 * those names (pass 2), because a read may legally name a write whose
 * invocation comes later in the file only when it is a violation, which
 * the model must see rather than the reader refuse.
 *
 * Nemesis events (the driver's steps) are lines of their own, "process":
 * "nemesis", merged in by time; the reader keeps them for reports and
 * leaves them out of the check.
 *
 * The reader trusts nothing: a line over 16 MiB, a field of the wrong type,
 * a completion without an invocation, times going backwards, a value
 * written twice or a key both put and appended to make the file malformed.
 */
#include "checker/histfile.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define MAX_LINE ((size_t)16 << 20) /* longest line read */
#define NONE     SIZE_MAX

/* ------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------ */

/* One event of the file: an op's invocation or completion. */
typedef struct {
	uint64_t t;  /* its time */
	size_t op;   /* the op (the first part of a multi-key op) */
	bool invoke; /* invocation, else completion */
} wev;

static int
wev_cmp(const void *a, const void *b)
{
	const wev *x = a, *y = b;

	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	if (x->invoke != y->invoke)
		return x->invoke ? 1 : -1; /* completions first */
	return x->op < y->op ? -1 : x->op > y->op;
}

/* Writes s[0..n) as a JSON string: one code point per byte, \u00XX outside
 * printable ASCII. */
static void
put_str(FILE *f, const void *p, size_t n)
{
	const uint8_t *s = p;

	fputc('"', f);
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '"' || s[i] == '\\')
			fprintf(f, "\\%c", s[i]);
		else if (s[i] < 0x20 || s[i] >= 0x7f)
			fprintf(f, "\\u%04x", s[i]);
		else
			fputc(s[i], f);
	}
	fputc('"', f);
}

static void
put_cstr(FILE *f, const char *s)
{
	put_str(f, s, strlen(s));
}

/* The value an op wrote or read, as a JSON value. */
static void
put_value(FILE *f, const chk_key *keys, const chk_op *o, bool completion)
{
	char b[64];
	const chk_key *k = &keys[o->key];

	if (o->kind == CHK_GET || o->kind == CHK_DEL || o->kind == CHK_SCAN) {
		if (!completion || o->status == CHK_FAILED || o->status == CHK_NOTFOUND) {
			fputs("null", f);
		} else if (o->status == CHK_GARBAGE) {
			snprintf(b, sizeof(b), "<%" PRIu64 " bytes that name no value>", o->len);
			put_cstr(f, b);
		} else if (!k->append) {
			chk_format_val(b, sizeof(b), o->val);
			put_cstr(f, b);
		} else if (k->final_found && o->len <= k->final_len &&
		           chk_hash(CHK_HASH_INIT, k->final, o->len) == o->hash) {
			put_str(f, k->final, o->len);
		} else {
			snprintf(b, sizeof(b),
			         "<%" PRIu64 " bytes, not a prefix of the final value>", o->len);
			put_cstr(f, b);
		}
		return;
	}
	int n = chk_format_val(b, sizeof(b) - 1, o->val);
	if (o->kind == CHK_APPEND && n > 0)
		b[n++] = ';';
	put_str(f, b, n > 0 ? (size_t)n : 0);
}

/* A register identity as a JSON value: its spelling, null for 0 (absent). */
static void
put_id(FILE *f, uint64_t id)
{
	char b[64];

	if (id == 0) {
		fputs("null", f);
		return;
	}
	chk_format_val(b, sizeof(b), id);
	put_cstr(f, b);
}

/* A cas's fields: "expect" and "value" (null: absent); a refused one's
 * completion adds "current", what the key held (null: absent) when known. */
static void
put_cas(FILE *f, const chk_key *keys, const chk_op *o, bool completion)
{
	fputs("\"key\": ", f);
	put_cstr(f, keys[o->key].name);
	fputs(", \"expect\": ", f);
	put_id(f, o->hash);
	fputs(", \"value\": ", f);
	put_id(f, o->val);
	if (completion && o->status == CHK_MISMATCH && o->len != CHK_CUR_UNKNOWN) {
		fputs(", \"current\": ", f);
		put_id(f, o->len);
	}
}

static const char *
op_name(const chk_op *o)
{
	switch (o->kind) {
	case CHK_APPEND:
		return "append";
	case CHK_PUT:
		return o->txn ? "mput" : "put";
	case CHK_DEL:
		return "del";
	case CHK_SCAN:
		return "scan";
	case CHK_CAS:
		return "cas";
	default:
		return o->txn ? "mget" : "get";
	}
}

/* The process of an op: its client; each final read (client 0, read
 * together) a process of its own past every client. */
static uint64_t
op_process(const chk_op *ops, size_t i, uint32_t maxclient)
{
	return ops[i].client ? ops[i].client : (uint64_t)maxclient + 1 + i;
}

/*
 * The final value of every append key as a get of its own process, after
 * every other event: the value a reader needs to check the key's appends.
 * A final read whose times were not kept is placed after the last event.
 */
static int
write_finals(FILE *f, const chk_key *keys, size_t nkeys, uint32_t maxclient, uint64_t last)
{
	uint64_t p = (uint64_t)maxclient + 1 + ((uint64_t)1 << 32);

	for (size_t k = 0; k < nkeys; k++) {
		const chk_key *key = &keys[k];
		if (!key->append || !key->final_known || key->final_partial)
			continue; /* a partial final value is a read of the history */
		uint64_t t1 = key->final_invoke > last ? key->final_invoke : last + 1;
		uint64_t t2 = key->final_complete > t1 ? key->final_complete : t1 + 1;
		last = t2;
		fprintf(
		    f, "{\"process\": %" PRIu64 ", \"type\": \"invoke\", \"f\": \"get\", \"key\": ",
		    p + k);
		put_cstr(f, key->name);
		fprintf(f, ", \"value\": null, \"time\": %" PRIu64 "}\n", t1);
		fprintf(f, "{\"process\": %" PRIu64 ", \"type\": \"ok\", \"f\": \"get\", \"key\": ",
		        p + k);
		put_cstr(f, key->name);
		fputs(", \"value\": ", f);
		if (key->final_found)
			put_str(f, key->final, key->final_len);
		else
			fputs("null", f);
		fprintf(f, ", \"time\": %" PRIu64 "}\n", t2);
	}
	return ferror(f) ? -1 : 0;
}

/* One nemesis line: event i's start or end. */
typedef struct {
	uint64_t t; /* its time */
	size_t i;   /* the event */
	bool end;   /* its end line */
} nline;

static int
nline_cmp(const void *a, const void *b)
{
	const nline *x = a, *y = b;

	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	if (x->i != y->i)
		return x->i < y->i ? -1 : 1;
	return (int)x->end - (int)y->end;
}

static void
put_nemesis(FILE *f, const chk_nemesis *n, bool end, uint64_t t)
{
	fprintf(f, "{\"process\": \"nemesis\", \"type\": \"info\", \"f\": ");
	put_cstr(f, n->f);
	fprintf(f, ", \"value\": {%s%s\"phase\": \"%s\"", n->args, n->args[0] ? ", " : "",
	        end ? "end" : "start");
	if (end && n->result[0])
		fprintf(f, ", %s", n->result);
	fprintf(f, "}, \"time\": %" PRIu64 "}\n", t);
}

static int
scan_txn_cmp(const void *a, const void *b)
{
	const chk_scan *x = a, *y = b;

	return x->txn < y->txn ? -1 : x->txn > y->txn;
}

/* A scan's fields: its range and limit, and on completion what it returned. */
static void
put_scan(FILE *f, const chk_key *keys, const chk_op *ops, const size_t *parts, size_t first,
         const chk_scan *sc, bool completion)
{
	fputs("\"start\": ", f);
	put_cstr(f, sc->start);
	fputs(", \"end\": ", f);
	put_cstr(f, sc->end);
	fprintf(f, ", \"limit\": %" PRIu32, sc->limit);
	if (!completion || ops[first].status == CHK_FAILED)
		return;
	fputs(", \"kvs\": {", f);
	bool any = false;
	for (size_t p = first; p != NONE; p = parts[p]) {
		if (ops[p].status == CHK_NOTFOUND)
			continue;
		if (any)
			fputs(", ", f);
		any = true;
		put_cstr(f, keys[ops[p].key].name);
		fputs(": ", f);
		put_value(f, keys, &ops[p], true);
	}
	fputc('}', f);
	if (sc->cut) {
		fputs(", \"cut\": ", f);
		put_cstr(f, sc->cut);
	}
}

int
chk_histfile_write(FILE *f, const chk_key *keys, size_t nkeys, const chk_op *ops, size_t nops,
                   const chk_scan *scans, size_t nscans, const chk_nemesis *nem, size_t nnem)
{
	chk_scan *sc = malloc((nscans + 1) * sizeof(*sc)); /* by txn */
	wev *e = malloc((2 * nops + 1) * sizeof(*e));
	nline *nl = malloc((2 * nnem + 1) * sizeof(*nl));
	size_t nn = 0, nj = 0;
	size_t *parts = malloc((nops + 1) * sizeof(*parts)); /* op -> next part of its txn */
	size_t *head = malloc((nops + 1) * sizeof(*head));   /* op -> first part of its txn */
	uint32_t maxclient = 0;
	size_t ne = 0;
	int rv = -1;

	if (e == NULL || parts == NULL || head == NULL || nl == NULL || sc == NULL)
		goto out;
	if (nscans)
		memcpy(sc, scans, nscans * sizeof(*sc));
	if (nscans > 1)
		qsort(sc, nscans, sizeof(*sc), scan_txn_cmp);
	for (size_t i = 0; i < nnem; i++) {
		nl[nn++] = (nline){nem[i].start, i, false};
		if (nem[i].end)
			nl[nn++] =
			    (nline){nem[i].end < nem[i].start ? nem[i].start : nem[i].end, i, true};
	}
	if (nn > 1)
		qsort(nl, nn, sizeof(*nl), nline_cmp);
	/* Tie the parts of each multi-key op: the ops of one txn sit together
	 * in a client's record, so a linear pass finds them. */
	for (size_t i = 0; i < nops; i++) {
		parts[i] = NONE;
		head[i] = i;
		if (ops[i].client > maxclient)
			maxclient = ops[i].client;
		if (ops[i].txn != 0 && i > 0 && ops[i - 1].txn == ops[i].txn) {
			head[i] = head[i - 1];
			parts[i - 1] = i;
		}
	}
	for (size_t i = 0; i < nops; i++) {
		if (head[i] != i)
			continue;
		if (ops[i].kind == CHK_SCAN) {
			chk_scan want = {.txn = ops[i].txn};
			if (bsearch(&want, sc, nscans, sizeof(*sc), scan_txn_cmp) == NULL)
				continue; /* not described: left out */
		}
		uint64_t done = ops[i].complete == CHK_NEVER ? ops[i].ret : ops[i].complete;
		e[ne++] = (wev){ops[i].invoke, i, true};
		e[ne++] = (wev){done < ops[i].invoke ? ops[i].invoke : done, i, false};
	}
	if (ne > 1)
		qsort(e, ne, sizeof(*e), wev_cmp);
	for (size_t j = 0; j <= ne; j++) {
		/* The nemesis lines up to this event's time (all at the end). */
		while (nj < nn && (j == ne || nl[nj].t <= e[j].t)) {
			put_nemesis(f, &nem[nl[nj].i], nl[nj].end, nl[nj].t);
			nj++;
		}
		if (j == ne) {
			uint64_t last = ne ? e[ne - 1].t : 0;
			if (nn && nl[nn - 1].t > last)
				last = nl[nn - 1].t;
			if (write_finals(f, keys, nkeys, maxclient, last) != 0)
				goto out;
			break;
		}
		const chk_op *o = &ops[e[j].op];
		const char *type = "invoke";
		if (!e[j].invoke)
			type = o->status == CHK_MISMATCH                   ? "fail"
			       : o->status != CHK_FAILED                   ? "ok"
			       : o->kind == CHK_GET || o->kind == CHK_SCAN ? "fail"
			                                                   : "info";
		/* A read of an append key whose final value was never read back:
		 * its bytes are not in the history (only their length and hash),
		 * so the file cannot say what it read. */
		if (!e[j].invoke && o->txn == 0 && o->kind == CHK_GET && o->status == CHK_OK &&
		    keys[o->key].append && !keys[o->key].final_known)
			type = "info";
		fprintf(f, "{\"process\": %" PRIu64 ", \"type\": \"%s\", \"f\": \"%s\", ",
		        op_process(ops, e[j].op, maxclient), type, op_name(o));
		if (o->kind == CHK_SCAN) {
			chk_scan want = {.txn = o->txn};
			const chk_scan *d = bsearch(&want, sc, nscans, sizeof(*sc), scan_txn_cmp);
			put_scan(f, keys, ops, parts, e[j].op, d, !e[j].invoke);
		} else if (o->kind == CHK_CAS) {
			put_cas(f, keys, o, !e[j].invoke);
		} else if (o->txn == 0) {
			fputs("\"key\": ", f);
			put_cstr(f, keys[o->key].name);
			fputs(", \"value\": ", f);
			put_value(f, keys, o, !e[j].invoke);
			if (!e[j].invoke && o->kind == CHK_APPEND && o->status == CHK_OK)
				fprintf(f, ", \"result_len\": %" PRIu64, o->len);
		} else {
			fputs("\"kvs\": {", f);
			for (size_t p = e[j].op; p != NONE; p = parts[p]) {
				if (p != e[j].op)
					fputs(", ", f);
				put_cstr(f, keys[ops[p].key].name);
				fputs(": ", f);
				put_value(f, keys, &ops[p], !e[j].invoke);
			}
			fputc('}', f);
			if (o->txn & CHK_TXN_LOOSE)
				fputs(", \"atomic\": false", f);
		}
		fprintf(f, ", \"time\": %" PRIu64 "}\n", e[j].t);
	}
	rv = ferror(f) ? -1 : 0;
out:
	free(e);
	free(nl);
	free(parts);
	free(head);
	free(sc);
	return rv;
}

/* ------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------ */

/* (key, string) -> identity, open addressing. */
typedef struct {
	uint32_t key;  /* key index */
	char *s;       /* the string (owned); NULL: empty slot */
	size_t len;    /* its length */
	uint64_t id;   /* its identity */
	size_t writer; /* the raw op that wrote it */
} sent;

typedef struct {
	sent *e;     /* slots */
	size_t mask; /* slots - 1 */
	size_t n;    /* used */
} smap;

/* One key a scan returned. */
typedef struct {
	const char *name; /* the key's name (the key table's, stable) */
	uint32_t key;     /* key index */
	char *val;        /* the value (owned) */
	size_t vlen;      /* its length */
} rkv;

/* One completed scan of the file: [start, end), up to cut when its limit
 * stopped it. */
struct rscan {
	char *start, *end, *cut; /* owned; end "": no end; cut NULL: not cut */
	size_t sl, el, cl;       /* their lengths */
	rkv *kv;                 /* what it returned (owned), in key order */
	size_t nkv;
	uint64_t invoke, complete; /* times */
	size_t line;               /* the invoke's line */
	uint32_t process;          /* for reports */
	uint32_t txn;              /* the id its parts carry */
};

/* One completed operation of the file, before naming. */
typedef struct {
	uint8_t kind;    /* chk_kind */
	uint8_t status;  /* chk_status (CHK_GARBAGE unused) */
	uint32_t key;    /* key index (single-key ops) */
	char *val;       /* write: the value; read: what was read (NULL: absent) */
	size_t vlen;     /* its length */
	uint64_t invoke; /* times */
	uint64_t complete;
	uint64_t ret;        /* when the completion came */
	uint32_t txn;        /* 0, or the multi-key op it belongs to */
	uint32_t process;    /* the file's process, folded into 32 bits for reports */
	size_t line;         /* the invoke's line */
	uint64_t result_len; /* append: "result_len", when given */
	char *expect;        /* cas: the expected value (NULL: absent) */
	size_t elen;         /* its length */
	char *cur;           /* cas refused: the current value (NULL: absent or unknown) */
	size_t clen;         /* its length */
	bool cur_known;      /* cas refused: "current" was given */
} rop;

struct chk_histfile {
	chk_key *keys; /* the key table */
	size_t nkeys;
	size_t capkeys;
	int8_t *key_append; /* per key: -1 unknown, 0 register, 1 append */
	char **finals;      /* per key: the final value's canonical bytes (owned) */
	chk_op *ops;        /* the model's operations */
	size_t nops;
	size_t *lines; /* per op: its invoke line */
	rop *raw;      /* the file's operations */
	size_t nraw;
	size_t capraw;
	struct rscan *scans; /* the file's scans, expanded into ops after the last line */
	size_t nscans;
	size_t capscans;
	smap names_map;   /* key name -> index (key field unused) */
	smap vals;        /* (key, written value) -> identity */
	uint64_t next_id; /* identities handed out */
	chk_nemesis *nem; /* the nemesis lines, in file order */
	size_t nnem;      /* used */
	size_t capnem;    /* allocated */
};

static uint64_t
shash(uint32_t key, const void *s, size_t n)
{
	uint64_t h = chk_hash(CHK_HASH_INIT, &key, sizeof(key));
	return chk_hash(h, s, n);
}

static int
smap_grow(smap *m)
{
	size_t slots = m->e ? 2 * (m->mask + 1) : 64;
	sent *e = calloc(slots, sizeof(*e));

	if (e == NULL)
		return -1;
	for (size_t i = 0; m->e && i <= m->mask; i++) {
		if (m->e[i].s == NULL)
			continue;
		size_t s = shash(m->e[i].key, m->e[i].s, m->e[i].len) & (slots - 1);
		while (e[s].s != NULL)
			s = (s + 1) & (slots - 1);
		e[s] = m->e[i];
	}
	free(m->e);
	m->e = e;
	m->mask = slots - 1;
	return 0;
}

/* Finds (key, s); with add, inserts it when missing (*added tells). NULL:
 * not found, or out of memory when adding. */
static sent *
smap_get(smap *m, uint32_t key, const char *s, size_t n, bool add, bool *added)
{
	if (added)
		*added = false;
	if (m->e == NULL || (add && 2 * (m->n + 1) > m->mask + 1)) {
		if (!add && m->e == NULL)
			return NULL;
		if (smap_grow(m) != 0)
			return NULL;
	}
	for (size_t i = shash(key, s, n) & m->mask;; i = (i + 1) & m->mask) {
		sent *x = &m->e[i];
		if (x->s == NULL) {
			if (!add)
				return NULL;
			x->s = malloc(n + 1);
			if (x->s == NULL)
				return NULL;
			memcpy(x->s, s, n);
			x->s[n] = '\0';
			x->key = key;
			x->len = n;
			m->n++;
			if (added)
				*added = true;
			return x;
		}
		if (x->key == key && x->len == n && memcmp(x->s, s, n) == 0)
			return x;
	}
}

static void
smap_free(smap *m)
{
	for (size_t i = 0; m->e && i <= m->mask; i++)
		free(m->e[i].s);
	free(m->e);
}

/* A process's open invocation. */
typedef struct {
	json_int_t process; /* the file's process id */
	bool used;          /* slot in use */
	json_t *ev;         /* the invoke event (a reference) */
	size_t line;        /* its line */
} pend;

typedef struct {
	pend *e;
	size_t mask;
	size_t n;
} pmap;

static uint64_t
phash(json_int_t p)
{
	uint64_t x = (uint64_t)p;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static pend *
pmap_get(pmap *m, json_int_t p, bool add)
{
	if (m->e == NULL || (add && 2 * (m->n + 1) > m->mask + 1)) {
		if (!add && m->e == NULL)
			return NULL;
		size_t slots = m->e ? 2 * (m->mask + 1) : 64;
		pend *e = calloc(slots, sizeof(*e));
		if (e == NULL)
			return NULL;
		for (size_t i = 0; m->e && i <= m->mask; i++) {
			if (!m->e[i].used)
				continue;
			size_t s = phash(m->e[i].process) & (slots - 1);
			while (e[s].used)
				s = (s + 1) & (slots - 1);
			e[s] = m->e[i];
		}
		free(m->e);
		m->e = e;
		m->mask = slots - 1;
	}
	for (size_t i = phash(p) & m->mask;; i = (i + 1) & m->mask) {
		if (!m->e[i].used) {
			if (!add)
				return NULL;
			m->e[i].used = true;
			m->e[i].process = p;
			m->e[i].ev = NULL;
			m->n++;
			return &m->e[i];
		}
		if (m->e[i].process == p)
			return &m->e[i];
	}
}

static void
pmap_free(pmap *m)
{
	for (size_t i = 0; m->e && i <= m->mask; i++)
		if (m->e[i].used && m->e[i].ev)
			json_decref(m->e[i].ev);
	free(m->e);
}

/* The reader's state. */
typedef struct {
	chk_histfile *h;
	char *err;
	size_t errlen;
	size_t line;     /* the line being read */
	bool oom;        /* memory ran out */
	uint32_t txns;   /* multi-key ops seen */
	uint64_t last_t; /* the last event's time */
} rd;

static int __attribute__((format(printf, 2, 3))) bad(rd *r, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(r->err, r->errlen, "line %zu: ", r->line);

	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < r->errlen)
		vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return -1;
}

static int
oom(rd *r)
{
	r->oom = true;
	snprintf(r->err, r->errlen, "out of memory");
	return -1;
}

/* The index of key `name`, added when new. */
static int
key_index(rd *r, const char *name, size_t n, uint32_t *out)
{
	chk_histfile *h = r->h;
	bool added;

	if (n == 0)
		return bad(r, "an empty key");
	sent *s = smap_get(&h->names_map, 0, name, n, true, &added);
	if (s == NULL)
		return oom(r);
	if (added) {
		if (h->nkeys == UINT32_MAX - 1)
			return bad(r, "too many keys");
		if (h->nkeys == h->capkeys) {
			size_t cap = h->capkeys ? 2 * h->capkeys : 64;
			chk_key *k = realloc(h->keys, cap * sizeof(*k));
			if (k == NULL)
				return oom(r);
			h->keys = k;
			int8_t *a = realloc(h->key_append, cap * sizeof(*a));
			if (a == NULL)
				return oom(r);
			h->key_append = a;
			h->capkeys = cap;
		}
		s->id = h->nkeys;
		h->keys[h->nkeys] = (chk_key){.name = s->s};
		h->key_append[h->nkeys] = -1;
		h->nkeys++;
	}
	*out = (uint32_t)s->id;
	return 0;
}

static rop *
raw_add(rd *r)
{
	chk_histfile *h = r->h;

	if (h->nraw == h->capraw) {
		size_t cap = h->capraw ? 2 * h->capraw : 1024;
		rop *x = realloc(h->raw, cap * sizeof(*x));
		if (x == NULL)
			return NULL;
		h->raw = x;
		h->capraw = cap;
	}
	rop *o = &h->raw[h->nraw++];
	memset(o, 0, sizeof(*o));
	return o;
}

/* Copies a JSON string or null into *out (NULL for null). */
static int
dup_value(rd *r, json_t *v, const char *what, char **out, size_t *len)
{
	*out = NULL;
	*len = 0;
	if (json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return bad(r, "%s is neither a string nor null", what);
	size_t n = json_string_length(v);
	char *s = malloc(n + 1);
	if (s == NULL)
		return oom(r);
	memcpy(s, json_string_value(v), n);
	s[n] = '\0';
	*out = s;
	*len = n;
	return 0;
}

/* Marks key k a register or an append key; refuses a change. */
static int
key_kind(rd *r, uint32_t k, bool append)
{
	int8_t *a = &r->h->key_append[k];

	if (*a == -1)
		*a = append;
	else if (*a != (int8_t)append)
		return bad(r, "key %s is both appended to and put", r->h->keys[k].name);
	return 0;
}

/* Copies a JSON string member `name` of ev (NULL when absent and !need). */
static int
dup_member(rd *r, json_t *ev, const char *name, bool need, char **out, size_t *len)
{
	json_t *v = json_object_get(ev, name);

	*out = NULL;
	*len = 0;
	if (v == NULL && !need)
		return 0;
	if (!json_is_string(v))
		return bad(r, "\"%s\" is not a string", name);
	return dup_value(r, v, name, out, len);
}

/* Byte order of keys, a shorter key first among equal bytes. */
static int
key_cmp(const char *a, size_t al, const char *b, size_t bl)
{
	int c = memcmp(a, b, al < bl ? al : bl);

	return c ? c : (al > bl) - (al < bl);
}

/* Orders rkv (and anything that starts with a name) by name. */
static int
rkv_cmp(const void *a, const void *b)
{
	const char *x = *(const char *const *)a, *y = *(const char *const *)b;

	return key_cmp(x, strlen(x), y, strlen(y));
}

static void
rscan_free(struct rscan *s)
{
	free(s->start);
	free(s->end);
	free(s->cut);
	for (size_t i = 0; i < s->nkv; i++)
		free(s->kv[i].val);
	free(s->kv);
}

/* A scan: kept whole until every register of the file is known (see
 * expand_scans). A failed scan, or one of unknown outcome, tells nothing. */
static int
scan_event(rd *r, json_t *inv, size_t inv_line, json_t *done, bool ok, uint64_t t)
{
	chk_histfile *h = r->h;
	json_t *limit = json_object_get(inv, "limit");

	if (limit != NULL && (!json_is_integer(limit) || json_integer_value(limit) < 0))
		return bad(r, "\"limit\" is not a count");
	if (!ok)
		return 0;
	if (h->nscans == h->capscans) {
		size_t cap = h->capscans ? 2 * h->capscans : 64;
		struct rscan *x = realloc(h->scans, cap * sizeof(*x));
		if (x == NULL)
			return oom(r);
		h->scans = x;
		h->capscans = cap;
	}
	if (r->txns >= CHK_TXN_LOOSE - 1)
		return bad(r, "too many multi-key operations");
	struct rscan *s = &h->scans[h->nscans++];
	memset(s, 0, sizeof(*s));
	s->invoke = (uint64_t)json_integer_value(json_object_get(inv, "time"));
	s->complete = t;
	s->line = inv_line;
	s->process = (uint32_t)json_integer_value(json_object_get(inv, "process"));
	s->txn = ++r->txns;
	if (dup_member(r, inv, "start", true, &s->start, &s->sl) != 0 ||
	    dup_member(r, inv, "end", true, &s->end, &s->el) != 0 ||
	    dup_member(r, done, "cut", false, &s->cut, &s->cl) != 0)
		return -1;
	if (s->el && key_cmp(s->start, s->sl, s->end, s->el) >= 0)
		return bad(r, "scan of an empty range");
	json_t *kvs = json_object_get(done, "kvs");
	if (!json_is_object(kvs))
		return bad(r, "scan has no \"kvs\" object");
	if ((s->kv = calloc(json_object_size(kvs) + 1, sizeof(*s->kv))) == NULL)
		return oom(r);
	const char *name;
	json_t *v;
	json_object_foreach(kvs, name, v)
	{
		size_t nl = strlen(name);
		rkv *kv = &s->kv[s->nkv];
		if (key_cmp(name, nl, s->start, s->sl) < 0 ||
		    (s->el && key_cmp(name, nl, s->end, s->el) >= 0) ||
		    (s->cut && key_cmp(name, nl, s->cut, s->cl) > 0))
			return bad(r, "scan returned key %s, outside its range", name);
		if (key_index(r, name, nl, &kv->key) != 0)
			return -1;
		kv->name = h->keys[kv->key].name;
		if (r->h->key_append[kv->key] == 1)
			return bad(r, "scan returned append key %s: not checked by this version",
			           name);
		if (key_kind(r, kv->key, false) != 0)
			return -1;
		if (!json_is_string(v))
			return bad(r, "scan's value of %s is not a string", name);
		if (dup_value(r, v, "a value of \"kvs\"", &kv->val, &kv->vlen) != 0)
			return -1;
		s->nkv++;
	}
	if (s->nkv > 1)
		qsort(s->kv, s->nkv, sizeof(*s->kv), rkv_cmp);
	/* Stopped by its limit: keys after the last one it returned were not
	 * looked at. */
	if (s->cut == NULL && limit != NULL && s->nkv > 0 &&
	    (uint64_t)json_integer_value(limit) <= s->nkv) {
		const char *last = s->kv[s->nkv - 1].name;
		if ((s->cut = strdup(last)) == NULL)
			return oom(r);
		s->cl = strlen(last);
	}
	return 0;
}

/* A cas: "expect" and "value" (strings, null: absent) in the invocation;
 * ok: applied, fail: refused (the completion may say "current"), info:
 * unknown. */
static int
cas_event(rd *r, json_t *inv, size_t inv_line, json_t *done, const char *type, uint64_t t)
{
	json_t *key = json_object_get(inv, "key"), *e = json_object_get(inv, "expect"),
	       *v = json_object_get(inv, "value"), *c = json_object_get(done, "current");
	json_int_t process = json_integer_value(json_object_get(inv, "process"));
	uint64_t t0 = (uint64_t)json_integer_value(json_object_get(inv, "time"));
	bool ok = strcmp(type, "ok") == 0, refused = strcmp(type, "fail") == 0;
	uint32_t k;

	if (!json_is_string(key))
		return bad(r, "cas has no string \"key\"");
	if (e == NULL || v == NULL)
		return bad(r, "cas needs \"expect\" and \"value\" (null: absent)");
	if (key_index(r, json_string_value(key), json_string_length(key), &k) != 0)
		return -1;
	if (key_kind(r, k, false) != 0)
		return -1;
	rop *o = raw_add(r);
	if (o == NULL)
		return oom(r);
	*o = (rop){.kind = CHK_CAS,
	           .key = k,
	           .invoke = t0,
	           .ret = t,
	           .line = inv_line,
	           .process = (uint32_t)process,
	           .status = ok        ? CHK_OK
	                     : refused ? CHK_MISMATCH
	                               : CHK_FAILED,
	           .complete = ok || refused ? t : CHK_NEVER};
	if (dup_value(r, v, "\"value\"", &o->val, &o->vlen) != 0 ||
	    dup_value(r, e, "\"expect\"", &o->expect, &o->elen) != 0)
		return -1;
	if (o->val != NULL && o->expect != NULL && o->vlen == o->elen &&
	    memcmp(o->val, o->expect, o->vlen) == 0)
		return bad(r, "cas writes the value it expects");
	if (refused && c != NULL) {
		o->cur_known = true;
		if (dup_value(r, c, "\"current\"", &o->cur, &o->clen) != 0)
			return -1;
	}
	return 0;
}

/* Records the operation that inv (its invocation) and done (its
 * completion) make. */
static int
complete(rd *r, json_t *inv, size_t inv_line, json_t *done, const char *type, uint64_t t)
{
	const char *f = json_string_value(json_object_get(inv, "f"));
	const char *df = json_string_value(json_object_get(done, "f"));
	json_int_t process = json_integer_value(json_object_get(inv, "process"));
	uint64_t t0 = (uint64_t)json_integer_value(json_object_get(inv, "time"));
	bool ok = strcmp(type, "ok") == 0, failed = strcmp(type, "fail") == 0;
	uint8_t kind;

	if (df == NULL || strcmp(f, df) != 0)
		return bad(r, "the completion's f differs from its invocation's (%s)", f);
	bool multi = strcmp(f, "mput") == 0 || strcmp(f, "mget") == 0;
	if (strcmp(f, "get") == 0 || strcmp(f, "mget") == 0)
		kind = CHK_GET;
	else if (strcmp(f, "put") == 0 || strcmp(f, "mput") == 0)
		kind = CHK_PUT;
	else if (strcmp(f, "append") == 0)
		kind = CHK_APPEND;
	else if (strcmp(f, "del") == 0)
		kind = CHK_DEL;
	else if (strcmp(f, "scan") == 0)
		kind = CHK_SCAN;
	else if (strcmp(f, "cas") == 0)
		kind = CHK_CAS;
	else
		return bad(r, "operation \"%s\" is not checked by this version of the checker", f);
	if (kind == CHK_SCAN)
		return scan_event(r, inv, inv_line, done, ok, t);
	if (kind == CHK_CAS)
		return cas_event(r, inv, inv_line, done, type, t);
	if (kind == CHK_GET && failed)
		return 0; /* a read that certainly did not happen tells nothing */
	if (kind != CHK_GET && failed)
		return 0;   /* nor a write (or delete) that certainly did not happen */
	bool unknown = !ok; /* "info" */
	if (kind == CHK_GET && unknown)
		return 0; /* a read of unknown outcome tells nothing either */

	uint32_t txn = 0;
	if (multi) {
		if (r->txns >= CHK_TXN_LOOSE - 1)
			return bad(r, "too many multi-key operations");
		txn = ++r->txns;
		json_t *at = json_object_get(inv, "atomic"), *dat = json_object_get(done, "atomic");
		if ((at != NULL && !json_is_boolean(at)) || (dat != NULL && !json_is_boolean(dat)))
			return bad(r, "%s: \"atomic\" is not true or false", f);
		if ((at != NULL && !json_is_true(at)) || (dat != NULL && !json_is_true(dat)))
			txn |= CHK_TXN_LOOSE; /* its keys did not live on one node */
	} else if (json_object_get(inv, "atomic") != NULL) {
		return bad(r, "%s has \"atomic\" (only mput and mget may)", f);
	}
	json_t *src = kind == CHK_GET || kind == CHK_DEL ? done : inv; /* where the values are */
	if (!multi) {
		json_t *key = json_object_get(inv, "key");
		if (!json_is_string(key))
			return bad(r, "%s has no string \"key\"", f);
		uint32_t k;
		if (key_index(r, json_string_value(key), json_string_length(key), &k) != 0)
			return -1;
		if (kind != CHK_GET && key_kind(r, k, kind == CHK_APPEND) != 0)
			return -1; /* a delete makes a register */
		rop *o = raw_add(r);
		if (o == NULL)
			return oom(r);
		*o = (rop){.kind = kind,
		           .key = k,
		           .invoke = t0,
		           .ret = t,
		           .line = inv_line,
		           .process = (uint32_t)process,
		           .status = unknown ? CHK_FAILED : CHK_OK,
		           .complete = unknown ? CHK_NEVER : t};
		json_t *v = json_object_get(src, "value");
		if (kind == CHK_DEL && unknown)
			return 0; /* what it deleted is not known */
		if (v == NULL)
			return bad(r, "%s has no \"value\"", f);
		if (dup_value(r, v, "\"value\"", &o->val, &o->vlen) != 0)
			return -1;
		if (kind != CHK_GET && kind != CHK_DEL && o->val == NULL)
			return bad(r, "%s of a null value", f);
		if (kind == CHK_APPEND && ok) {
			json_t *rl = json_object_get(done, "result_len");
			if (rl != NULL && (!json_is_integer(rl) || json_integer_value(rl) < 0))
				return bad(r, "\"result_len\" is not a length");
			o->result_len = rl ? (uint64_t)json_integer_value(rl) + 1 : 0;
		}
		return 0;
	}
	json_t *kvs = json_object_get(src, "kvs"), *ikvs = json_object_get(inv, "kvs");
	if (!json_is_object(kvs) || !json_is_object(ikvs) || json_object_size(kvs) == 0)
		return bad(r, "%s has no \"kvs\" object", f);
	if (json_object_size(kvs) != json_object_size(ikvs))
		return bad(r, "%s: the completion names other keys than the invocation", f);
	const char *name;
	json_t *v;
	json_object_foreach(kvs, name, v)
	{
		uint32_t k;
		if (json_object_get(ikvs, name) == NULL)
			return bad(r, "%s: key %s was not in the invocation", f, name);
		if (key_index(r, name, strlen(name), &k) != 0)
			return -1;
		if (key_kind(r, k, false) != 0)
			return -1;
		rop *o = raw_add(r);
		if (o == NULL)
			return oom(r);
		*o = (rop){.kind = kind,
		           .key = k,
		           .invoke = t0,
		           .ret = t,
		           .line = inv_line,
		           .process = (uint32_t)process,
		           .txn = txn,
		           .status = unknown ? CHK_FAILED : CHK_OK,
		           .complete = unknown ? CHK_NEVER : t};
		if (dup_value(r, v, "a value of \"kvs\"", &o->val, &o->vlen) != 0)
			return -1;
		if (kind != CHK_GET && o->val == NULL)
			return bad(r, "mput of a null value");
	}
	return 0;
}

/* Keeps a nemesis line (a step of whatever reconfigured or hurt the
 * cluster) for reports: it takes no part in the check. */
static int
nemesis_event(rd *r, json_t *ev)
{
	chk_histfile *h = r->h;
	json_t *type = json_object_get(ev, "type"), *f = json_object_get(ev, "f"),
	       *time = json_object_get(ev, "time"), *value = json_object_get(ev, "value");

	if (!json_is_string(type) || !json_is_string(f))
		return bad(r, "\"type\" or \"f\" is not a string");
	if (!json_is_integer(time) || json_integer_value(time) < 0)
		return bad(r, "\"time\" is not a non-negative integer");
	uint64_t t = (uint64_t)json_integer_value(time);
	if (t < r->last_t)
		return bad(r, "time goes backwards");
	r->last_t = t;
	if (h->nnem == h->capnem) {
		size_t cap = h->capnem ? 2 * h->capnem : 64;
		chk_nemesis *x = realloc(h->nem, cap * sizeof(*x));
		if (x == NULL)
			return oom(r);
		h->nem = x;
		h->capnem = cap;
	}
	chk_nemesis *n = &h->nem[h->nnem++];
	memset(n, 0, sizeof(*n));
	n->start = n->end = t;
	snprintf(n->f, sizeof(n->f), "%s", json_string_value(f));
	if (value != NULL) {
		char *js = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
		if (js == NULL)
			return oom(r);
		size_t l = strlen(js);
		if (json_is_object(value) && l >= 2) { /* the members, without braces */
			js[l - 1] = '\0';
			snprintf(n->args, sizeof(n->args), "%s", js + 1);
		} else {
			snprintf(n->args, sizeof(n->args), "\"value\": %s", js);
		}
		free(js);
	}
	return 0;
}

/* Reads one event. */
static int
event(rd *r, pmap *pm, json_t *ev)
{
	json_t *process = json_object_get(ev, "process"), *type = json_object_get(ev, "type"),
	       *f = json_object_get(ev, "f"), *time = json_object_get(ev, "time");

	if (!json_is_object(ev))
		return bad(r, "not a JSON object");
	if (json_is_string(process) && strcmp(json_string_value(process), "nemesis") == 0)
		return nemesis_event(r, ev);
	if (!json_is_integer(process))
		return bad(r, "\"process\" is not an integer (nor \"nemesis\")");
	if (!json_is_string(type) || !json_is_string(f))
		return bad(r, "\"type\" or \"f\" is not a string");
	if (!json_is_integer(time) || json_integer_value(time) < 0)
		return bad(r, "\"time\" is not a non-negative integer");
	uint64_t t = (uint64_t)json_integer_value(time);
	if (t < r->last_t)
		return bad(r, "time goes backwards");
	r->last_t = t;
	const char *ty = json_string_value(type);
	json_int_t p = json_integer_value(process);
	if (strcmp(ty, "invoke") == 0) {
		pend *x = pmap_get(pm, p, true);
		if (x == NULL)
			return oom(r);
		if (x->ev != NULL)
			return bad(r, "process %lld invokes with an operation open", (long long)p);
		json_incref(ev);
		x->ev = ev;
		x->line = r->line;
		return 0;
	}
	if (strcmp(ty, "ok") != 0 && strcmp(ty, "fail") != 0 && strcmp(ty, "info") != 0)
		return bad(r, "\"type\" is \"%s\", not invoke, ok, fail or info", ty);
	pend *x = pmap_get(pm, p, false);
	if (x == NULL || x->ev == NULL)
		return bad(r, "process %lld completes an operation it did not invoke",
		           (long long)p);
	json_t *inv = x->ev;
	x->ev = NULL;
	int rv = complete(r, inv, x->line, ev, ty, t);
	json_decref(inv);
	return rv;
}

/* Keys of the register parts all scans may make together (a file of many
 * wide scans over many keys is refused rather than expanded). */
#define MAX_SCAN_PARTS ((size_t)1 << 22)

/* A register by name. */
typedef struct {
	const char *name; /* first: rkv_cmp orders by it */
	uint32_t key;
} rname;

/* Each scan becomes one op per register of the file in its range (up to
 * its cut): a read of what it returned for the key, or "not found" for a
 * key it passed over. */
static int
expand_scans(rd *r)
{
	chk_histfile *h = r->h;
	rname *regs = NULL;
	size_t nregs = 0, parts = 0;
	int rv = -1;

	if (h->nscans == 0)
		return 0;
	if ((regs = malloc((h->nkeys + 1) * sizeof(*regs))) == NULL)
		return oom(r);
	for (size_t k = 0; k < h->nkeys; k++)
		if (h->key_append[k] != 1)
			regs[nregs++] = (rname){h->keys[k].name, (uint32_t)k};
	if (nregs > 1)
		qsort(regs, nregs, sizeof(*regs), rkv_cmp);
	for (size_t i = 0; i < h->nscans; i++) {
		struct rscan *s = &h->scans[i];
		size_t lo = 0, hi = nregs, j = 0;
		r->line = s->line;
		while (lo < hi) { /* the first register >= start */
			size_t mid = lo + (hi - lo) / 2;
			const char *nm = regs[mid].name;
			if (key_cmp(nm, strlen(nm), s->start, s->sl) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (size_t q = lo; q < nregs; q++) {
			uint32_t k = regs[q].key;
			const char *nm = regs[q].name;
			size_t nl = strlen(nm);
			if ((s->el && key_cmp(nm, nl, s->end, s->el) >= 0) ||
			    (s->cut && key_cmp(nm, nl, s->cut, s->cl) > 0))
				break;
			if (++parts > MAX_SCAN_PARTS) {
				bad(r, "the scans pass over more than %zu keys in all",
				    MAX_SCAN_PARTS);
				goto out;
			}
			rop *o = raw_add(r);
			if (o == NULL) {
				oom(r);
				goto out;
			}
			*o = (rop){.kind = CHK_SCAN,
			           .key = k,
			           .invoke = s->invoke,
			           .complete = s->complete,
			           .ret = s->complete,
			           .line = s->line,
			           .process = s->process,
			           .txn = s->txn,
			           .status = CHK_OK};
			while (j < s->nkv && s->kv[j].key != k &&
			       key_cmp(s->kv[j].name, strlen(s->kv[j].name), nm, nl) < 0)
				j++;
			if (j < s->nkv && s->kv[j].key == k) { /* it returned the key */
				o->val = s->kv[j].val;
				o->vlen = s->kv[j].vlen;
				s->kv[j].val = NULL;
				j++;
			}
		}
	}
	rv = 0;
out:
	free(regs);
	return rv;
}

/* A fresh identity. */
static uint64_t
new_id(chk_histfile *h)
{
	uint64_t n = h->next_id++;
	return chk_val_id((uint32_t)(n / 0xfffffffeu) + 1, (uint32_t)(n % 0xfffffffeu) + 1);
}

/* Pass 1: names every written value and token. */
static int
name_writes(rd *r)
{
	chk_histfile *h = r->h;
	bool added;

	for (size_t i = 0; i < h->nraw; i++) {
		rop *o = &h->raw[i];
		if (o->kind != CHK_PUT && o->kind != CHK_APPEND &&
		    !(o->kind == CHK_CAS && o->val != NULL))
			continue;
		r->line = o->line;
		if (o->kind == CHK_APPEND) {
			if (o->vlen == 0 || o->val[o->vlen - 1] != ';' ||
			    memchr(o->val, ';', o->vlen - 1) != NULL)
				return bad(
				    r, "appended value \"%s\" is no token (one ';', at its end)",
				    o->val);
		}
		sent *s = smap_get(&h->vals, o->key, o->val, o->vlen, true, &added);
		if (s == NULL)
			return oom(r);
		if (!added)
			return bad(r, "value \"%s\" is written to key %s twice", o->val,
			           h->keys[o->key].name);
		s->id = new_id(h);
		s->writer = i;
	}
	return 0;
}

/* Appends the spelling of token id to buf (growing it). */
static int
buf_token(char **buf, size_t *len, size_t *cap, uint64_t id)
{
	char t[48];
	int n = chk_format_val(t, sizeof(t) - 1, id);
	t[n++] = ';';
	if (*len + (size_t)n + 1 > *cap) {
		size_t c = *cap ? *cap * 2 : 256;
		while (c < *len + (size_t)n + 1)
			c *= 2;
		char *b = realloc(*buf, c);
		if (b == NULL)
			return -1;
		*buf = b;
		*cap = c;
	}
	memcpy(*buf + *len, t, (size_t)n);
	*len += (size_t)n;
	(*buf)[*len] = '\0';
	return 0;
}

/* Rewrites a read of append key k in the identities' spellings: each token
 * by its identity (one never appended when no append of k wrote it), and a
 * tail without ';' as bytes that are no token. */
static int
canon_read(rd *r, uint32_t k, const char *v, size_t n, char **out, size_t *outlen)
{
	chk_histfile *h = r->h;
	char *buf = NULL;
	size_t len = 0, cap = 0, at = 0;

	while (at < n) {
		const char *semi = memchr(v + at, ';', n - at);
		if (semi == NULL) {
			static const char tail[] = "?"; /* no token spells '?' */
			char *b = realloc(buf, len + sizeof(tail) + 1);
			if (b == NULL)
				goto nomem;
			buf = b;
			memcpy(buf + len, tail, sizeof(tail));
			len += sizeof(tail) - 1;
			break;
		}
		size_t tl = (size_t)(semi - (v + at)) + 1;
		bool added;
		sent *s = smap_get(&h->vals, k, v + at, tl, true, &added);
		if (s == NULL)
			goto nomem;
		if (added) { /* a token no append of k wrote: reported by the model */
			s->id = new_id(h);
			s->writer = NONE;
		}
		if (buf_token(&buf, &len, &cap, s->id) != 0)
			goto nomem;
		at += tl;
	}
	if (buf == NULL && (buf = calloc(1, 1)) == NULL)
		goto nomem;
	*out = buf;
	*outlen = len;
	return 0;
nomem:
	free(buf);
	return oom(r);
}

/* The rewritten offset of the token boundary at `off` of the file's value
 * v of key k; 1 (no token ends there) when off is no boundary. */
static uint64_t
canon_offset(const chk_histfile *h, uint32_t k, const char *v, size_t n, uint64_t off)
{
	size_t at = 0;
	uint64_t canon = 0;
	char t[48];

	while (at < n && at < off) {
		const char *semi = memchr(v + at, ';', n - at);
		if (semi == NULL)
			break;
		size_t tl = (size_t)(semi - (v + at)) + 1;
		sent *s = smap_get((smap *)&h->vals, k, v + at, tl, false, NULL);
		if (s == NULL)
			break;
		canon += (uint64_t)chk_format_val(t, sizeof(t), s->id) + 1;
		at += tl;
	}
	return at == off && off > 0 ? canon : 1;
}

/* The identity of register value v of key k: its write's, or a fresh one
 * that no write has (the model reports it). */
static int
reg_id(rd *r, uint32_t k, const char *v, size_t n, uint64_t *id)
{
	bool added;
	sent *s = smap_get(&r->h->vals, k, v, n, true, &added);

	if (s == NULL)
		return oom(r);
	if (added) {
		s->id = new_id(r->h);
		s->writer = NONE;
	}
	*id = s->id;
	return 0;
}

/* Pass 2: the model's operations, and each append key's final value. */
static int
build_ops(rd *r)
{
	chk_histfile *h = r->h;
	size_t *final = NULL;      /* per key: the raw get chosen as its final read */
	size_t *longest = NULL;    /* per key: the raw get that read the most */
	uint64_t *last_ack = NULL; /* per key: the last completion of an acked append */
	int rv = -1;

	h->ops = calloc(h->nraw + 1, sizeof(*h->ops));
	h->lines = calloc(h->nraw + 1, sizeof(*h->lines));
	h->finals = calloc(h->nkeys + 1, sizeof(*h->finals));
	final = malloc((h->nkeys + 1) * sizeof(*final));
	longest = malloc((h->nkeys + 1) * sizeof(*longest));
	last_ack = calloc(h->nkeys + 1, sizeof(*last_ack));
	if (h->ops == NULL || h->lines == NULL || h->finals == NULL || final == NULL ||
	    longest == NULL || last_ack == NULL) {
		oom(r);
		goto out;
	}
	for (size_t k = 0; k < h->nkeys; k++) {
		final[k] = longest[k] = NONE;
		h->keys[k].append = h->key_append[k] == 1;
	}
	for (size_t i = 0; i < h->nraw; i++) {
		const rop *x = &h->raw[i];
		chk_op *o = &h->ops[h->nops];
		*o = (chk_op){.invoke = x->invoke,
		              .complete = x->complete,
		              .ret = x->ret,
		              .key = x->key,
		              .client = x->process ? x->process : 1,
		              .kind = x->kind,
		              .status = x->status,
		              .txn = x->txn};
		if (x->status == CHK_FAILED)
			o->err = -1;
		h->lines[h->nops] = x->line;
		if (x->kind == CHK_CAS) {
			r->line = x->line;
			if ((x->val && reg_id(r, x->key, x->val, x->vlen, &o->val) != 0) ||
			    (x->expect && reg_id(r, x->key, x->expect, x->elen, &o->hash) != 0) ||
			    (x->cur && reg_id(r, x->key, x->cur, x->clen, &o->len) != 0))
				goto out;
			if (x->status == CHK_MISMATCH && !x->cur_known)
				o->len = CHK_CUR_UNKNOWN;
		} else if (x->kind == CHK_PUT || x->kind == CHK_APPEND) {
			sent *s = smap_get(&h->vals, x->key, x->val, x->vlen, false, NULL);
			o->val = s ? s->id : 0;
			if (x->kind == CHK_APPEND && x->status == CHK_OK) {
				if (x->complete > last_ack[x->key])
					last_ack[x->key] = x->complete;
			}
		} else if (x->status == CHK_FAILED) {
			/* a delete of unknown outcome: nothing read */
		} else if (x->val == NULL) {
			o->status = CHK_NOTFOUND;
		} else if (!h->keys[x->key].append) {
			bool added;
			sent *s = smap_get(&h->vals, x->key, x->val, x->vlen, true, &added);
			if (s == NULL) {
				oom(r);
				goto out;
			}
			if (added) { /* a value nobody put: reported by the model */
				s->id = new_id(h);
				s->writer = NONE;
			}
			o->val = s->id;
		} else {
			char *c;
			size_t cl;
			r->line = x->line;
			if (canon_read(r, x->key, x->val, x->vlen, &c, &cl) != 0)
				goto out;
			o->len = cl;
			o->hash = chk_hash(CHK_HASH_INIT, c, cl);
			free(c);
			if (final[x->key] == NONE || x->invoke > h->raw[final[x->key]].invoke)
				final[x->key] = i;
			if (longest[x->key] == NONE || x->vlen > h->raw[longest[x->key]].vlen)
				longest[x->key] = i;
		}
		h->nops++;
	}
	for (size_t k = 0; k < h->nkeys; k++) {
		chk_key *key = &h->keys[k];
		if (!key->append)
			continue;
		size_t g = final[k];
		/* The final value is known when the last read of the key began after
		 * every acknowledged append of it completed. Else the longest read
		 * stands in for it: every read is a prefix of it, and it holds the
		 * appends completed before it began. */
		if (g != NONE && h->raw[g].invoke <= last_ack[k]) {
			g = final[k] = longest[k];
			key->final_partial = true;
			key->final_invoke = h->raw[g].invoke;
			key->final_complete = h->raw[g].complete;
		}
		if (g == NONE) {
			key->final_known = false;
			continue;
		}
		char *c = NULL;
		size_t cl = 0;
		if (h->raw[g].val != NULL) {
			r->line = h->raw[g].line;
			if (canon_read(r, (uint32_t)k, h->raw[g].val, h->raw[g].vlen, &c, &cl) != 0)
				goto out;
		}
		h->finals[k] = c;
		key->final_known = true;
		key->final_found = c != NULL;
		key->final = (const uint8_t *)c;
		key->final_len = cl;
	}
	/* An append's "result_len" counts the file's bytes; the model counts the
	 * rewritten ones. Where the file's length ends a token of the final
	 * value, the rewritten length ends the same token; elsewhere it ends no
	 * token, which the model reports. */
	for (size_t i = 0; i < h->nops; i++) {
		chk_op *o = &h->ops[i];
		const rop *x = &h->raw[i];
		if (o->kind != CHK_APPEND || o->status != CHK_OK || x->result_len == 0)
			continue;
		const chk_key *key = &h->keys[o->key];
		if (!key->final_known || !key->final_found) {
			o->len = 0; /* no final value: the model checks no length */
			continue;
		}
		o->len = canon_offset(h, o->key, h->raw[final[o->key]].val,
		                      h->raw[final[o->key]].vlen, x->result_len - 1);
	}
	rv = 0;
out:
	free(final);
	free(longest);
	free(last_ack);
	return rv;
}

int
chk_histfile_read(FILE *f, chk_histfile **out, char *err, size_t errlen)
{
	chk_histfile *h = calloc(1, sizeof(*h));
	rd r = {.h = h, .err = err, .errlen = errlen};
	pmap pm = {0};
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	int rv = -1;

	if (errlen)
		err[0] = '\0';
	if (h == NULL)
		return -2;
	while ((n = getline(&line, &cap, f)) >= 0) {
		r.line++;
		if ((size_t)n > MAX_LINE) {
			bad(&r, "longer than %zu bytes", MAX_LINE);
			goto out;
		}
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			n--;
		size_t sp = 0;
		while (sp < (size_t)n && (line[sp] == ' ' || line[sp] == '\t'))
			sp++;
		if (sp == (size_t)n)
			continue; /* a blank line */
		json_error_t je;
		json_t *ev = json_loadb(line, (size_t)n, JSON_REJECT_DUPLICATES, &je);
		if (ev == NULL) {
			bad(&r, "not JSON: %s", je.text);
			goto out;
		}
		int e = event(&r, &pm, ev);
		json_decref(ev);
		if (e != 0)
			goto out;
	}
	if (ferror(f)) {
		snprintf(err, errlen, "read error: %s", strerror(errno));
		goto out;
	}
	/* Operations still open at the end never completed: writes among them
	 * may have taken effect. */
	for (size_t i = 0; pm.e && i <= pm.mask; i++) {
		if (!pm.e[i].used || pm.e[i].ev == NULL)
			continue;
		json_t *inv = pm.e[i].ev;
		pm.e[i].ev = NULL;
		json_t *info = json_deep_copy(inv);
		if (info == NULL) {
			json_decref(inv);
			oom(&r);
			goto out;
		}
		r.line = pm.e[i].line;
		int e = complete(&r, inv, pm.e[i].line, info, "info", r.last_t);
		json_decref(inv);
		json_decref(info);
		if (e != 0)
			goto out;
	}
	if (expand_scans(&r) != 0 || name_writes(&r) != 0 || build_ops(&r) != 0)
		goto out;
	rv = 0;
out:
	free(line);
	pmap_free(&pm);
	if (rv != 0) {
		chk_histfile_free(h);
		return r.oom ? -2 : -1;
	}
	*out = h;
	return 0;
}

void
chk_histfile_history(const chk_histfile *h, const chk_key **keys, size_t *nkeys, const chk_op **ops,
                     size_t *nops)
{
	*keys = h->keys;
	*nkeys = h->nkeys;
	*ops = h->ops;
	*nops = h->nops;
}

void
chk_histfile_nemesis(const chk_histfile *h, const chk_nemesis **nem, size_t *nnem)
{
	*nem = h->nem;
	*nnem = h->nnem;
}

void
chk_print_nemesis(FILE *f, const chk_nemesis *nem, size_t nnem, uint64_t lo, uint64_t hi,
                  uint64_t t0, size_t max_lines)
{
	const uint64_t margin = 1000000000u; /* 1 s */
	uint64_t from = lo > margin ? lo - margin : 0, to = hi + margin;
	size_t shown = 0, more = 0;

	for (size_t i = 0; i < nnem; i++) {
		const chk_nemesis *n = &nem[i];
		uint64_t end = n->end > n->start ? n->end : n->start;
		if (end < from || n->start > to)
			continue;
		if (shown == max_lines) {
			more++;
			continue;
		}
		if (shown++ == 0)
			fprintf(f, "  nemesis events within 1 s (ms; [start, end]):\n");
		double a =
		    n->start >= t0 ? (double)(n->start - t0) / 1e6 : -(double)(t0 - n->start) / 1e6;
		double b = end >= t0 ? (double)(end - t0) / 1e6 : -(double)(t0 - end) / 1e6;
		fprintf(f, "    [%.3f, %.3f] %s {%s}%s%s%s\n", a, b, n->f, n->args,
		        n->result[0] ? " -> {" : "", n->result, n->result[0] ? "}" : "");
	}
	if (more)
		fprintf(f, "    ... %zu more\n", more);
}

size_t
chk_histfile_line(const chk_histfile *h, size_t op)
{
	return op < h->nops ? h->lines[op] : 0;
}

void
chk_histfile_free(chk_histfile *h)
{
	if (h == NULL)
		return;
	for (size_t i = 0; i < h->nraw; i++) {
		free(h->raw[i].val);
		free(h->raw[i].expect);
		free(h->raw[i].cur);
	}
	free(h->raw);
	for (size_t i = 0; i < h->nscans; i++)
		rscan_free(&h->scans[i]);
	free(h->scans);
	for (size_t k = 0; h->finals && k < h->nkeys; k++)
		free(h->finals[k]);
	free(h->finals);
	free(h->keys);
	free(h->key_append);
	free(h->ops);
	free(h->lines);
	smap_free(&h->names_map);
	smap_free(&h->vals);
	free(h->nem);
	free(h);
}
