/*
 * svg.c - the --plot drawing of `shardkv bench`: ops/s (top panel) and p99
 * latency (bottom panel) per second over the run, with every admin event the
 * poller saw (join, leave, move, migration start and end) drawn as a dashed
 * vertical line across both panels and labelled, so that the effect of a
 * migration shows at a glance. Plain SVG 1.1, no script, no external font.
 */
#include "client/cli/bench.h"

#include <inttypes.h>
#include <string.h>

#define W      960.0
#define H      560.0
#define LEFT   80.0
#define RIGHT  24.0
#define TOP    64.0
#define GAP    56.0
#define BOTTOM 48.0

/* Writes text escaped for XML. */
static void
xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '<':
			fputs("&lt;", f);
			break;
		case '>':
			fputs("&gt;", f);
			break;
		case '&':
			fputs("&amp;", f);
			break;
		case '"':
			fputs("&quot;", f);
			break;
		default:
			if ((unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f)
				fputc(*s, f);
		}
	}
}

/* Returns a "nice" upper bound for an axis (1, 2 or 5 times a power of ten). */
static double
nice_max(double v)
{
	double p = 1;

	if (v <= 0)
		return 1;
	while (p * 10 <= v)
		p *= 10;
	while (p > v)
		p /= 10;
	if (v <= p)
		return p;
	if (v <= 2 * p)
		return 2 * p;
	if (v <= 5 * p)
		return 5 * p;
	return 10 * p;
}

static const char *
event_color(const char *kind)
{
	if (strcmp(kind, "join") == 0)
		return "#2a9d2a";
	if (strcmp(kind, "leave") == 0)
		return "#c0392b";
	if (strcmp(kind, "migration_start") == 0)
		return "#e67e22";
	if (strcmp(kind, "migration_end") == 0)
		return "#8e44ad";
	return "#555555";
}

/* Draws one panel: axes, grid, the series of values, a title. */
static void
panel(FILE *f, double y0, double ph, double tmax, const kv_bench_result *r, bool p99,
      const char *title, const char *color)
{
	double vmax = 0, pw = W - LEFT - RIGHT;

	for (size_t i = 0; i < r->npoints; i++) {
		const kv_bench_point *pt = &r->points[i];
		double v = p99 ? pt->p99_us : (pt->dt > 0 ? (double)pt->ops / pt->dt : 0);
		vmax = v > vmax ? v : vmax;
	}
	vmax = nice_max(vmax * 1.05);
	fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">", LEFT,
	        y0 - 8);
	xml_text(f, title);
	fprintf(f, "</text>\n");
	for (int g = 0; g <= 4; g++) {
		double y = y0 + ph - ph * g / 4.0;
		fprintf(
		    f,
		    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n"
		    "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
		    "text-anchor=\"end\">%.6g</text>\n",
		    LEFT, y, LEFT + pw, y, LEFT - 6, y + 4, vmax * g / 4.0);
	}
	fprintf(f,
	        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
	        "stroke=\"#888888\"/>\n",
	        LEFT, y0, pw, ph);
	if (r->npoints == 0)
		return;
	fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" points=\"", color);
	for (size_t i = 0; i < r->npoints; i++) {
		const kv_bench_point *pt = &r->points[i];
		double v = p99 ? pt->p99_us : (pt->dt > 0 ? (double)pt->ops / pt->dt : 0);
		/* Each point stands for its interval: drawn at the middle of it. */
		fprintf(f, "%s%.1f,%.1f", i ? " " : "", LEFT + pw * (pt->t - pt->dt / 2) / tmax,
		        y0 + ph - ph * v / vmax);
	}
	fprintf(f, "\"/>\n");
}

void
kv_bench_write_svg(FILE *f, const kv_bench_result *r)
{
	double tmax = r->elapsed_s > 0 ? r->elapsed_s : 1, pw = W - LEFT - RIGHT;
	double ph = (H - TOP - GAP - BOTTOM) / 2;
	char title[400];

	for (size_t i = 0; i < r->npoints; i++)
		tmax = r->points[i].t > tmax ? r->points[i].t : tmax;
	fprintf(f,
	        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
	        "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
	        "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
	        W, H, W, H);
	if (r->params)
		snprintf(title, sizeof(title),
		         "shardkv bench: %s loop, %u threads, %u connections, mix %s, batch %u, "
		         "%" PRIu64 " keys, %s",
		         r->params->rate > 0 ? "open" : "closed", r->params->threads,
		         r->params->connections, r->params->mix_str, r->params->batch,
		         r->params->keys, r->params->dist_str);
	else
		snprintf(title, sizeof(title), "shardkv bench");
	fprintf(f, "<text x=\"%.0f\" y=\"20\" font-size=\"13\">", LEFT);
	xml_text(f, title);
	fprintf(f,
	        "</text>\n<text x=\"%.0f\" y=\"36\" font-size=\"11\" fill=\"#555555\">started "
	        "%s; dashed lines: admin events seen by the once-a-second poll</text>\n",
	        LEFT, r->started_at);
	panel(f, TOP, ph, tmax, r, false, "throughput (ops/s)", "#1f77b4");
	panel(f, TOP + ph + GAP, ph, tmax, r, true, "p99 latency (us)", "#d62728");
	/* The time axis, under the bottom panel. */
	for (int g = 0; g <= 10; g++) {
		double x = LEFT + pw * g / 10.0;
		fprintf(f,
		        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
		        "text-anchor=\"middle\">%.1f</text>\n",
		        x, H - BOTTOM + 16, tmax * g / 10.0);
	}
	fprintf(f,
	        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">time "
	        "(s)</text>\n",
	        LEFT + pw / 2, H - 12);
	double last_label = -1e9, shift = 0;
	for (size_t i = 0; i < r->nevents; i++) {
		const kv_bench_event *e = &r->events[i];
		double x = LEFT + pw * (e->t < 0 ? 0 : e->t > tmax ? tmax : e->t) / tmax, lx;
		/* Events seen by the same poll share an x: fan their labels out. */
		shift = x - last_label < 12 ? shift + 12 : 0;
		if (shift == 0)
			last_label = x;
		lx = x - 2 + shift;
		fprintf(f,
		        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
		        "stroke-dasharray=\"4,3\"><title>",
		        x, TOP, x, H - BOTTOM, event_color(e->kind));
		xml_text(f, e->kind);
		fprintf(f, " at %.1f s, epoch %" PRIu64 ": ", e->t, e->epoch);
		xml_text(f, e->detail);
		fprintf(f,
		        "</title></line>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\" "
		        "transform=\"rotate(-90 %.1f %.1f)\" text-anchor=\"end\">",
		        lx, TOP + 4, event_color(e->kind), lx, TOP + 4);
		xml_text(f, e->kind);
		fprintf(f, " e%" PRIu64 "</text>\n", e->epoch);
	}
	fprintf(f, "</svg>\n");
}
